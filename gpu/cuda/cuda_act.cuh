// cuda_act.cuh - BK_ACT=bf16: bf16 activations on the CUDA training path (the act ops of
// gpu/ops.h), included by gpu/cuda/cuda_ops.cu after the projection groups; it uses
// cuda_ops.cu's static GEMM, conversion, dropout and allocation helpers (none of
// cuda_proj.cuh's).  Device code: cuda_act_kernels.cuh.
//
// Design.
//
// BK_ACT (environment, read once; bk_cuda_act_set_mode overrides it): "fp32" or unset =
// every activation fp32, exactly the path before this file (the default until a GPU run
// validates bf16); "bf16" = the tensors below are stored in bf16.  Anything else dies with
// the one-line message of bk_cuda_env_mode.
//
// Which tensors are bf16 (bk_ops_cuda.act_bytes() == 2): the per-layer saved activations
// that feed a GEMM or the attention, each written once in bf16 by the op producing it:
//   ln1, ln2   the normalised inputs: the RMSNorm forward writes bf16 (rmsnorm_forward_act),
//              the projections read it as the B operand of their bf16 GEMM directly (the
//              fp32 path rounds its fp32 copy to bf16 in a pass of its own per call);
//   q, k, v    after RoPE: the projections write fp32 into the backward's dq/dk/dv
//              buffers (free during a forward), bias and q/k norms stay fp32 there, and
//              RoPE writes bf16 q, k (rope_forward_act), v is rounded (to_act);
//   att        the attention output (o_proj's input), written bf16 by the attention;
//   gate, up   the projections write fp32 into the backward's dgate/dup buffers, the GLU
//              (glu_forward_act) saves them rounded to bf16 and computes h from those;
//   h          the SwiGLU/GeGLU output (down_proj's input), bf16;
//   prefix K/V a shared prefix's per-layer K and V (copies of k, v).
// What stays fp32: the residual stream (resid, resid2 and the Gemma sandwich outputs
// oout/dout), every rstd, lse and D_i, q/k before their norm (qraw, kraw), LoRA xa, every
// gradient (dres, dln, dq, ..., dA, dB), the LoRA master weights and optimizer state,
// the final hidden state and everything of the loss.  Norms, softmax, RoPE angles and all
// accumulations are fp32; only stores round.
//
// How gpu/model.c learns the element size: bk_ops.act_bytes (NULL on the host twin: 4,
// and the host twin's code does not change), read once by bk_model_create into
// bk_model.act_bytes.  The act buffers are allocated with that element size and every
// pointer into them is computed in bytes (model.c's lay_act: base + slot * max_T * width *
// act_bytes), so with act_bytes 4 the addresses, the ops called and the bits are those of
// before.  With 2, model.c calls the *_act ops for exactly the reads and writes above.
//
// The ops (each the fp32 op of cuda_ops.cu with bf16 loads / stores):
//   rmsnorm_forward_act, rope_forward_act, to_act, glu_forward_act, glu_backward_act:
//     cuda_act_kernels.cuh;
//   attention_forward_act / backward_act: with BK_ATTN=tc (and D 64/128/256, aligned)
//     the tensor-core kernels of cuda_attention_tc.cu read the bf16 q/k/v (and prefix)
//     directly and write a bf16 out (the fp32 interface rounds them to bf16 in shared
//     memory anyway); with BK_ATTN=fp32 (or another D) q, k, v, prefix and out are
//     widened into fp32 workspace and the fp32 op runs, out rounded back;
//   proj_forward_act: per member y_j = scale (x_d A_j^T) B_j^T + x W_j^T: xa_j [T,R]
//     (member j at xa + j T R, the v1 layout) = one bf16 GEMM of x (or its dropped bf16
//     copy) with a bf16 copy of A_j, fp32 out; the LoRA B product is written first (TF32,
//     beta 0) and the base bf16 GEMM over x accumulates onto it (beta 1): no conversion
//     pass over x and no read-modify-write of y.  These are the projections of bf16 mode
//     whatever BK_LINEAR says (v2/v3's one GEMM for the members' A and batched base GEMMs
//     are not merged in: cuda_proj.cuh takes fp32 x);
//   proj_backward_act: per member dy_j rounded to bf16 once for dx += dy W (bf16 GEMM, as
//     the fp32 path), dB += scale xa^T dy and dxa = scale dy B in TF32 (fp32 operands, as
//     v1), dA += dxa^T x_d as a bf16 GEMM (dxa rounded to bf16: x is bf16 now), dx +=
//     drop'(dxa A) in TF32.
//
// Error bounds against the host twin (u = 2^-8: bf16 keeps 8 significant bits, 7 stored
// and the implicit one, so one round to nearest is within 2^-8 relative; the checks use
// inputs and norm weights that are bf16 numbers, so the weight rounding at upload is
// exact).  tests/emu/test_act_kernels.cc checks the elementwise and row ops and the bf16
// attention entry points (on the emulated GPU), tests/unit/test_model_act.c model.c's
// bf16 path with host act ops of this arithmetic, tests/gpu/check_act.c the ops on a GPU
// and the model:
//   to_act                 |y - x| <= u |x|
//   rmsnorm_forward_act    |y - h| <= (u + 1e-5) |h| + 1e-6 max|h|      (h: host out; 1e-5:
//                          the fp32 op's own rounding, its rstd in another order)
//   rope_forward_act       |y - h| <= u |h| + 1e-5 max|x|            (cosf/sinf vs libm)
//   glu_forward_act        |y - h| <= 1.01 u (2 + k_f(g)) |h| + 1e-6 max|h|, k_f(g) =
//                          |g f'(g) / f(g)| the relative condition number of silu / gelu
//                          at g (g and up rounded, then the product): silu: |1 + g (1 -
//                          sigmoid(g))|
//   glu_backward_act       |d - h| <= 1.01 u |dh| (|up| (|f'(g)| + |g f''(g)|) + |g f'(g)|)
//                          + 1e-6 max|h| for dgate (g and up rounded); dup: 1.01 u |dh|
//                          |g f'(g)| + 1e-6 max|h|
//   attention_forward_act  the tensor-core kernel's bound on bf16 inputs (tests/emu/
//                          test_attention_tc.cc: 1.01 u max|v| + 1e-5) + u |out| (the
//                          store); lse 1e-4
//   attention_backward_act the tensor-core kernel's (2e-2 max|gradient|), D_i now from the
//                          bf16 out (u relative on each term)
//   proj_*_act             the base product is the fp32 path's to the bit (the same bf16 x
//                          and W, the same GEMM) up to cuBLAS's order with beta 1; the LoRA
//                          terms gain A rounded to bf16 (u) in xa and dxa rounded (u) in
//                          dA, against TF32 (2^-11) in the fp32 path.
// How it compounds (the model check, tests/gpu/check_act.c): each rounding multiplies one
// tensor elementwise by (1 + d), |d| <= u, d spread evenly, so its relative L2 size is at
// most u (u / sqrt 3 on average).  A layer carries a relative perturbation through with a
// gain of at most k = 4 (the GLU's product and silu's condition number over |g| < 4,
// RMSNorm's ~1, softmax's exp over scores of O(1)); independent roundings add in
// quadrature.  Against the fp32 mode, bf16 mode adds N <= 9 roundings a layer on a
// gradient's path: gate and up; q, k, v (with BK_ATTN=fp32 only: the tensor-core kernel
// rounds them in both modes); out in D_i; the LoRA products' x (bf16 instead of TF32,
// the base GEMM's rounding of it is the fp32 mode's too) and A's bf16 copy; dxa before
// dA.  (ln1, ln2, att and h as GEMM inputs are rounded in both modes.)  Over L layers
//   e_bf16 <= sqrt(e_fp32^2 + 9 L (k u)^2)
// for the relative L2 error of the final hidden state and of each LoRA gradient tensor
// against the host twin, e_fp32 being the fp32 mode's own (bf16 weights and GEMM inputs).
#include "gpu/cuda/cuda_act_kernels.cuh"

