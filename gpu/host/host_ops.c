/* host_ops.c - bk_ops_host: the fp32 host twin of every op in ops.h (OpenBLAS sgemm for
 * matmuls, OpenMP over rows/heads).  It is the judge of the CUDA ops, so it favours
 * plain loops over speed tricks; not a general BLAS wrapper. */
#include "gpu/ops.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "gpu/host/host_attn.h"
#include "gpu/host/host_dots.h" /* dotf, dots: the attention scores */
#include "gpu/optim8.h"
#include "gpu/quant4.h"

/* ---- memory ---- */

static void *host_alloc(size_t bytes)
{
	void *p = xmalloc(bytes ? bytes : 1);
	memset(p, 0xff, bytes); /* all-ones bytes are a NaN float: unwritten reads show */
	return p;
}
static void host_free(void *p) { free(p); }
static void host_upload(void *dst, const void *src, size_t bytes)
{
	if (bytes)
		memcpy(dst, src, bytes);
}
static void host_zero(void *p, size_t bytes)
{
	if (bytes)
		memset(p, 0, bytes);
}

static bk_weight *host_weight_upload_plain_empty(int rows, int cols)
{
	BUG_ON(rows <= 0 || cols <= 0);
	bk_weight *w = xcalloc(1, sizeof(*w));
	w->rows = rows;
	w->cols = cols;
	w->data = xmalloc((size_t)rows * cols * sizeof(float));
	return w;
}

static bk_weight *host_weight_upload(const float *host, int rows, int cols)
{
	bk_weight *w = host_weight_upload_plain_empty(rows, cols);
	memcpy(w->data, host, (size_t)rows * cols * sizeof(float));
	return w;
}

/* 4-bit: expanded once, here, to the fp32 values the ops compute with (ops.h) */
static bk_weight *host_weight_upload_q4(const bk_q4 *q, int compute_bf16)
{
	bk_weight *w = host_weight_upload_plain_empty(q->rows, q->cols);
	bk_q4_dequantize(q, w->data, compute_bf16);
	w->kind = BK_WEIGHT_Q4;
	return w;
}

static void host_weight_free(bk_weight *w)
{
	if (!w)
		return;
	free(w->data);
	free(w);
}

static const float *wdata(const bk_weight *w) { return (const float *)w->data; }

/* ---- embedding ---- */

static void host_embedding_forward(float *x /* [T,H] */, const int32_t *ids /* [T] */,
				   const bk_weight *embed /* [V,H] */, int T)
{
	int V = embed->rows, H = embed->cols;
	for (int t = 0; t < T; t++) {
		if (ids[t] < 0 || ids[t] >= V)
			BUG("embedding: token %d: id %d out of range [0,%d)", t, ids[t], V);
		memcpy(x + (size_t)t * H, wdata(embed) + (size_t)ids[t] * H, H * sizeof(float));
	}
}

/* ---- RMSNorm ---- */

static void host_rmsnorm_forward(float *out /* [T,H] */, float *rstd /* [T] */,
				 const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				 int T, int H, float eps)
{
	BUG_ON(w->rows * w->cols != H);
	const float *wv = wdata(w);
#pragma omp parallel for if (T > 16)
	for (int t = 0; t < T; t++) {
		const float *xt = x + (size_t)t * H;
		float *ot = out + (size_t)t * H;
		float ss = 0;
		for (int i = 0; i < H; i++)
			ss += xt[i] * xt[i];
		float r = 1.0f / sqrtf(ss / H + eps);
		rstd[t] = r;
		for (int i = 0; i < H; i++)
			ot[i] = wv[i] * (xt[i] * r);
	}
}

/* With xh = x*rstd and g = dout*w:  dx = rstd * (g - xh * mean(g*xh)). */
static void host_rmsnorm_backward(float *dx /* [T,H] += */, const float *dout /* [T,H] */,
				  const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				  const float *rstd /* [T] */, int T, int H)
{
	BUG_ON(w->rows * w->cols != H);
	const float *wv = wdata(w);
#pragma omp parallel for if (T > 16)
	for (int t = 0; t < T; t++) {
		const float *xt = x + (size_t)t * H, *dt = dout + (size_t)t * H;
		float *dxt = dx + (size_t)t * H;
		float r = rstd[t], dot = 0;
		for (int i = 0; i < H; i++)
			dot += dt[i] * wv[i] * xt[i] * r;
		dot /= H;
		for (int i = 0; i < H; i++)
			dxt[i] += r * (dt[i] * wv[i] - xt[i] * r * dot);
	}
}

/* ---- frozen linear ---- */

