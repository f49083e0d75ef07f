// cuda_proj.cuh - the projection groups of bk_ops (proj_forward / proj_backward, BK_LINEAR),
// included by gpu/cuda/cuda_ops.cu after its linear, LoRA and GEMM helpers, whose statics
// it uses.  v3's device code and layout are in cuda_proj3.cuh.

// projection groups (bk_ops.proj_forward / proj_backward): BK_LINEAR=v1 | v2 | v3
//
// v1 (the default until a GPU run validates v2 or v3): each member's linear and LoRA op in
// turn, exactly the kernels above (per member: x converted to bf16, the bf16 GEMM, a
// TF32 GEMM for xa re-reading fp32 x, a TF32 GEMM read-modify-writing fp32 y).
// xa layout: member j's [T,R] at xa + j*T*R (the host twin's).
//
// v2 (fused; nothing of it has run on a GPU yet):
//   forward   one bf16 copy xb of x for all members; the LoRA members' A rounded to bf16
//             and stacked into one [nl*R, in] matrix, so xa [T, nl*R] (the v2 xa
//             layout: LoRA member c in columns c*R.., row stride nl*R) is ONE bf16 GEMM
//             over xb (with dropout: one fused dropout+bf16 pass and one GEMM per
//             member, since each member has its own mask); then per LoRA member
//             y_j = scale xa_c B_j^T (TF32, beta 0: a plain write), and the base GEMM
//             y_j = xb W_j^T + 1 * y_j accumulates onto it in its epilogue (beta 1)
//             instead of a separate read-modify-write pass over y after it.
//   backward  each dy_j rounded to bf16 once (dyb_j) and used by all three of its GEMMs:
//             dB_j += scale xab_c^T dyb_j and dxa_c = scale dyb_j Bb_j (bf16, xab/Bb
//             bf16 copies of xa and B), then dA of all LoRA members in ONE TF32 GEMM
//             over fp32 x (dA_cat [nl*R, in], added into each dA_j) and the LoRA part of
//             dx in ONE TF32 GEMM (dx += dxa A_cat, A_cat an fp32 stack of the A_j);
//             with dropout, per member as v1 (mask applied to x and to dx's term).
//             Finally dx += dyb_j W_j per member (bf16, beta 1).
//
// v3 (v2 with the members' base GEMMs fused; nothing of it has run on a GPU yet):
//   forward   v2's, but the base GEMMs of members of equal shape and equal beta in ONE
//             cublasGemmBatchedEx launch (bf16 A/B, fp32 C, fp32 compute: the gemmEx
//             types), each writing its own y_j: gate/up in one launch; q/k/v under GQA in
//             two ({q}, {k, v}); without GQA in one.  The batch's device pointer table
//             is written once per distinct set of pointers (a table of PT_SLOTS of them,
//             reused in turn; tables are pure functions of the pointers, so nothing goes
//             stale).  Why not one launch for q/k/v under GQA: cublasGemmGroupedBatchedEx
//             (cuBLAS >= 12.5) takes different shapes, but with bf16 A/B only a bf16 C
//             (its type table: CUBLAS_COMPUTE_32F with 16BF/16BF/16BF, 16F/16F/16F or
//             32F/32F/32F), and y_j are fp32; a GEMM over the stacked weight into one
//             [T, sum out] buffer would need a split pass over it (T * sum out * 8 bytes
//             read and written, ~17 us at TinyLlama's 4096 x 2560: more than the launch
//             and the small k/v grids cost) or row strides in every user of q, k, v
//             downstream (RoPE, attention, the saved activations, gpu/model.c).
//   backward  the dy_j rounded to bf16 by ONE strided pass straight into the interleaved
//             [T, sum out] layout (cuda_proj3.cuh), v2's LoRA GEMMs reading their dy_j
//             from there (leading dimension sum out), and dx += dy_cat W_cat as ONE bf16
//             GEMM with K = sum out_j (beta 1): W_cat [sum out, in] the members' bf16
//             weights stacked, built on a group's first backward and cached (a copy: the
//             weight handles keep their own storage; TinyLlama-1.1B: (2560 + 11264) x 2048
//             x 2 bytes x 22 layers = 1.25 GB more device memory, training only: the
//             forward never builds it), dropped when a member's weight is freed (the
//             op table's weight_free goes through cuda_proj_weight_free, below).  This
//             saves a read-modify-write of fp32 dx [T, in] per extra member and runs the
//             K = out_k/v GEMMs (256 at TinyLlama, memory-bound on dx) inside the large
//             one.  dB / dxa stay per member: with R = 16 they are bound by reading dy_j,
//             which a block-diagonal batched form reads as often.
//   A group of one member (o, down) runs as v2.