static int g_act_mode; // 0: not read yet; 1 = fp32, 2 = bf16

extern "C" int bk_cuda_act_mode(void)
{
	return bk_cuda_env_mode(&g_act_mode, "BK_ACT", "fp32", "bf16", 0);
}

extern "C" void bk_cuda_act_set_mode(int mode)
{
	if (mode != 1 && mode != 2)
		CUDA_BUG("bk_cuda_act_set_mode: mode %d", mode);
	g_act_mode = mode;
}

static int cuda_act_bytes(void) { return bk_cuda_act_mode() == 2 ? 2 : 4; }

// growable device buffers of this file (its own: the shared workspace slots belong to the
// attention and loss ops, the pw slots to cuda_proj.cuh)
enum { AW_AB, AW_XD, AW_DYB, AW_DXAB, AW_Q, AW_K, AW_V, AW_PK, AW_PV, AW_O, AW_N };
static void *g_aw[AW_N];
static size_t g_aw_bytes[AW_N];

static void *aw(int slot, size_t bytes)
{
	if (bytes <= g_aw_bytes[slot])
		return g_aw[slot];
	size_t want = bytes + bytes / 4;
	bk_cuda_dev_free(g_aw[slot]);
	g_aw[slot] = bk_cuda_dev_alloc(want, "activation scratch");
	g_aw_bytes[slot] = want;
	return g_aw[slot];
}