static void host_linear_forward(float *y /* [T,out] */, const float *x /* [T,in] */,
				const bk_weight *W /* [out,in] */, int T)
{
	int out = W->rows, in = W->cols;
	if (T <= 0)
		return;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, in, 1.0f, x, in,
		    wdata(W), in, 0.0f, y, out);
}

static void host_linear_backward(float *dx /* [T,in] += */, const float *dy /* [T,out] */,
				 const bk_weight *W /* [out,in] */, int T)
{
	int out = W->rows, in = W->cols;
	if (T <= 0)
		return;
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, out, 1.0f, dy, out,
		    wdata(W), in, 1.0f, dx, in);
}

/* ---- LoRA ---- */

/* The dropout mask: element i of a key is kept when bk_crng_uniform(key, i) >= p.  Here
 * the same integer steps (common/rng.c: bk_mix64 three times) inlined, so that a loop of
 * them vectorizes, and the compare on the 53-bit integer: (x >> 11) 2^-53 >= p exactly
 * when (x >> 11) >= ceil(p 2^53), both exact in double.  The same mask, bit for bit
 * (test_ops checks drop(x) against bk_crng_uniform); clones for AVX-512 (its 64-bit
 * multiply), AVX2 and the baseline, chosen by the CPU. */
static inline __attribute__((always_inline)) uint64_t mix64_inl(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ULL;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
	return x ^ (x >> 31);
}

static inline __attribute__((always_inline)) int drop_kept(uint64_t key, uint64_t i, uint64_t thr)
{
	return (mix64_inl(mix64_inl(key ^ mix64_inl(i)) + i) >> 11) >= thr;
}

/* xd[i] = kept ? x[i] inv : 0 for i in [i0, i1), and mask[i] = kept when mask */
#define BK_DROP_KERN(name, T)                                                                \
	T static void name(float *xd, unsigned char *mask, const float *x, size_t i0,         \
			   size_t i1, uint64_t key, uint64_t thr, float inv)                  \
	{                                                                                    \
		if (mask) {                                                                  \
			_Pragma("omp simd") for (size_t i = i0; i < i1; i++)                 \
			{                                                                    \
				int k = drop_kept(key, i, thr);                              \
				xd[i] = k ? x[i] * inv : 0.0f;                               \
				mask[i] = (unsigned char)k;                                  \
			}                                                                    \
		} else {                                                                     \
			_Pragma("omp simd") for (size_t i = i0; i < i1; i++)                 \
				xd[i] = drop_kept(key, i, thr) ? x[i] * inv : 0.0f;          \
		}                                                                            \
	}
BK_DROP_KERN(drop_k512, __attribute__((target("avx512f,avx512dq"))))
BK_DROP_KERN(drop_k256, __attribute__((target("avx2"))))
BK_DROP_KERN(drop_k128, )

typedef void drop_fn(float *xd, unsigned char *mask, const float *x, size_t i0, size_t i1,
		     uint64_t key, uint64_t thr, float inv);

static drop_fn *drop_pick(void)
{
	__builtin_cpu_init();
	if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq"))
		return drop_k512;
	return __builtin_cpu_supports("avx2") ? drop_k256 : drop_k128;
}

enum { DROP_BLOCK = 16384 }; /* elements per work item */

/* xd = drop(x) (or x itself when p == 0); mask (when not NULL) [T,in] gets the kept flags */
static const float *lora_dropped(float *xd /* [T,in] */, unsigned char *mask,
				 const float *x /* [T,in] */, int T, int in, float p, uint64_t key)
{
	if (p <= 0)
		return x;
	float inv = 1.0f / (1.0f - p);
	uint64_t thr = (uint64_t)ceil((double)p * 0x1p53);
	size_t n = (size_t)T * in, nb = (n + DROP_BLOCK - 1) / DROP_BLOCK;
	drop_fn *f = drop_pick();
#pragma omp parallel for schedule(static) if (n > 65536)
	for (size_t b = 0; b < nb; b++) {
		size_t i0 = b * DROP_BLOCK, i1 = i0 + DROP_BLOCK < n ? i0 + DROP_BLOCK : n;
		f(xd, mask, x, i0, i1, key, thr, inv);
	}
	return xd;
}

static void host_lora_forward(float *y /* [T,out] += */, float *xa /* [T,R] */,
			      const float *x /* [T,in] */, const float *A /* [R,in] */,
			      const float *B /* [out,R] */, int T, int in, int out, int R,
			      float scale, float p, uint64_t key, float *scratch /* [T,in+R] */)
{
	BUG_ON(p < 0 || p >= 1);
	if (T <= 0)
		return;
	const float *xd = lora_dropped(scratch, NULL, x, T, in, p, key);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, R, in, 1.0f, xd, in, A, in,
		    0.0f, xa, R);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, out, R, scale, xa, R, B, R,
		    1.0f, y, out);
}

