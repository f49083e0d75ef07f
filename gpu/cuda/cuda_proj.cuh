// cuda_proj.cuh - the projection groups of bk_ops (proj_forward / proj_backward, BK_LINEAR),
// included by gpu/cuda/cuda_ops.cu after its linear, LoRA and GEMM helpers, whose statics
// it uses.  Moved out of cuda_ops.cu unchanged.

// projection groups (bk_ops.proj_forward / proj_backward): BK_LINEAR=v1 | v2
//
// v1 (the default until a GPU run validates v2): each member's linear and LoRA op in
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
// Why members are separate GEMMs, not one concatenated one: the model keeps q, k, v
// (and gate, up) in separate [T,*] buffers (RoPE, attention and the saved activations
// take them so) and a cuBLAS GEMM writes one C with one leading dimension, so a
// concatenated output would need a split pass over it (more traffic than it saves);
// the members share the one bf16 copy of x, which was the redundant work.  In the
// backward a concatenated dx GEMM (K = sum out_j) would need the W_j stacked in one
// allocation (views for the other users of the handles): not done here.

static int g_linear_mode; // 0: not read yet; 1 = v1, 2 = v2

extern "C" int bk_cuda_linear_mode(void)
{
	return bk_cuda_env_mode(&g_linear_mode, "BK_LINEAR", "v1", "v2", 1);
}