typedef __nv_bfloat16 bf16;

static void cuda_rmsnorm_forward_act(void *out, float *rstd, const float *x, const bk_weight *w,
				     int T, int H, float eps)
{
	if (w->rows * w->cols != H)
		CUDA_BUG("rmsnorm_forward_act: weight %d x %d for H %d", w->rows, w->cols, H);
	if (T <= 0)
		return;
	BK_LAUNCH(act_rmsnorm_kernel, T, NORM_THREADS, 0, g_stream, (bf16 *)out, rstd, x, wbf(w), H, eps);
}

static void cuda_rope_forward_act(void *out, const float *x, const int32_t *pos,
				  const float *inv_freq, int T, int n, int D)
{
	if (D % 2)
		CUDA_BUG("rope_forward_act: odd head dimension %d", D);
	size_t total = (size_t)T * n * (D / 2);
	if (!total)
		return;
	BK_LAUNCH(act_rope_kernel, bk_cuda_blocks(total, 256), 256, 0, g_stream, (bf16 *)out, x, pos,
									 inv_freq, T, n, D);
}

static void cuda_to_act(void *dst, const float *src, size_t n) { to_bf16((bf16 *)dst, src, n); }

static void widen(float *dst, const void *src, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(act_widen_kernel, grid_capped(n), 256, 0, g_stream, dst, (const bf16 *)src, n);
}

static void cuda_glu_forward_act(void *h, void *gate_act, void *up_act, const float *gate,
				 const float *up, size_t n, int geglu)
{
	if (!n)
		return;
	BK_LAUNCH(act_glu_forward_kernel, grid_capped(n), 256, 0, g_stream,
		(bf16 *)h, (bf16 *)gate_act, (bf16 *)up_act, gate, up, n, geglu);
}

static void cuda_glu_backward_act(float *dgate, float *dup, const float *dh, const void *gate,
				  const void *up, size_t n, int geglu)
{
	if (!n)
		return;
	BK_LAUNCH(act_glu_backward_kernel, grid_capped(n), 256, 0, g_stream,
		dgate, dup, dh, (const bf16 *)gate, (const bf16 *)up, n, geglu);
}