/* dB += scale dy^T xa;  dxa = scale dy B;  dA += dxa^T drop(x);  dx += drop'(dxa A) */
static void host_lora_backward(float *dx /* [T,in] += */, float *dA /* [R,in] += */,
			       float *dB /* [out,R] += */, const float *dy /* [T,out] */,
			       const float *x /* [T,in] */, const float *xa /* [T,R] */,
			       const float *A /* [R,in] */, const float *B /* [out,R] */, int T,
			       int in, int out, int R, float scale, float p, uint64_t key,
			       float *scratch /* [T,in+R] */)
{
	BUG_ON(p < 0 || p >= 1);
	if (T <= 0)
		return;
	float *dxa = scratch + (size_t)T * in; /* [T,R] */
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, R, T, scale, dy, out, xa, R,
		    1.0f, dB, R);
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, R, out, scale, dy, out, B, R,
		    0.0f, dxa, R);
	size_t n = (size_t)T * in;
	unsigned char *mask = p > 0 ? xmalloc(n) : NULL; /* the kept flags, for dx below */
	const float *xd = lora_dropped(scratch, mask, x, T, in, p, key);
	cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, R, in, T, 1.0f, dxa, R, xd, in,
		    1.0f, dA, in);
	if (p <= 0) {
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, R, 1.0f, dxa, R, A,
			    in, 1.0f, dx, in);
		return;
	}
	float *dxd = scratch; /* [T,in], drop(x) is no longer needed */
	cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, in, R, 1.0f, dxa, R, A, in,
		    0.0f, dxd, in);
	float inv = 1.0f / (1.0f - p);
#pragma omp parallel for simd schedule(static) if (n > 65536)
	for (size_t i = 0; i < n; i++)
		dx[i] = mask[i] ? dx[i] + dxd[i] * inv : dx[i];
	free(mask);
}

/* ---- RoPE ---- */

static void rope_rotate(float *x /* [T,n,D] */, const int32_t *pos /* [T] */,
			const float *inv_freq /* [D/2] */, int T, int n, int D, float sign)
{
	BUG_ON(D % 2);
	int half = D / 2;
#pragma omp parallel for if (T > 16)
	for (int t = 0; t < T; t++) {
		for (int i = 0; i < half; i++) {
			float ang = (float)pos[t] * inv_freq[i];
			float c = cosf(ang), s = sign * sinf(ang);
			for (int h = 0; h < n; h++) {
				float *xh = x + ((size_t)t * n + h) * D;
				float a = xh[i], b = xh[i + half];
				xh[i] = a * c - b * s;
				xh[i + half] = b * c + a * s;
			}
		}
	}
}

static void host_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int T,
			      int n, int D)
{
	rope_rotate(x, pos, inv_freq, T, n, D, 1.0f);
}

static void host_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int T,
			       int n, int D)
{
	rope_rotate(dx, pos, inv_freq, T, n, D, -1.0f);
}

/* ---- attention ---- */

static void check_seqlens(const int32_t *cu, int S, int T)
{
	if (cu[0] != 0 || cu[S] != T)
		BUG("attention: cu_seqlens[0] = %d, cu_seqlens[%d] = %d, T = %d", cu[0], S, cu[S], T);
	for (int s = 0; s < S; s++)
		if (cu[s + 1] < cu[s])
			BUG("attention: cu_seqlens decreases at %d", s);
}

/* the capped score and its derivative factor d capped / d raw (1 without a cap) */
static inline float cap_score(float sraw, float cap)
{
	return cap > 0 ? tanhf(sraw / cap) * cap : sraw;
}

/* first visible key of a query at absolute position qpos: keys at positions
 * > qpos - window (all when window is 0) */
static inline int first_key(int qpos, int window)
{
	return window > 0 && qpos - window + 1 > 0 ? qpos - window + 1 : 0;
}

/* One query row: scores against the visible prefix keys then own-sequence keys
 * cu[s]..t, two-pass softmax.  Query t is at position P + (t - cu[s]); key j of the
 * combined list (prefix 0..P-1, then own) is at position j.  sc holds P + T + 1. */