static int g_linear_mode; // 0: not read yet; 1 = v1, 2 = v2, 3 = v3

// BK_LINEAR: v1 (also unset or empty), v2 (bk_cuda_env_mode's two values) or v3; anything
// else dies with the one-line message, the value quoted
extern "C" int bk_cuda_linear_mode(void)
{
	if (!g_linear_mode) {
		const char *e = getenv("BK_LINEAR");
		if (e && !strcmp(e, "v3"))
			g_linear_mode = 3;
		else if (e && *e && strcmp(e, "v1") && strcmp(e, "v2"))
			die("BK_LINEAR='%s': expected v1 (the default), v2 or v3", e);
	}
	return bk_cuda_env_mode(&g_linear_mode, "BK_LINEAR", "v1", "v2", 1);
}

extern "C" void bk_cuda_linear_set_mode(int mode)
{
	if (mode < 1 || mode > 3)
		CUDA_BUG("bk_cuda_linear_set_mode: mode %d", mode);
	g_linear_mode = mode;
}

// growable device buffers of the v2 path (its own: the 4 shared workspace slots are
// taken by the attention and loss ops)
enum { PW_XB, PW_ACAT, PW_DYB, PW_XAB, PW_BB, PW_DXA, PW_DACAT, PW_A32, PW_N };
static void *g_pw[PW_N];
static size_t g_pw_bytes[PW_N];

static void *pw(int slot, size_t bytes)
{
	if (bytes <= g_pw_bytes[slot])
		return g_pw[slot];
	size_t want = bytes + bytes / 4;
	bk_cuda_dev_free(g_pw[slot]);
	g_pw[slot] = bk_cuda_dev_alloc(want, "projection scratch");
	g_pw_bytes[slot] = want;
	return g_pw[slot];
}

// xdb [n] bf16 = round(x * keep / (1-p)), keep(i) = crng(key, i) >= p (dropout_kernel's
// mask and arithmetic, then the rounding)
__global__ void dropout_bf16_kernel(__nv_bfloat16 *xdb, const float *x, size_t n, float p,
				    float inv, uint64_t key)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		xdb[i] = bk_f32_to_bf16(bk_crng_uniform_dev(key, i) >= (double)p ? x[i] * inv
									    : 0.0f);
}

// y [n] += x [n]
__global__ void add_kernel(float *y, const float *x, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		y[i] += x[i];
}

static void proj_check(const char *op, const bk_proj *p, int n, int in, int R, float drop)
{
	if (n < 1 || n > BK_PROJ_MAX || drop < 0 || drop >= 1)
		CUDA_BUG("%s: %d members, dropout %g", op, n, (double)drop);
	for (int j = 0; j < n; j++)
		if (p[j].W->cols != in || (p[j].A && (R <= 0 || !p[j].B)))
			CUDA_BUG("%s: member %d: weight %d x %d for in %d, rank %d", op, j,
				 p[j].W->rows, p[j].W->cols, in, R);
}