static void cuda_attention_forward_act(void *out, float *lse, const void *q, const void *k,
				       const void *v, const int32_t *cu, int S, int T, int NH,
				       int NKV, int D, const void *pk, const void *pv, int P,
				       const bk_attn *ap)
{
	const void *b[] = { out, q, k, v, pk, pv };
	if (bk_cuda_attention_tc_selected() && bk_cuda_attention_tc_bf16_ok(D, b, 6)) {
		bk_cuda_attention_tc_forward_bf16(out, lse, q, k, v, cu, S, T, NH, NKV, D, pk, pv, P,
						  ap);
		return;
	}
	// the fp32 op on widened copies
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D, np = (size_t)P * NKV * D;
	float *qf = (float *)aw(AW_Q, nq * 4), *kf = (float *)aw(AW_K, nk * 4);
	float *vf = (float *)aw(AW_V, nk * 4), *of = (float *)aw(AW_O, nq * 4);
	float *pkf = P > 0 ? (float *)aw(AW_PK, np * 4) : NULL;
	float *pvf = P > 0 ? (float *)aw(AW_PV, np * 4) : NULL;
	widen(qf, q, nq);
	widen(kf, k, nk);
	widen(vf, v, nk);
	if (P > 0) {
		widen(pkf, pk, np);
		widen(pvf, pv, np);
	}
	bk_cuda_attention_forward_sel(of, lse, qf, kf, vf, cu, S, T, NH, NKV, D, pkf, pvf, P, ap);
	to_bf16((bf16 *)out, of, nq);
}

static void cuda_attention_backward_act(float *dq, float *dk, float *dv, const float *dout,
					const void *q, const void *k, const void *v,
					const void *out, const float *lse, const int32_t *cu, int S,
					int T, int NH, int NKV, int D, const bk_attn *ap)
{
	const void *b[] = { dq, dk, dv, dout, q, k, v, out };
	if (bk_cuda_attention_tc_selected() && bk_cuda_attention_tc_bf16_ok(D, b, 8)) {
		bk_cuda_attention_tc_backward_bf16(dq, dk, dv, dout, q, k, v, out, lse, cu, S, T, NH,
						   NKV, D, ap);
		return;
	}
	size_t nq = (size_t)T * NH * D, nk = (size_t)T * NKV * D;
	float *qf = (float *)aw(AW_Q, nq * 4), *kf = (float *)aw(AW_K, nk * 4);
	float *vf = (float *)aw(AW_V, nk * 4), *of = (float *)aw(AW_O, nq * 4);
	widen(qf, q, nq);
	widen(kf, k, nk);
	widen(vf, v, nk);
	widen(of, out, nq);
	bk_cuda_attention_backward_sel(dq, dk, dv, dout, qf, kf, vf, of, lse, cu, S, T, NH, NKV, D,
				       ap);
}

// the projection group's sizes (cuda_proj.cuh's checks, here so this file does not depend
// on that one's statics)
static void act_proj_check(const char *op, const bk_proj *p, int n, int in, int R, float drop)
{
	if (n < 1 || n > BK_PROJ_MAX || drop < 0 || drop >= 1)
		CUDA_BUG("%s: %d members, dropout %g", op, n, (double)drop);
	for (int j = 0; j < n; j++)
		if (p[j].W->cols != in || (p[j].A && (R <= 0 || !p[j].B)))
			CUDA_BUG("%s: member %d: weight %d x %d for in %d, rank %d", op, j,
				 p[j].W->rows, p[j].W->cols, in, R);
}

// xs [T,in] bf16: x itself, or its dropped copy in AW_XD (dropout_kernel's mask)
static const bf16 *act_dropped(const bf16 *x, size_t n, float p, uint64_t key)
{
	if (p <= 0)
		return x;
	bf16 *xd = (bf16 *)aw(AW_XD, n * 2);
	BK_LAUNCH(act_dropout_kernel, grid_capped(n), 256, 0, g_stream, xd, x, n, p, 1.0f / (1.0f - p),
								  key);
	return xd;
}