void bk_host_attention_forward_rows(float *out /* [T,NH,D] */, float *lse /* [NH,T] */,
				    const float *q /* [T,NH,D] */, const float *k /* [T,NKV,D] */,
				    const float *v /* [T,NKV,D] */, const int32_t *cu /* [S+1] */,
				    int S, int T, int NH, int NKV, int D,
				    const float *pk /* [P,NKV,D] */, const float *pv /* [P,NKV,D] */,
				    int P, const bk_attn *ap)
{
	BUG_ON(NH % NKV);
	BUG_ON(P > 0 && (!pk || !pv));
	BUG_ON(!ap || ap->window < 0 || ap->softcap < 0);
	check_seqlens(cu, S, T);
	int group = NH / NKV;
	float scale = ap->scale, cap = ap->softcap;
#pragma omp parallel
	{
		float *sc = xmalloc(((size_t)P + T + 1) * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic, 4)
		for (int s = 0; s < S; s++) {
			for (int h = 0; h < NH; h++) {
				int kh = h / group;
				for (int t = cu[s]; t < cu[s + 1]; t++) {
					const float *qt = q + ((size_t)t * NH + h) * D;
					int nk = P + (t - cu[s] + 1), j0 = first_key(nk - 1, ap->window);
					float mx = -INFINITY;
					for (int j = j0; j < nk; j += KB) {
						int n = nk - j < KB ? nk - j : KB;
						const float *kj[KB];
						for (int i = 0; i < n; i++)
							kj[i] = j + i < P ? pk + ((size_t)(j + i) * NKV + kh) * D
									  : k + ((size_t)(cu[s] + j + i - P) * NKV + kh) * D;
						dots(sc + j, qt, kj, n, D);
						for (int i = j; i < j + n; i++) {
							sc[i] = cap_score(sc[i] * scale, cap);
							mx = sc[i] > mx ? sc[i] : mx;
						}
					}
					float sum = 0;
					for (int j = j0; j < nk; j++) {
						sc[j] = expf(sc[j] - mx);
						sum += sc[j];
					}
					float *ot = out + ((size_t)t * NH + h) * D;
					memset(ot, 0, D * sizeof(float));
					for (int j = j0; j < nk; j++) {
						const float *vj = j < P ? pv + ((size_t)j * NKV + kh) * D
									: v + ((size_t)(cu[s] + j - P) * NKV + kh) * D;
						float w = sc[j] / sum;
#pragma omp simd
						for (int d = 0; d < D; d++)
							ot[d] += w * vj[d];
					}
					lse[(size_t)h * T + t] = mx + logf(sum);
				}
			}
		}
		free(sc);
	}
}

/* c_ij = cap(scale q_i.k_j), p_ij = exp(c_ij - lse_i);  dv_j += p_ij do_i;
 * dc_ij = p_ij (do_i.v_j - do_i.o_i);  ds_ij = dc_ij (1 - (c_ij/cap)^2) scale (the
 * tanh' factor only with a cap);  dq_i += ds_ij k_j;  dk_j += ds_ij q_i, over the
 * visible keys j (window).  One thread owns one (sequence, kv head) pair, so its
 * dk/dv rows are written by no other thread.  (No prefix: position = t - cu[s].) */
void bk_host_attention_backward_rows(float *dq, float *dk, float *dv, const float *dout,
				     const float *q, const float *k, const float *v,
				     const float *out, const float *lse, const int32_t *cu, int S,
				     int T, int NH, int NKV, int D, const bk_attn *ap)
{
	BUG_ON(NH % NKV);
	BUG_ON(!ap || ap->window < 0 || ap->softcap < 0);
	check_seqlens(cu, S, T);
	int group = NH / NKV;
	float scale = ap->scale, cap = ap->softcap;
#pragma omp parallel for collapse(2) schedule(dynamic, 1)
	for (int s = 0; s < S; s++) {
		for (int kh = 0; kh < NKV; kh++) {
			for (int h = kh * group; h < (kh + 1) * group; h++) {
				for (int t = cu[s]; t < cu[s + 1]; t++) {
					size_t qi = ((size_t)t * NH + h) * D;
					const float *qt = q + qi, *dot = dout + qi;
					float *dqt = dq + qi;
					float l = lse[(size_t)h * T + t];
					float Di = dotf(dot, out + qi, D);
					int jb = cu[s] + first_key(t - cu[s], ap->window);
					for (int j0 = jb; j0 <= t; j0 += KB) {
						int n = t + 1 - j0 < KB ? t + 1 - j0 : KB;
						const float *kj[KB], *vj[KB];
						float qk[KB], dv_[KB];
						for (int i = 0; i < n; i++) {
							kj[i] = k + ((size_t)(j0 + i) * NKV + kh) * D;
							vj[i] = v + ((size_t)(j0 + i) * NKV + kh) * D;
						}
						dots(qk, qt, kj, n, D);
						dots(dv_, dot, vj, n, D);
						for (int i = 0; i < n; i++) {
							size_t ki = ((size_t)(j0 + i) * NKV + kh) * D;
							float c = cap_score(qk[i] * scale, cap);
							float p = expf(c - l);
							float ds = p * (dv_[i] - Di) * scale;
							if (cap > 0)
								ds *= 1.0f - (c / cap) * (c / cap);
							float *dvj = dv + ki, *dkj = dk + ki;
							const float *kk = k + ki;
#pragma omp simd
							for (int d = 0; d < D; d++) {
								dvj[d] += p * dot[d];
								dqt[d] += ds * kk[d];
								dkj[d] += ds * qt[d];
							}
						}
					}
				}
			}
		}
	}
}