extern "C" void bk_cuda_proj_forward_v1(const bk_proj *p, int n, const float *x, float *xa,
					int T, int in, int R, float scale, float drop,
					float *scratch)
{
	proj_check("proj_forward", p, n, in, R, drop);
	for (int j = 0; j < n; j++) {
		cuda_linear_forward(p[j].y, x, p[j].W, T);
		if (p[j].A)
			cuda_lora_forward(p[j].y, xa + (size_t)j * T * R, x, p[j].A, p[j].B, T, in,
					  p[j].W->rows, R, scale, drop, p[j].key, scratch);
	}
}

extern "C" void bk_cuda_proj_backward_v1(float *dx, const bk_proj *p, int n, const float *x,
					 const float *xa, int T, int in, int R, float scale,
					 float drop, float *scratch)
{
	proj_check("proj_backward", p, n, in, R, drop);
	for (int j = 0; j < n; j++) {
		cuda_linear_backward(dx, p[j].dy, p[j].W, T);
		if (p[j].A)
			cuda_lora_backward(dx, p[j].dA, p[j].dB, p[j].dy, x, xa + (size_t)j * T * R,
					   p[j].A, p[j].B, T, in, p[j].W->rows, R, scale, drop,
					   p[j].key, scratch);
	}
}

// the LoRA part of v2's and v3's forward: xa [T, nl*R] (the v2 layout) from xb (the bf16
// copy of x; with dropout from x), then y_j = scale xa_c B_j^T (beta 0) for each LoRA member
static void proj_lora_fwd(const bk_proj *p, int n, const float *x, const __nv_bfloat16 *xb,
			  float *xa, int T, int in, int R, float scale, float drop)
{
	int lm[BK_PROJ_MAX], nl = 0; // the LoRA members, in order
	for (int j = 0; j < n; j++)
		if (p[j].A)
			lm[nl++] = j;
	if (!nl)
		return;
	size_t Tin = (size_t)T * in;
	int ld = nl * R; // xa [T, nl*R]
	__nv_bfloat16 *Ab = (__nv_bfloat16 *)pw(PW_ACAT, (size_t)ld * in * 2);
	for (int c = 0; c < nl; c++)
		to_bf16(Ab + (size_t)c * R * in, p[lm[c]].A, (size_t)R * in);
	if (drop <= 0) {
		// xa^T [nl R, T] = A_cat [nl R, in] . xb^T [in, T]
		gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, ld, T, in, 1.0f, Ab, in, xb, in, 0.0f, xa, ld);
	} else {
		__nv_bfloat16 *xdb = (__nv_bfloat16 *)pw(PW_DYB, Tin * 2);
		for (int c = 0; c < nl; c++) {
			BK_LAUNCH(dropout_bf16_kernel, grid_capped(Tin), 256, 0, g_stream,
				xdb, x, Tin, drop, 1.0f / (1.0f - drop), p[lm[c]].key);
			gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, R, T, in, 1.0f, Ab + (size_t)c * R * in,
				  in, xdb, in, 0.0f, xa + (size_t)c * R, ld);
		}
	}
	// y_j^T [out, T] = scale B_j [out, R] . xa_c^T [R, T]  (a write: beta 0)
	for (int c = 0; c < nl; c++) {
		const bk_proj *q = &p[lm[c]];
		int out = q->W->rows;
		gemm_tf32(CUBLAS_OP_T, CUBLAS_OP_N, out, T, R, scale, q->B, R, xa + (size_t)c * R, ld,
			  0.0f, q->y, out);
	}
}

// x converted to bf16 once: the group's one copy (PW_XB)
static const __nv_bfloat16 *proj_xb(const float *x, int T, int in)
{
	size_t Tin = (size_t)T * in;
	__nv_bfloat16 *xb = (__nv_bfloat16 *)pw(PW_XB, Tin * 2);
	to_bf16(xb, x, Tin);
	return xb;
}