static void cuda_proj_forward_act(const bk_proj *p, int n, const void *xv, float *xa, int T,
				  int in, int R, float scale, float drop, float *scratch)
{
	(void)scratch;
	act_proj_check("proj_forward_act", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	const bf16 *x = (const bf16 *)xv;
	size_t Tin = (size_t)T * in;
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		if (p[j].A) {
			float *xaj = xa + (size_t)j * T * R;
			bf16 *Ab = (bf16 *)aw(AW_AB, (size_t)R * in * 2);
			to_bf16(Ab, p[j].A, (size_t)R * in);
			const bf16 *xs = act_dropped(x, Tin, drop, p[j].key);
			// xa^T [R,T] = A [R,in] . xs^T [in,T]
			gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, R, T, in, 1.0f, Ab, in, xs, in, 0.0f, xaj, R);
			// y^T [out,T] = scale B [out,R] . xa^T [R,T]  (a write)
			gemm_tf32(CUBLAS_OP_T, CUBLAS_OP_N, out, T, R, scale, p[j].B, R, xaj, R, 0.0f,
				  p[j].y, out);
		}
		// y^T [out,T] (+)= W [out,in] . x^T [in,T]
		gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, 1.0f, wbf(p[j].W), in, x, in,
			  p[j].A ? 1.0f : 0.0f, p[j].y, out);
	}
}

static void cuda_proj_backward_act(float *dx, const bk_proj *p, int n, const void *xv,
				   const float *xa, int T, int in, int R, float scale, float drop,
				   float *scratch)
{
	act_proj_check("proj_backward_act", p, n, in, R, drop);
	if (T <= 0)
		return;
	cuda_init();
	const bf16 *x = (const bf16 *)xv;
	size_t Tin = (size_t)T * in;
	for (int j = 0; j < n; j++) {
		int out = p[j].W->rows;
		const float *dy = p[j].dy;
		if (p[j].A) {
			const float *xaj = xa + (size_t)j * T * R;
			float *dxa = scratch + Tin; // [T,R]
			// dB [out,R] += scale dy^T xa:  (dB^T [R,out] += scale xa^T [R,T] . dy [T,out])
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, R, out, T, scale, xaj, R, dy, out, 1.0f,
				  p[j].dB, R);
			// dxa [T,R] = scale dy B:  (dxa^T [R,T] = scale B^T [R,out] . dy^T [out,T])
			gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, R, T, out, scale, p[j].B, R, dy, out, 0.0f,
				  dxa, R);
			// dA [R,in] += dxa^T xs:  (dA^T [in,R] += xs^T [in,T] . dxab [T,R]), bf16
			bf16 *dxab = (bf16 *)aw(AW_DXAB, (size_t)T * R * 2);
			to_bf16(dxab, dxa, (size_t)T * R);
			const bf16 *xs = act_dropped(x, Tin, drop, p[j].key);
			gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_T, in, R, T, 1.0f, xs, in, dxab, R, 1.0f,
				  p[j].dA, in);
			if (drop <= 0) {
				// dx [T,in] += dxa A:  (dx^T [in,T] += A^T [in,R] . dxa^T [R,T])
				gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, p[j].A, in, dxa, R,
					  1.0f, dx, in);
			} else {
				float *dxd = scratch; // [T,in]
				gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, p[j].A, in, dxa, R,
					  0.0f, dxd, in);
				BK_LAUNCH(dropout_backward_kernel, grid_capped(Tin), 256, 0, g_stream,
					dx, dxd, Tin, drop, 1.0f / (1.0f - drop), p[j].key);
			}
		}
		// dx^T [in,T] += W^T [in,out] . dyb^T [out,T]
		bf16 *dyb = (bf16 *)aw(AW_DYB, (size_t)T * out * 2);
		to_bf16(dyb, dy, (size_t)T * out);
		gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, 1.0f, wbf(p[j].W), in, dyb, out, 1.0f,
			  dx, in);
	}
}