/* ---- blocked attention (bk_ops_host's training attention) ----
 * Per (sequence, head) and tile of QT queries: the tile's scores against every key any
 * of its queries sees (the window's first key of its first query to its last query)
 * by sgemm, straight from the strided [T,NH,D] / [T,NKV,D] rows (a prefix's keys by a
 * second sgemm into the same score rows), then per query row the mask, scale, softcap
 * and softmax on its visible keys (others 0), and out = P V by sgemm.  The backward per
 * (sequence, kv head), so that a thread owns its dk/dv rows, and per head of the group
 * and query tile: scores again, P = exp(c - lse), dP = dout V^T, dS = P (dP - D_i)
 * scale (times the cap's slope), then dV += P^T dout, dq += dS K, dK += dS^T q: five
 * small sgemms (one-threaded inside the parallel region, as OpenBLAS runs there).
 * Deterministic: the tiles and every sgemm's sizes depend on the shapes only, never on
 * the thread count.  Not batch-invariant (the sgemm's summation order depends on the
 * tile's key count): the teacher pass keeps bk_host_attention_forward_rows. */
enum { QT = 64 };

/* keys [k0, k1) of sequence s in the combined list (prefix 0..P-1, then own): the
 * prefix part [k0, min(k1, P)) and the own part [max(k0, P), k1) */
static void attn_scores(float *sc, int ld, const float *qt, int qn, int NH, int NKV, int D,
			const float *pk, const float *kown, int P, int k0, int k1)
{
	int pe = k1 < P ? k1 : P, os = k0 > P ? k0 : P;
	if (k0 < pe)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qn, pe - k0, D, 1.0f, qt,
			    NH * D, pk + (size_t)k0 * NKV * D, NKV * D, 0.0f, sc, ld);
	if (os < k1)
		cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qn, k1 - os, D, 1.0f, qt,
			    NH * D, kown + (size_t)(os - P) * NKV * D, NKV * D, 0.0f,
			    sc + (os - k0), ld);
}

static void host_attention_forward(float *out /* [T,NH,D] */, float *lse /* [NH,T] */,
				   const float *q /* [T,NH,D] */, const float *k /* [T,NKV,D] */,
				   const float *v /* [T,NKV,D] */, const int32_t *cu /* [S+1] */,
				   int S, int T, int NH, int NKV, int D,
				   const float *pk /* [P,NKV,D] */, const float *pv /* [P,NKV,D] */,
				   int P, const bk_attn *ap)
{
	BUG_ON(NH % NKV);
	BUG_ON(P > 0 && (!pk || !pv));
	BUG_ON(!ap || ap->window < 0 || ap->softcap < 0);
	check_seqlens(cu, S, T);
	int group = NH / NKV, W = ap->window, maxlen = 0;
	float scale = ap->scale, cap = ap->softcap;
	/* work items: (sequence, head, query tile), in order */
	int nitem = 0;
	for (int s = 0; s < S; s++) {
		int n = cu[s + 1] - cu[s];
		maxlen = n > maxlen ? n : maxlen;
		nitem += (n + QT - 1) / QT * NH;
	}
	if (!nitem)
		return;
	int *item = xmalloc((size_t)nitem * 3 * sizeof(int));
	for (int s = 0, i = 0; s < S; s++)
		for (int h = 0; h < NH; h++)
			for (int a = 0; a < cu[s + 1] - cu[s]; a += QT, i++)
				item[3 * i] = s, item[3 * i + 1] = h, item[3 * i + 2] = a;
	/* the widest tile's key span: P + maxlen keys (fewer with a window) */
	size_t span = (size_t)P + maxlen;
	if (W > 0 && (size_t)W + QT < span)
		span = (size_t)W + QT;
#pragma omp parallel if (nitem > 1)
	{
		float *sc = xmalloc((size_t)QT * span * sizeof(float));
#pragma omp for schedule(dynamic, 1)
		for (int it = 0; it < nitem; it++) {
			int s = item[3 * it], h = item[3 * it + 1], a = item[3 * it + 2];
			int n = cu[s + 1] - cu[s], b = a + QT < n ? a + QT : n, qn = b - a, kh = h / group;
			/* queries at positions P + a .. P + b - 1; keys [k0, k1) */
			int k0 = first_key(P + a, W), k1 = P + b, ld = k1 - k0;
			const float *qt = q + ((size_t)(cu[s] + a) * NH + h) * D;
			attn_scores(sc, ld, qt, qn, NH, NKV, D, pk ? pk + (size_t)kh * D : NULL,
				    k + ((size_t)cu[s] * NKV + kh) * D, P, k0, k1);
			for (int i = 0; i < qn; i++) {
				float *row = sc + (size_t)i * ld;
				int j0 = first_key(P + a + i, W) - k0, j1 = P + a + i + 1 - k0;
				float mx = -INFINITY;
				for (int j = j0; j < j1; j++) {
					row[j] = cap_score(row[j] * scale, cap);
					mx = row[j] > mx ? row[j] : mx;
				}
				float sum = 0;
				for (int j = j0; j < j1; j++) {
					row[j] = expf(row[j] - mx);
					sum += row[j];
				}
				float inv = 1.0f / sum;
				for (int j = 0; j < j0; j++)
					row[j] = 0;
				for (int j = j0; j < j1; j++)
					row[j] *= inv;
				for (int j = j1; j < ld; j++)
					row[j] = 0;
				lse[(size_t)h * T + cu[s] + a + i] = mx + logf(sum);
			}
			/* out = P V over the prefix part, then the own part */
			float *ot = out + ((size_t)(cu[s] + a) * NH + h) * D;
			int pe = k1 < P ? k1 : P, os = k0 > P ? k0 : P;
			float beta = 0.0f;
			if (k0 < pe) {
				cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, qn, D, pe - k0,
					    1.0f, sc, ld, pv + ((size_t)k0 * NKV + kh) * D, NKV * D,
					    0.0f, ot, NH * D);
				beta = 1.0f;
			}
			cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, qn, D, k1 - os, 1.0f,
				    sc + (os - k0), ld,
				    v + ((size_t)(cu[s] + os - P) * NKV + kh) * D, NKV * D, beta, ot,
				    NH * D);
		}
		free(sc);
	}
	free(item);
}