extern "C" void bk_cuda_proj_forward_v2(const bk_proj *p, int n, const float *x, float *xa,
					int T, int in, int R, float scale, float drop,
					float *scratch)
{
	(void)scratch;
	proj_check("proj_forward", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	const __nv_bfloat16 *xb = proj_xb(x, T, in); // the one bf16 copy of x
	proj_lora_fwd(p, n, x, xb, xa, T, in, R, scale, drop);
	// y_j^T [out, T] = W_j [out, in] . xb^T [in, T] (+ 1 * the LoRA term, in the epilogue)
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, 1.0f, wbf(p[j].W), in, xb, in,
			  p[j].A ? 1.0f : 0.0f, p[j].y, out);
	}
}

// the LoRA part of v2's and v3's backward, reading member j's bf16 dy from dyb[j] with
// leading dimension ld[j] (v2: its own [T, out_j]; v3: its columns of the interleaved
// [T, sum out], ld = sum out): dB_j, dxa, then dA and the LoRA part of dx (module comment)
static void proj_lora_bwd(float *dx, const bk_proj *p, int n, const float *x, const float *xa,
			  int T, int in, int R, float scale, float drop, float *scratch,
			  const __nv_bfloat16 *const *dyb, const int *ldy)
{
	int lm[BK_PROJ_MAX], nl = 0;
	for (int j = 0; j < n; j++)
		if (p[j].A)
			lm[nl++] = j;
	if (!nl)
		return;
	int ld = nl * R;
	size_t Tin = (size_t)T * in;
	__nv_bfloat16 *xab = (__nv_bfloat16 *)pw(PW_XAB, (size_t)T * ld * 2);
	to_bf16(xab, xa, (size_t)T * ld);
	float *dxa = (float *)pw(PW_DXA, (size_t)T * ld * sizeof(float)); // [T, nl*R]
	size_t bmax = 0;
	for (int c = 0; c < nl; c++) {
		size_t b = (size_t)p[lm[c]].W->rows * R;
		bmax = b > bmax ? b : bmax;
	}
	__nv_bfloat16 *Bb = (__nv_bfloat16 *)pw(PW_BB, bmax * 2);
	for (int c = 0; c < nl; c++) {
		const bk_proj *q = &p[lm[c]];
		int out = q->W->rows, ldj = ldy[lm[c]];
		const __nv_bfloat16 *dyj = dyb[lm[c]];
		// dB [out,R] += scale dy^T xa_c:  (dB^T [R,out] += scale xa_c^T [R,T] . dy [T,out])
		gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, R, out, T, scale, xab + (size_t)c * R, ld, dyj,
			  ldj, 1.0f, q->dB, R);
		// dxa_c [T,R] = scale dy B:  (dxa_c^T [R,T] = scale B^T [R,out] . dy^T [out,T])
		to_bf16(Bb, q->B, (size_t)out * R);
		gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, R, T, out, scale, Bb, R, dyj, ldj, 0.0f,
			  dxa + (size_t)c * R, ld);
	}
	if (drop <= 0) {
		// dA_cat [nl R, in] = dxa^T x:  (dA_cat^T [in, nl R] = x^T [in,T] . dxa [T, nl R])
		float *dAc = (float *)pw(PW_DACAT, (size_t)ld * in * sizeof(float));
		gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, in, ld, T, 1.0f, x, in, dxa, ld, 0.0f, dAc, in);
		float *A32 = (float *)pw(PW_A32, (size_t)ld * in * sizeof(float));
		for (int c = 0; c < nl; c++) {
			size_t m = (size_t)R * in;
			BK_LAUNCH(add_kernel, grid_capped(m), 256, 0, g_stream, p[lm[c]].dA, dAc + c * m, m);
			CUDA_CHECK(cudaMemcpyAsync(A32 + c * m, p[lm[c]].A, m * sizeof(float),
						   cudaMemcpyDeviceToDevice, g_stream));
		}
		// dx [T,in] += dxa A_cat:  (dx^T [in,T] += A_cat^T [in, nl R] . dxa^T [nl R, T])
		gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, ld, 1.0f, A32, in, dxa, ld, 1.0f, dx, in);
	} else {
		float inv = 1.0f / (1.0f - drop);
		for (int c = 0; c < nl; c++) {
			const bk_proj *q = &p[lm[c]];
			const float *dxac = dxa + (size_t)c * R;
			// scratch [T,in] = drop(x); dA += dxa_c^T drop(x)
			const float *xd = lora_dropped(scratch, x, T, in, drop, q->key);
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, in, R, T, 1.0f, xd, in, dxac, ld, 1.0f,
				  q->dA, in);
			// dx += drop'(dxa_c A)
			float *dxd = scratch;
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, q->A, in, dxac, ld, 0.0f,
				  dxd, in);
			BK_LAUNCH(dropout_backward_kernel, grid_capped(Tin), 256, 0, g_stream, dx, dxd, Tin,
											drop, inv,
											q->key);
		}
	}
}