extern "C" void bk_cuda_linear_set_mode(int mode)
{
	if (mode != 1 && mode != 2)
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
	dev_free(g_pw[slot]);
	g_pw[slot] = dev_alloc(want);
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

extern "C" void bk_cuda_proj_forward_v2(const bk_proj *p, int n, const float *x, float *xa,
					int T, int in, int R, float scale, float drop,
					float *scratch)
{
	(void)scratch;
	proj_check("proj_forward", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	int lm[BK_PROJ_MAX], nl = 0; // the LoRA members, in order
	for (int j = 0; j < n; j++)
		if (p[j].A)
			lm[nl++] = j;
	size_t Tin = (size_t)T * in;
	__nv_bfloat16 *xb = (__nv_bfloat16 *)pw(PW_XB, Tin * 2);
	to_bf16(xb, x, Tin); // the one bf16 copy of x
	if (nl) {
		int ld = nl * R; // xa [T, nl*R]
		__nv_bfloat16 *Ab = (__nv_bfloat16 *)pw(PW_ACAT, (size_t)ld * in * 2);
		for (int c = 0; c < nl; c++)
			to_bf16(Ab + (size_t)c * R * in, p[lm[c]].A, (size_t)R * in);
		if (drop <= 0) {
			// xa^T [nl R, T] = A_cat [nl R, in] . xb^T [in, T]
			gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, ld, T, in, 1.0f, Ab, in, xb, in, 0.0f, xa,
				  ld);
		} else {
			__nv_bfloat16 *xdb = (__nv_bfloat16 *)pw(PW_DYB, Tin * 2);
			for (int c = 0; c < nl; c++) {
				dropout_bf16_kernel<<<grid_capped(Tin), 256, 0, g_stream>>>(
					xdb, x, Tin, drop, 1.0f / (1.0f - drop), p[lm[c]].key);
				CUDA_LAUNCH_CHECK("dropout_bf16_kernel");
				gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, R, T, in, 1.0f,
					  Ab + (size_t)c * R * in, in, xdb, in, 0.0f, xa + (size_t)c * R,
					  ld);
			}
		}
		// y_j^T [out, T] = scale B_j [out, R] . xa_c^T [R, T]  (a write: beta 0)
		for (int c = 0; c < nl; c++) {
			const bk_proj *q = &p[lm[c]];
			int out = q->W->rows;
			gemm_tf32(CUBLAS_OP_T, CUBLAS_OP_N, out, T, R, scale, q->B, R,
				  xa + (size_t)c * R, ld, 0.0f, q->y, out);
		}
	}
	// y_j^T [out, T] = W_j [out, in] . xb^T [in, T] (+ 1 * the LoRA term, in the epilogue)
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, 1.0f, wbf(p[j].W), in, xb, in,
			  p[j].A ? 1.0f : 0.0f, p[j].y, out);
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
	int lm[BK_PROJ_MAX], nl = 0;
	size_t off[BK_PROJ_MAX + 1];
	off[0] = 0;
	for (int j = 0; j < n; j++) {
		if (p[j].A)
			lm[nl++] = j;
		off[j + 1] = off[j] + (size_t)T * p[j].W->rows;
	}
	// dyb_j [T, out_j] bf16 at dyb + off[j]: each dy read once in fp32
	__nv_bfloat16 *dyb = (__nv_bfloat16 *)pw(PW_DYB, off[n] * 2);
	for (int j = 0; j < n; j++)
		to_bf16(dyb + off[j], p[j].dy, off[j + 1] - off[j]);
	if (nl) {
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
			int out = q->W->rows;
			const __nv_bfloat16 *dyj = dyb + off[lm[c]];
			// dB [out,R] += scale dy^T xa_c:  (dB^T [R,out] += scale xa_c^T [R,T] . dy [T,out])
			gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, R, out, T, scale, xab + (size_t)c * R, ld,
				  dyj, out, 1.0f, q->dB, R);
			// dxa_c [T,R] = scale dy B:  (dxa_c^T [R,T] = scale B^T [R,out] . dy^T [out,T])
			to_bf16(Bb, q->B, (size_t)out * R);
			gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, R, T, out, scale, Bb, R, dyj, out, 0.0f,
				  dxa + (size_t)c * R, ld);
		}
		if (drop <= 0) {
			// dA_cat [nl R, in] = dxa^T x:  (dA_cat^T [in, nl R] = x^T [in,T] . dxa [T, nl R])
			float *dAc = (float *)pw(PW_DACAT, (size_t)ld * in * sizeof(float));
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, in, ld, T, 1.0f, x, in, dxa, ld, 0.0f, dAc,
				  in);
			float *A32 = (float *)pw(PW_A32, (size_t)ld * in * sizeof(float));
			for (int c = 0; c < nl; c++) {
				size_t m = (size_t)R * in;
				add_kernel<<<grid_capped(m), 256, 0, g_stream>>>(p[lm[c]].dA, dAc + c * m,
										 m);
				CUDA_LAUNCH_CHECK("add_kernel");
				CUDA_CHECK(cudaMemcpyAsync(A32 + c * m, p[lm[c]].A, m * sizeof(float),
							   cudaMemcpyDeviceToDevice, g_stream));
			}
			// dx [T,in] += dxa A_cat:  (dx^T [in,T] += A_cat^T [in, nl R] . dxa^T [nl R, T])
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, ld, 1.0f, A32, in, dxa, ld, 1.0f, dx,
				  in);
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
				gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, q->A, in, dxac, ld,
					  0.0f, dxd, in);
				dropout_backward_kernel<<<grid_capped(Tin), 256, 0, g_stream>>>(
					dx, dxd, Tin, drop, inv, q->key);
				CUDA_LAUNCH_CHECK("dropout_backward_kernel");
			}
		}
	}
	// dx^T [in,T] += W_j^T [in,out] . dyb_j^T [out,T]
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, 1.0f, wbf(p[j].W), in, dyb + off[j],
			  out, 1.0f, dx, in);
	}
}

static void cuda_proj_forward(const bk_proj *p, int n, const float *x, float *xa, int T,
			      int in, int R, float scale, float drop, float *scratch)
{
	if (bk_cuda_linear_mode() == 2)
		bk_cuda_proj_forward_v2(p, n, x, xa, T, in, R, scale, drop, scratch);
	else
		bk_cuda_proj_forward_v1(p, n, x, xa, T, in, R, scale, drop, scratch);
}

static void cuda_proj_backward(float *dx, const bk_proj *p, int n, const float *x,
			       const float *xa, int T, int in, int R, float scale, float drop,
			       float *scratch)
{
	if (bk_cuda_linear_mode() == 2)
		bk_cuda_proj_backward_v2(dx, p, n, x, xa, T, in, R, scale, drop, scratch);
	else
		bk_cuda_proj_backward_v1(dx, p, n, x, xa, T, in, R, scale, drop, scratch);
}