static void host_attention_backward(float *dq, float *dk, float *dv, const float *dout,
				    const float *q, const float *k, const float *v,
				    const float *out, const float *lse, const int32_t *cu, int S,
				    int T, int NH, int NKV, int D, const bk_attn *ap)
{
	BUG_ON(NH % NKV);
	BUG_ON(!ap || ap->window < 0 || ap->softcap < 0);
	check_seqlens(cu, S, T);
	int group = NH / NKV, W = ap->window, maxlen = 0;
	float scale = ap->scale, cap = ap->softcap;
	for (int s = 0; s < S; s++)
		maxlen = cu[s + 1] - cu[s] > maxlen ? cu[s + 1] - cu[s] : maxlen;
	if (!maxlen)
		return;
	size_t span = (size_t)maxlen;
	if (W > 0 && (size_t)W + QT < span)
		span = (size_t)W + QT;
	size_t qs = (size_t)NH * D, ks = (size_t)NKV * D;
#pragma omp parallel if (S * NKV > 1)
	{
		float *pb = xmalloc((size_t)QT * span * sizeof(float)); /* c, then P */
		float *gb = xmalloc((size_t)QT * span * sizeof(float)); /* dP, then dS */
		float *di = xmalloc((size_t)QT * sizeof(float));
#pragma omp for collapse(2) schedule(dynamic, 1)
		for (int s = 0; s < S; s++) {
			for (int kh = 0; kh < NKV; kh++) {
				int n = cu[s + 1] - cu[s];
				const float *ks0 = k + (size_t)cu[s] * ks + (size_t)kh * D;
				const float *vs0 = v + (size_t)cu[s] * ks + (size_t)kh * D;
				float *dks0 = dk + (size_t)cu[s] * ks + (size_t)kh * D;
				float *dvs0 = dv + (size_t)cu[s] * ks + (size_t)kh * D;
				for (int h = kh * group; h < (kh + 1) * group; h++) {
					for (int a = 0; a < n; a += QT) {
						int b = a + QT < n ? a + QT : n, qn = b - a;
						int k0 = first_key(a, W), ld = b - k0;
						size_t qi = ((size_t)(cu[s] + a) * NH + h) * D;
						const float *qt = q + qi, *dot = dout + qi, *kk = ks0 + (size_t)k0 * ks,
							    *vv = vs0 + (size_t)k0 * ks;
						cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qn, ld, D,
							    1.0f, qt, (int)qs, kk, (int)ks, 0.0f, pb, ld);
						cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, qn, ld, D,
							    1.0f, dot, (int)qs, vv, (int)ks, 0.0f, gb, ld);
						for (int i = 0; i < qn; i++)
							di[i] = dotf(dot + (size_t)i * qs, out + qi + (size_t)i * qs, D);
						for (int i = 0; i < qn; i++) {
							float *pr = pb + (size_t)i * ld, *gr = gb + (size_t)i * ld;
							float l = lse[(size_t)h * T + cu[s] + a + i], d_i = di[i];
							int j0 = first_key(a + i, W) - k0, j1 = a + i + 1 - k0;
							for (int j = 0; j < j0; j++)
								pr[j] = gr[j] = 0;
							for (int j = j0; j < j1; j++) {
								float c = cap_score(pr[j] * scale, cap);
								float p = expf(c - l);
								float ds = p * (gr[j] - d_i) * scale;
								if (cap > 0)
									ds *= 1.0f - (c / cap) * (c / cap);
								pr[j] = p;
								gr[j] = ds;
							}
							for (int j = j1; j < ld; j++)
								pr[j] = gr[j] = 0;
						}
						/* dV[keys] += P^T dout;  dq += dS K;  dK[keys] += dS^T q */
						cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ld, D, qn,
							    1.0f, pb, ld, dot, (int)qs, 1.0f,
							    dvs0 + (size_t)k0 * ks, (int)ks);
						cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, qn, D, ld,
							    1.0f, gb, ld, kk, (int)ks, 1.0f, dq + qi, (int)qs);
						cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, ld, D, qn,
							    1.0f, gb, ld, qt, (int)qs, 1.0f,
							    dks0 + (size_t)k0 * ks, (int)ks);
					}
				}
			}
		}
		free(pb), free(gb), free(di);
	}
}