extern "C" void bk_cuda_proj_backward_v2(float *dx, const bk_proj *p, int n, const float *x,
					 const float *xa, int T, int in, int R, float scale,
					 float drop, float *scratch)
{
	proj_check("proj_backward", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	size_t off[BK_PROJ_MAX + 1];
	off[0] = 0;
	for (int j = 0; j < n; j++)
		off[j + 1] = off[j] + (size_t)T * p[j].W->rows;
	// dyb_j [T, out_j] bf16 at dyb + off[j]: each dy read once in fp32
	__nv_bfloat16 *dyb = (__nv_bfloat16 *)pw(PW_DYB, off[n] * 2);
	const __nv_bfloat16 *dyj[BK_PROJ_MAX] = { 0 };
	int ldj[BK_PROJ_MAX] = { 0 };
	for (int j = 0; j < n; j++) {
		to_bf16(dyb + off[j], p[j].dy, off[j + 1] - off[j]);
		dyj[j] = dyb + off[j];
		ldj[j] = p[j].W->rows;
	}
	proj_lora_bwd(dx, p, n, x, xa, T, in, R, scale, drop, scratch, dyj, ldj);
	// dx^T [in,T] += W_j^T [in,out] . dyb_j^T [out,T]
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, 1.0f, wbf(p[j].W), in, dyb + off[j],
			  out, 1.0f, dx, in);
	}
}

// ---- v3 ----

#include "gpu/cuda/cuda_proj3.cuh"

// the batched GEMMs' pointer tables: PT_SLOTS tables of PROJ_PTRS pointers in one device
// allocation, the host keeping what each holds; a new set of pointers takes the next
// slot in turn (stream order: a GEMM queued before reads its table before the kernel that
// rewrites the slot runs)
enum { PT_SLOTS = 256 };
static proj_ptrs g_pt_key[PT_SLOTS];
static int g_pt_used, g_pt_next;
static const void **g_pt_dev;

static const void *const *proj_ptr_table(const proj_ptrs *v, int k)
{
	for (int i = 0; i < g_pt_used; i++)
		if (!memcmp(&g_pt_key[i], v, sizeof *v))
			return g_pt_dev + (size_t)i * PROJ_PTRS;
	if (!g_pt_dev)
		g_pt_dev = (const void **)bk_cuda_dev_alloc((size_t)PT_SLOTS * PROJ_PTRS * sizeof(void *),
								    "projection pointer tables");
	int i = g_pt_next;
	g_pt_next = (g_pt_next + 1) % PT_SLOTS;
	if (g_pt_used < PT_SLOTS)
		g_pt_used++;
	g_pt_key[i] = *v;
	BK_LAUNCH(proj_ptrs_kernel, 1, 32, 0, g_stream, g_pt_dev + (size_t)i * PROJ_PTRS, *v, k);
	return g_pt_dev + (size_t)i * PROJ_PTRS;
}

