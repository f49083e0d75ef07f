/* host_decode.c - bk_gen_ops_host: the fp32 host twin of the generation ops of gen.h
 * (row-wise linear and LoRA, paged KV-cache store, attention of new tokens over their
 * sequence's keys through its block table).  Every output element is computed by one fixed sequence of float operations
 * that depends only on its own row, never on T, the row's place or the thread count, so
 * generation is bit-for-bit independent of batch composition.  Not the training ops. */
#include "gpu/gen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"

/* ---- row-wise matmul ----
 * dot(x, w, n) = 16 lane partial sums (lane j takes elements i = j mod 16, in order),
 * then a fixed pairwise fold.  The kernel computes up to 4 outputs of one row at once
 * with exactly that arithmetic per output; the AVX2 clone only widens the lanes' vectors,
 * and with ISO C (no FP contraction) both clones round identically. */
enum { NL = 16, OB = 32 };

static inline float fold(float *a)
{
	for (int w = NL / 2; w > 0; w /= 2)
		for (int j = 0; j < w; j++)
			a[j] += a[j + w];
	return a[0];
}

/* y[c] (c < nw) = alpha * dot(x, w + c*in, in) (+ y[c] when acc) */
__attribute__((target_clones("avx2", "default"))) static void
dot_rows(float *y, const float *x, const float *w, int in, int nw, float alpha, int acc)
{
	float a[4][NL];
	memset(a, 0, sizeof(a));
	int m = in / NL * NL;
	if (nw == 4) {
		const float *w0 = w, *w1 = w + in, *w2 = w + 2 * (size_t)in, *w3 = w + 3 * (size_t)in;
		for (int i = 0; i < m; i += NL) {
#pragma omp simd
			for (int j = 0; j < NL; j++) {
				float xv = x[i + j];
				a[0][j] += xv * w0[i + j];
				a[1][j] += xv * w1[i + j];
				a[2][j] += xv * w2[i + j];
				a[3][j] += xv * w3[i + j];
			}
		}
	} else {
		for (int c = 0; c < nw; c++) {
			const float *wc = w + (size_t)c * in;
			for (int i = 0; i < m; i += NL) {
#pragma omp simd
				for (int j = 0; j < NL; j++)
					a[c][j] += x[i + j] * wc[i + j];
			}
		}
	}
	for (int c = 0; c < nw; c++) {
		const float *wc = w + (size_t)c * in;
		for (int i = m, j = 0; i < in; i++, j++)
			a[c][j] += x[i] * wc[i];
		float d = fold(a[c]);
		y[c] = acc ? y[c] + alpha * d : alpha * d;
	}
}

/* The same for two rows at once (x0 -> y0, x1 -> y1), four outputs: eight independent
 * accumulators keep both FMA pipes busy and each weight load serves two rows.  Every
 * (row, output) sees exactly dot_rows's operations in dot_rows's order, so results are
 * bit-identical to two dot_rows calls. */
__attribute__((target_clones("avx2", "default"))) static void
dot_rows2(float *y0, float *y1, const float *x0, const float *x1, const float *w, int in,
	  float alpha, int acc)
{
	float a[4][NL], b[4][NL];
	memset(a, 0, sizeof(a));
	memset(b, 0, sizeof(b));
	int m = in / NL * NL;
	const float *w0 = w, *w1 = w + in, *w2 = w + 2 * (size_t)in, *w3 = w + 3 * (size_t)in;
	for (int i = 0; i < m; i += NL) {
#pragma omp simd
		for (int j = 0; j < NL; j++) {
			float u = x0[i + j], v = x1[i + j];
			a[0][j] += u * w0[i + j];
			a[1][j] += u * w1[i + j];
			a[2][j] += u * w2[i + j];
			a[3][j] += u * w3[i + j];
			b[0][j] += v * w0[i + j];
			b[1][j] += v * w1[i + j];
			b[2][j] += v * w2[i + j];
			b[3][j] += v * w3[i + j];
		}
	}
	for (int c = 0; c < 4; c++) {
		const float *wc = w + (size_t)c * in;
		for (int i = m, j = 0; i < in; i++, j++) {
			a[c][j] += x0[i] * wc[i];
			b[c][j] += x1[i] * wc[i];
		}
		float d0 = fold(a[c]), d1 = fold(b[c]);
		y0[c] = acc ? y0[c] + alpha * d0 : alpha * d0;
		y1[c] = acc ? y1[c] + alpha * d1 : alpha * d1;
	}
}

/* y [T,out] (=|+=) alpha * x [T,in] W^T with W [out,in] */
static void rows_matmul(float *y, const float *x, const float *W, int T, int out, int in,
			float alpha, int acc)
{
	int nob = (out + OB - 1) / OB;
#pragma omp parallel for schedule(static) if ((double)T * out * in > 4194304.0)
	for (int ob = 0; ob < nob; ob++) {
		int o0 = ob * OB, o1 = o0 + OB < out ? o0 + OB : out;
		int t = 0;
		for (; t + 1 < T; t += 2) /* pairs of rows, then the odd one */
			for (int o = o0; o < o1; o += 4) {
				float *ya = y + (size_t)t * out + o, *yb = ya + out;
				const float *xa = x + (size_t)t * in, *xb = xa + in, *wo = W + (size_t)o * in;
				if (o1 - o >= 4) {
					dot_rows2(ya, yb, xa, xb, wo, in, alpha, acc);
				} else {
					dot_rows(ya, xa, wo, in, o1 - o, alpha, acc);
					dot_rows(yb, xb, wo, in, o1 - o, alpha, acc);
				}
			}
		for (; t < T; t++)
			for (int o = o0; o < o1; o += 4)
				dot_rows(y + (size_t)t * out + o, x + (size_t)t * in, W + (size_t)o * in,
					 in, o1 - o < 4 ? o1 - o : 4, alpha, acc);
	}
}