/* ---- SwiGLU ---- */

static void host_swiglu_forward(float *h, const float *gate, const float *up, size_t n)
{
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];
		h[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

/* silu'(g) = sig(g) (1 + g (1 - sig(g))); writes dgate, dup (they may be gate, up:
 * each element's inputs are read before its outputs are written) */
static void host_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
				 const float *up, size_t n)
{
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++) {
		float g = gate[i], u = up[i], d = dh[i], sg = 1.0f / (1.0f + expf(-g));
		dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
		dup[i] = d * g * sg;
	}
}

/* ---- GeGLU (tanh) ---- */

#define GELU_K0 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_K1 0.044715f

static void host_geglu_forward(float *h, const float *gate, const float *up, size_t n)
{
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++) {
		float g = gate[i];
		float th = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
		h[i] = 0.5f * g * (1.0f + th) * up[i];
	}
}

/* gelu'(g) = 0.5 (1 + th) + 0.5 g (1 - th^2) k0 (1 + 3 k1 g^2) */
static void host_geglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
				const float *up, size_t n)
{
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++) {
		float g = gate[i], u = up[i], d = dh[i];
		float th = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
		float gl = 0.5f * g * (1.0f + th);
		float dg = 0.5f * (1.0f + th) +
			   0.5f * g * (1.0f - th * th) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * g * g);
		dgate[i] = d * u * dg; /* as swiglu: written, may be in place */
		dup[i] = d * gl;
	}
}

/* ---- bias and softcap ---- */

static void host_bias_forward(float *y, const bk_weight *b, int T)
{
	int n = b->rows * b->cols;
	BUG_ON(b->rows != 1);
	const float *bv = wdata(b);
	for (int t = 0; t < T; t++) {
		float *yt = y + (size_t)t * n;
		for (int i = 0; i < n; i++)
			yt[i] += bv[i];
	}
}

static void host_softcap_forward(float *x, float cap, size_t n)
{
	BUG_ON(!(cap > 0));
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++)
		x[i] = tanhf(x[i] / cap) * cap;
}

static void host_residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for if (n > 65536)
	for (size_t i = 0; i < n; i++)
		out[i] = a[i] + b[i];
}

/* rows and the baking loss: host_loss_ops.c (wrappers of gpu/host/loss.c) */
#include "gpu/host/host_loss_ops.h"

/* ---- optimizer (rules: gpu/optim8.h) ---- */

static void host_adamw_step(float *param, const float *grad, float *m, float *v, size_t n,
			    double lr, double beta1, double beta2, double eps,
			    double weight_decay, int64_t step)
{
	bk_adamw_scalars s;
	bk_adamw_scalars_make(&s, lr, beta1, beta2, eps, weight_decay, step);
	ptrdiff_t nn = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (nn > 65536)
	for (ptrdiff_t i = 0; i < nn; i++)
		bk_adamw_elem(&s, &param[i], &m[i], &v[i], grad[i]);
}

static void host_adamw8_step(float *param, const float *grad, uint8_t *qm, uint8_t *qv,
			     float *absmax_m, float *absmax_v, size_t n, int block, double lr,
			     double beta1, double beta2, double eps, double weight_decay,
			     int64_t step)
{
	bk_adamw8_update(param, grad, qm, qv, absmax_m, absmax_v, n, block, lr, beta1, beta2,
			 eps, weight_decay, step);
}