// the members' bf16 weights stacked [sum out, in] in member order, one copy per group,
// built on first use and dropped when a member's weight is freed
struct proj_wcat {
	int n;
	const bk_weight *w[BK_PROJ_MAX];
	const void *data[BK_PROJ_MAX];
	int rows[BK_PROJ_MAX], cols;
	__nv_bfloat16 *cat;
};
static std::vector<proj_wcat> g_wcat;

static const __nv_bfloat16 *proj_wcat_get(const bk_proj *p, int n, int in)
{
	for (const proj_wcat &e : g_wcat) {
		int same = e.n == n && e.cols == in;
		for (int j = 0; same && j < n; j++)
			same = e.w[j] == p[j].W && e.data[j] == p[j].W->data &&
			       e.rows[j] == p[j].W->rows;
		if (same)
			return e.cat;
	}
	proj_wcat e = {};
	e.n = n;
	e.cols = in;
	size_t rows = 0;
	for (int j = 0; j < n; j++) {
		e.w[j] = p[j].W, e.data[j] = p[j].W->data, e.rows[j] = p[j].W->rows;
		rows += (size_t)p[j].W->rows;
	}
	e.cat = (__nv_bfloat16 *)bk_cuda_dev_alloc(rows * in * sizeof(__nv_bfloat16),
						    "stacked weight copies");
	size_t off = 0;
	for (int j = 0; j < n; j++) {
		size_t m = (size_t)p[j].W->rows * in;
		CUDA_CHECK(cudaMemcpyAsync(e.cat + off, p[j].W->data, m * sizeof(__nv_bfloat16),
					   cudaMemcpyDeviceToDevice, g_stream));
		off += m;
	}
	g_wcat.push_back(e);
	return e.cat;
}

// the op table's weight_free (cuda_ops.cu): first the stacked copies that hold w, then
// the weight itself
static void cuda_proj_weight_free(bk_weight *w)
{
	if (w)
		for (size_t i = 0; i < g_wcat.size();) {
			int hit = 0;
			for (int j = 0; j < g_wcat[i].n; j++)
				hit |= g_wcat[i].w[j] == w || g_wcat[i].data[j] == w->data;
			if (hit) {
				bk_cuda_dev_free(g_wcat[i].cat);
				g_wcat[i] = g_wcat.back();
				g_wcat.pop_back();
			} else {
				i++;
			}
		}
	cuda_weight_free(w);
}