static void host_gen_linear(float *y, const float *x, const bk_weight *W, int T)
{
	if (T > 0)
		rows_matmul(y, x, (const float *)W->data, T, W->rows, W->cols, 1.0f, 0);
}

static void host_gen_lora(float *y, const float *x, const float *A, const float *B, int T,
			  int in, int out, int R, float scale, float *xa)
{
	if (T <= 0)
		return;
	rows_matmul(xa, x, A, T, R, in, 1.0f, 0);
	rows_matmul(y, xa, B, T, out, R, scale, 1);
}

/* ---- paged KV cache: pools [NB][L][BS][NKV][D] fp32 ---- */

static void host_kv_store(void *kp, void *vp, int l, int L, const float *k, const float *v,
			  const int32_t *slot, int T, int NKV, int D)
{
	size_t w = (size_t)NKV * D;
	for (int t = 0; t < T; t++) {
		BUG_ON(slot[t] < 0);
		size_t r = ((size_t)(slot[t] / BK_GEN_BLOCK) * L + l) * BK_GEN_BLOCK +
			   slot[t] % BK_GEN_BLOCK;
		memcpy((float *)kp + r * w, k + (size_t)t * w, w * sizeof(float));
		memcpy((float *)vp + r * w, v + (size_t)t * w, w * sizeof(float));
	}
}

/* ---- attention over the sequence's keys ---- */

static float dotf(const float *a, const float *b, int n)
{
	float s = 0;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

/* the first number of key/value j of kv head kh in layer l, through table row tb */
static inline const float *kv_at(const float *pool, const int32_t *tb, int j, int l, int L,
				 int kh, int NKV, int D)
{
	size_t r = ((size_t)tb[j / BK_GEN_BLOCK] * L + l) * BK_GEN_BLOCK + j % BK_GEN_BLOCK;
	return pool + (r * NKV + kh) * D;
}

static void host_attend(float *out, const float *q, const int32_t *seq, const int32_t *nkey,
			int T, int NH, int NKV, int D, const void *kp, const void *vp, int l,
			int L, const int32_t *table, int W, const bk_attn *ap)
{
	BUG_ON(NH % NKV);
	BUG_ON(!ap || ap->window < 0 || ap->softcap < 0);
	int group = NH / NKV, maxkey = 1;
	for (int t = 0; t < T; t++)
		maxkey = nkey[t] > maxkey ? nkey[t] : maxkey;
	float scale = ap->scale, cap = ap->softcap;
	const float *kc = kp, *vc = vp;
#pragma omp parallel if ((double)T * NH * maxkey * D > 1048576.0)
	{
		float *sc = xmalloc((size_t)maxkey * sizeof(float));
#pragma omp for collapse(2) schedule(static)
		for (int t = 0; t < T; t++) {
			for (int h = 0; h < NH; h++) {
				int kh = h / group, nk = nkey[t];
				/* the window: keys at positions > (nk - 1) - window */
				int j0 = ap->window > 0 && nk > ap->window ? nk - ap->window : 0;
				const int32_t *tb = table + (size_t)seq[t] * W;
				BUG_ON(nk < 1 || (nk - 1) / BK_GEN_BLOCK >= W);
				const float *qt = q + ((size_t)t * NH + h) * D;
				float mx = -INFINITY;
				for (int j = j0; j < nk; j++) {
					float s = dotf(qt, kv_at(kc, tb, j, l, L, kh, NKV, D), D) * scale;
					sc[j] = cap > 0 ? tanhf(s / cap) * cap : s;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				float sum = 0;
				for (int j = j0; j < nk; j++) {
					sc[j] = expf(sc[j] - mx);
					sum += sc[j];
				}
				float *ot = out + ((size_t)t * NH + h) * D;
				memset(ot, 0, D * sizeof(float));
				for (int j = j0; j < nk; j++) {
					const float *vj = kv_at(vc, tb, j, l, L, kh, NKV, D);
					float wgt = sc[j] / sum;
					for (int d = 0; d < D; d++)
						ot[d] += wgt * vj[d];
				}
			}
		}
		free(sc);
	}
}

const bk_gen_ops bk_gen_ops_host = {
	.name = "host",
	.kv_bytes = sizeof(float),
	.linear = host_gen_linear,
	.lora = host_gen_lora,
	.kv_store = host_kv_store,
	.attend = host_attend,
	.sample = NULL,    /* the engine samples on the host (gpu/sample.h) */
	.mem_free = NULL,  /* the pool grows on demand */
};

const bk_gen_ops *bk_gen_ops_for(const bk_ops *ops)
{
	if (ops == &bk_ops_host)
		return &bk_gen_ops_host;
#ifdef BK_HAVE_CUDA
	if (!strcmp(ops->name, "cuda"))
		return &bk_gen_ops_cuda;
#endif
	die("generation: no decode ops for device '%s' in this build (use --device cpu)",
	    ops->name);
}