/* 65536-value blocks summed in parallel, each in index order, then the block sums
 * added in index order: the result does not depend on thread scheduling */
static double host_grad_sumsq(const float *g, size_t n)
{
	const size_t blk = 65536;
	size_t nb = (n + blk - 1) / blk;
	double *part = xcalloc(nb ? nb : 1, sizeof(double));
#pragma omp parallel for schedule(static) if (nb > 1)
	for (size_t b = 0; b < nb; b++) {
		size_t end = (b + 1) * blk < n ? (b + 1) * blk : n;
		double acc = 0;
		for (size_t i = b * blk; i < end; i++)
			acc += (double)g[i] * g[i];
		part[b] = acc;
	}
	double s = 0;
	for (size_t b = 0; b < nb; b++)
		s += part[b];
	free(part);
	return s;
}

static void host_scale(float *x, double s, size_t n)
{
	float f = (float)s;
	ptrdiff_t nn = (ptrdiff_t)n;
#pragma omp parallel for schedule(static) if (nn > 65536)
	for (ptrdiff_t i = 0; i < nn; i++)
		x[i] *= f;
}

/* ---- projection groups: each member's linear and LoRA op in turn, so the numbers
 * are those of the separate calls bit for bit (the judge of the fused CUDA path).  xa
 * layout: member j's [T,R] at xa + j*T*R. ---- */

static void proj_check(const bk_proj *p, int n, int in, int R, float drop)
{
	BUG_ON(n < 1 || n > BK_PROJ_MAX || drop < 0 || drop >= 1);
	for (int j = 0; j < n; j++)
		BUG_ON(p[j].W->cols != in || (p[j].A && (R <= 0 || !p[j].B)));
}

static void host_proj_forward(const bk_proj *p, int n, const float *x, float *xa, int T,
			      int in, int R, float scale, float drop, float *scratch)
{
	proj_check(p, n, in, R, drop);
	for (int j = 0; j < n; j++) {
		host_linear_forward(p[j].y, x, p[j].W, T);
		if (p[j].A)
			host_lora_forward(p[j].y, xa + (size_t)j * T * R, x, p[j].A, p[j].B, T, in,
					  p[j].W->rows, R, scale, drop, p[j].key, scratch);
	}
}

static void host_proj_backward(float *dx, const bk_proj *p, int n, const float *x,
			       const float *xa, int T, int in, int R, float scale, float drop,
			       float *scratch)
{
	proj_check(p, n, in, R, drop);
	for (int j = 0; j < n; j++) {
		host_linear_backward(dx, p[j].dy, p[j].W, T);
		if (p[j].A)
			host_lora_backward(dx, p[j].dA, p[j].dB, p[j].dy, x, xa + (size_t)j * T * R,
					   p[j].A, p[j].B, T, in, p[j].W->rows, R, scale, drop,
					   p[j].key, scratch);
	}
}

const bk_ops bk_ops_host = {
	.name = "host",
	.alloc = host_alloc,
	.free = host_free,
	.upload = host_upload,
	.download = host_upload,
	.copy = host_upload,
	.zero = host_zero,
	.weight_upload = host_weight_upload,
	.weight_free = host_weight_free,
	.weight_upload_q4 = host_weight_upload_q4,
	.embedding_forward = host_embedding_forward,
	.rmsnorm_forward = host_rmsnorm_forward,
	.rmsnorm_backward = host_rmsnorm_backward,
	.linear_forward = host_linear_forward,
	.linear_backward = host_linear_backward,
	.lora_forward = host_lora_forward,
	.lora_backward = host_lora_backward,
	.rope_forward = host_rope_forward,
	.rope_backward = host_rope_backward,
	.attention_forward = host_attention_forward,
	.attention_backward = host_attention_backward,
	.swiglu_forward = host_swiglu_forward,
	.swiglu_backward = host_swiglu_backward,
	.geglu_forward = host_geglu_forward,
	.geglu_backward = host_geglu_backward,
	.bias_forward = host_bias_forward,
	.softcap_forward = host_softcap_forward,
	.residual_forward = host_residual_forward,
	.gather_rows = bk_host_gather_rows,
	.scatter_rows = bk_host_scatter_rows,
	.kl_exact = bk_host_kl_exact,
	.kl_topk = bk_host_kl_topk,
	.teacher_topk = bk_host_teacher_topk,
	.teacher_logprobs = bk_host_teacher_logprobs,
	.adamw_step = host_adamw_step,
	.adamw8_step = host_adamw8_step,
	.grad_sumsq = host_grad_sumsq,
	.scale = host_scale,
	.proj_forward = host_proj_forward,
	.proj_backward = host_proj_backward,
};