extern "C" void bk_cuda_proj_forward_v3(const bk_proj *p, int n, const float *x, float *xa,
					int T, int in, int R, float scale, float drop,
					float *scratch)
{
	(void)scratch;
	proj_check("proj_forward", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	const __nv_bfloat16 *xb = proj_xb(x, T, in);
	proj_lora_fwd(p, n, x, xb, xa, T, in, R, scale, drop);
	int outs[BK_PROJ_MAX], lora[BK_PROJ_MAX], batch[BK_PROJ_MAX];
	for (int j = 0; j < n; j++)
		outs[j] = p[j].W->rows, lora[j] = p[j].A != NULL;
	int nb = proj_batches(outs, lora, n, batch);
	for (int b = 0; b < nb; b++) {
		int mem[BK_PROJ_MAX], bs = 0;
		for (int j = 0; j < n; j++)
			if (batch[j] == b)
				mem[bs++] = j;
		int out = outs[mem[0]];
		float alpha = 1.0f, beta = lora[mem[0]] ? 1.0f : 0.0f;
		if (bs == 1) { // y^T [out, T] = W [out, in] . xb^T [in, T] (+ beta y)
			gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, alpha, wbf(p[mem[0]].W), in, xb,
				  in, beta, p[mem[0]].y, out);
			continue;
		}
		proj_ptrs v = {};
		for (int i = 0; i < bs; i++) {
			v.p[i] = p[mem[i]].W->data;
			v.p[bs + i] = xb;
			v.p[2 * bs + i] = p[mem[i]].y;
		}
		const void *const *tab = proj_ptr_table(&v, 3 * bs);
		// the same GEMM for each member of the batch, one launch
		CUBLAS_CHECK(cublasGemmBatchedEx(g_cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in,
						 &alpha, tab, CUDA_R_16BF, in, tab + bs, CUDA_R_16BF,
						 in, &beta, (void *const *)(tab + 2 * bs), CUDA_R_32F,
						 out, bs, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
	}
}

extern "C" void bk_cuda_proj_backward_v3(float *dx, const bk_proj *p, int n, const float *x,
					 const float *xa, int T, int in, int R, float scale,
					 float drop, float *scratch)
{
	proj_check("proj_backward", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	proj_cat c;
	int outs[BK_PROJ_MAX];
	for (int j = 0; j < n; j++)
		outs[j] = p[j].W->rows, c.src[j] = p[j].dy;
	int ld = proj_cat_layout(&c, outs, n);
	// dy_cat [T, sum out] bf16, each dy read once in fp32
	__nv_bfloat16 *dyb = (__nv_bfloat16 *)pw(PW_DYB, (size_t)T * ld * 2);
	if (n == 1) {
		to_bf16(dyb, p[0].dy, (size_t)T * ld);
	} else {
		unsigned gx, gy;
		proj_interleave_grid(T, ld, &gx, &gy);
		BK_LAUNCH(proj_interleave_bf16_kernel, dim3(gx, gy), 256, 0, g_stream, dyb, c, T);
	}
	const __nv_bfloat16 *dyj[BK_PROJ_MAX] = { 0 };
	int ldj[BK_PROJ_MAX] = { 0 };
	for (int j = 0; j < n; j++)
		dyj[j] = dyb + c.off[j], ldj[j] = ld;
	proj_lora_bwd(dx, p, n, x, xa, T, in, R, scale, drop, scratch, dyj, ldj);
	// dx^T [in,T] += W_cat^T [in, sum out] . dy_cat^T [sum out, T]: one GEMM, K = sum out
	const __nv_bfloat16 *W = n == 1 ? wbf(p[0].W) : proj_wcat_get(p, n, in);
	gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, T, ld, 1.0f, W, in, dyb, ld, 1.0f, dx, in);
}

// 4-bit members (cuda_q4.cuh) run as v1: one dequantised weight per GEMM, in turn
// (v2/v3 read several members' bf16 storage at once)
static int proj_has_q4(const bk_proj *p, int n)
{
	for (int j = 0; j < n; j++)
		if (p[j].W->kind == BK_WEIGHT_Q4)
			return 1;
	return 0;
}

static void cuda_proj_forward(const bk_proj *p, int n, const float *x, float *xa, int T,
			      int in, int R, float scale, float drop, float *scratch)
{
	int mode = proj_has_q4(p, n) ? 1 : bk_cuda_linear_mode();
	if (mode == 3)
		bk_cuda_proj_forward_v3(p, n, x, xa, T, in, R, scale, drop, scratch);
	else if (mode == 2)
		bk_cuda_proj_forward_v2(p, n, x, xa, T, in, R, scale, drop, scratch);
	else
		bk_cuda_proj_forward_v1(p, n, x, xa, T, in, R, scale, drop, scratch);
}

static void cuda_proj_backward(float *dx, const bk_proj *p, int n, const float *x,
			       const float *xa, int T, int in, int R, float scale, float drop,
			       float *scratch)
{
	int mode = proj_has_q4(p, n) ? 1 : bk_cuda_linear_mode();
	if (mode == 3)
		bk_cuda_proj_backward_v3(dx, p, n, x, xa, T, in, R, scale, drop, scratch);
	else if (mode == 2)
		bk_cuda_proj_backward_v2(dx, p, n, x, xa, T, in, R, scale, drop, scratch);
	else
		bk_cuda_proj_backward_v1(dx, p, n, x, xa, T, in, R, scale, drop, scratch);
}
