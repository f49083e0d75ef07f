/* host_decode.c - bk_gen_ops_host: the fp32 host twin of the generation ops of gen.h
 * (row-wise linear and LoRA, KV-cache store, attention of new tokens over prefix +
 * cache).  Every output element is computed by one fixed sequence of float operations
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

/* y [T,out] (=|+=) alpha * x [T,in] W^T with W [out,in] */
static void rows_matmul(float *y, const float *x, const float *W, int T, int out, int in,
			float alpha, int acc)
{
	int nob = (out + OB - 1) / OB;
#pragma omp parallel for schedule(static) if ((double)T * out * in > 4194304.0)
	for (int ob = 0; ob < nob; ob++) {
		int o0 = ob * OB, o1 = o0 + OB < out ? o0 + OB : out;
		for (int t = 0; t < T; t++)
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

/* ---- KV cache ---- */

static void host_kv_store(float *const *kc, float *const *vc, const float *k, const float *v,
			  const int32_t *seq, const int32_t *row, int T, int NKV, int D)
{
	size_t w = (size_t)NKV * D;
	for (int t = 0; t < T; t++) {
		BUG_ON(row[t] < 0);
		memcpy(kc[seq[t]] + (size_t)row[t] * w, k + (size_t)t * w, w * sizeof(float));
		memcpy(vc[seq[t]] + (size_t)row[t] * w, v + (size_t)t * w, w * sizeof(float));
	}
}

/* ---- attention over prefix + own cache ---- */

static float dotf(const float *a, const float *b, int n)
{
	float s = 0;
	for (int i = 0; i < n; i++)
		s += a[i] * b[i];
	return s;
}

static void host_attend(float *out, const float *q, const int32_t *seq, const int32_t *row,
			int T, int NH, int NKV, int D, const float *const *kc,
			const float *const *vc, const int32_t *use_prefix, const float *pk,
			const float *pv, int P)
{
	BUG_ON(NH % NKV);
	int group = NH / NKV, maxrow = 0;
	for (int t = 0; t < T; t++)
		maxrow = row[t] > maxrow ? row[t] : maxrow;
	float scale = 1.0f / sqrtf((float)D);
#pragma omp parallel if ((double)T * NH * (P + maxrow + 1) * D > 1048576.0)
	{
		float *sc = xmalloc(((size_t)P + maxrow + 1) * sizeof(float));
#pragma omp for collapse(2) schedule(static)
		for (int t = 0; t < T; t++) {
			for (int h = 0; h < NH; h++) {
				int s = seq[t], kh = h / group, np = use_prefix[s] ? P : 0;
				int nk = np + row[t] + 1;
				BUG_ON(np && (!pk || !pv));
				const float *qt = q + ((size_t)t * NH + h) * D;
				float mx = -INFINITY;
				for (int j = 0; j < nk; j++) {
					const float *kj = j < np ? pk + ((size_t)j * NKV + kh) * D
								 : kc[s] + ((size_t)(j - np) * NKV + kh) * D;
					sc[j] = dotf(qt, kj, D) * scale;
					mx = sc[j] > mx ? sc[j] : mx;
				}
				float sum = 0;
				for (int j = 0; j < nk; j++) {
					sc[j] = expf(sc[j] - mx);
					sum += sc[j];
				}
				float *ot = out + ((size_t)t * NH + h) * D;
				memset(ot, 0, D * sizeof(float));
				for (int j = 0; j < nk; j++) {
					const float *vj = j < np ? pv + ((size_t)j * NKV + kh) * D
								 : vc[s] + ((size_t)(j - np) * NKV + kh) * D;
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
	.linear = host_gen_linear,
	.lora = host_gen_lora,
	.kv_store = host_kv_store,
	.attend = host_attend,
};

const bk_gen_ops *bk_gen_ops_for(const bk_ops *ops)
{
	if (ops == &bk_ops_host)
		return &bk_gen_ops_host;
	die("generation: no decode ops for device '%s' in this build (use --device cpu)",
	    ops->name);
}
