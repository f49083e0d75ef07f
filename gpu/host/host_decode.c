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
#include "gpu/host/host_rows.h"
#include "gpu/host/loss.h"
#include "gpu/host/host_dots.h" /* dots: the attention scores */

/* ---- row-wise matmul ----
 * dot(x, w, n) = 16 lane partial sums (lane j takes elements i = j mod 16, in order of i:
 * a multiply, then an add, never fused), then a fixed pairwise fold (lanes j + 8 into j,
 * then j + 4, j + 2, j + 1).  That is the whole arithmetic of one output element: it
 * depends on its own row and weight row only, never on T, the row's place in the batch,
 * the blocking or the thread count, so generation is bit-for-bit independent of batch
 * composition.
 *
 * The kernels compute a tile of up to R rows x C outputs at once (R*C accumulators of 16
 * lanes kept in registers, each weight vector loaded once for R rows, each row vector
 * once for C outputs), for rows in chunks whose inputs stay in L2 and output blocks
 * whose weights do; threads take output blocks.  One C source, compiled three times
 * (AVX-512F, AVX2, baseline SSE2) with tile shapes that fit each register file: the
 * vectors are GCC vector types, their + and * lane-wise IEEE operations (ISO C: no FP
 * contraction, so no FMA), so every clone rounds exactly as the scalar definition above
 * (tests/unit/test_rows.c checks each against it bit for bit).  The choice of clone
 * (the CPU's, or BK_HOST_ISA=avx512|avx2|sse2) changes the speed, never a bit. */
enum { NL = 16 };

typedef float v16 __attribute__((vector_size(64)));
typedef float v8 __attribute__((vector_size(32)));
typedef float v4 __attribute__((vector_size(16)));

/* the pairwise fold of one output's 16 lanes: j += j + 8, then + 4, + 2, + 1 */
static inline __attribute__((always_inline)) float fold16(const float *f)
{
	v8 lo, hi;
	memcpy(&lo, f, 32);
	memcpy(&hi, f + 8, 32);
	v8 s8 = lo + hi;
	v4 l4, h4;
	memcpy(&l4, &s8, 16);
	memcpy(&h4, (const char *)&s8 + 16, 16);
	v4 s4 = l4 + h4;
	float s2[2] = { s4[0] + s4[2], s4[1] + s4[3] };
	return s2[0] + s2[1];
}

/* tile_VW(y, ys, x, w, in, rn, cn, alpha, acc, R, C):
 * y[r*ys + c] (r < rn, c < cn) = alpha * dot(x + r*in, w + c*in, in) (+ y when acc),
 * each output's 16 lanes held as 16/VW vectors of the clone's native width VW (GCC keeps
 * those in registers; wider ones it splits through memory).  R and C are constants
 * after inlining; rows past rn and outputs past cn repeat the last valid one (computed,
 * not stored).  The tail i in [m, in) is read into zero-padded lanes: a lane's sum
 * starts at +0 and so is never -0, and s + (+0) = s for every other s, so the padding
 * leaves every lane as the definition has it.  Vectors pass through memory and
 * pointers, never as arguments (their ABI depends on the target); all inlined. */
#define BK_TILE(VT, VW)                                                                     \
	static inline __attribute__((always_inline)) void tile_##VW(                         \
		float *y, size_t ys, const float *x, const float *w, int in, int rn, int cn,  \
		float alpha, int acc, const int R, const int C)                              \
	{                                                                                    \
		enum { NV = NL / VW };                                                       \
		VT a[4][8][NV];                                                              \
		const float *xr[4], *wc[8];                                                  \
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                          \
			xr[r] = x + (size_t)(r < rn ? r : rn - 1) * in;                      \
		_Pragma("GCC unroll 8") for (int c = 0; c < C; c++)                          \
			wc[c] = w + (size_t)(c < cn ? c : cn - 1) * in;                      \
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                          \
		_Pragma("GCC unroll 8") for (int c = 0; c < C; c++)                          \
		_Pragma("GCC unroll 4") for (int u = 0; u < NV; u++)                         \
			a[r][c][u] = (VT){ 0 };                                              \
		int m = in / NL * NL;                                                        \
		for (int i = 0; i < m; i += NL) {                                            \
			VT xv[4][NV];                                                        \
			_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                  \
			_Pragma("GCC unroll 4") for (int u = 0; u < NV; u++)                 \
				memcpy(&xv[r][u], xr[r] + i + u * VW, sizeof(VT));           \
			_Pragma("GCC unroll 8") for (int c = 0; c < C; c++)                  \
			_Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) {               \
				VT wv;                                                       \
				memcpy(&wv, wc[c] + i + u * VW, sizeof(VT));                 \
				_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)          \
					a[r][c][u] += xv[r][u] * wv;                         \
			}                                                                    \
		}                                                                            \
		if (m < in) { /* the tail, through zero-padded copies */                     \
			float xb[NL], wb[NL];                                                \
			_Pragma("GCC unroll 8") for (int c = 0; c < C; c++) {                \
				memset(wb, 0, sizeof(wb));                                   \
				memcpy(wb, wc[c] + m, (size_t)(in - m) * sizeof(float));     \
				_Pragma("GCC unroll 4") for (int r = 0; r < R; r++) {        \
					memset(xb, 0, sizeof(xb));                           \
					memcpy(xb, xr[r] + m, (size_t)(in - m) * sizeof(float)); \
					_Pragma("GCC unroll 4") for (int u = 0; u < NV; u++) { \
						VT xv, wv;                                   \
						memcpy(&xv, xb + u * VW, sizeof(VT));        \
						memcpy(&wv, wb + u * VW, sizeof(VT));        \
						a[r][c][u] += xv * wv;                       \
					}                                                    \
				}                                                            \
			}                                                                    \
		}                                                                            \
		_Pragma("GCC unroll 4") for (int r = 0; r < R; r++)                          \
		_Pragma("GCC unroll 8") for (int c = 0; c < C; c++)                          \
			if (r < rn && c < cn) {                                              \
				float f[NL], *o = y + (size_t)r * ys + c;                    \
				memcpy(f, a[r][c], sizeof(f));                               \
				float d = fold16(f);                                         \
				*o = acc ? *o + alpha * d : alpha * d;                       \
			}                                                                    \
	}

BK_TILE(v16, 16)
BK_TILE(v8, 8)
BK_TILE(v4, 4)

typedef void tile_fn(float *y, size_t ys, const float *x, const float *w, int in, int rn,
		     int cn, float alpha, int acc);

/* one clone: tiles of R = 4, 2 and 1 rows by C outputs, for target T */
#define BK_TILES(isa, T, VW, C)                                                               \
	__attribute__((target(T))) static void isa##_4(float *y, size_t ys, const float *x,  \
						       const float *w, int in, int rn, int cn, \
						       float alpha, int acc)                  \
	{                                                                                    \
		tile_##VW(y, ys, x, w, in, rn, cn, alpha, acc, 4, C);                             \
	}                                                                                    \
	__attribute__((target(T))) static void isa##_2(float *y, size_t ys, const float *x,  \
						       const float *w, int in, int rn, int cn, \
						       float alpha, int acc)                  \
	{                                                                                    \
		tile_##VW(y, ys, x, w, in, rn, cn, alpha, acc, 2, C);                             \
	}                                                                                    \
	__attribute__((target(T))) static void isa##_1(float *y, size_t ys, const float *x,  \
						       const float *w, int in, int rn, int cn, \
						       float alpha, int acc)                  \
	{                                                                                    \
		tile_##VW(y, ys, x, w, in, rn, cn, alpha, acc, 1, C);                             \
	}

BK_TILES(k512, "avx512f", 16, 6) /* 24 zmm accumulators of 32 */
BK_TILES(k256, "avx2", 8, 1)     /* 16 ymm: 4 accumulators of two, their loads */
BK_TILES(k128, "sse2", 4, 1)     /* 16 xmm: 4 accumulators of four */

typedef struct {
	const char *name;
	int C;
	tile_fn *t4, *t2, *t1;
} isa_kern;

static const isa_kern kerns[] = {
	{ "avx512", 6, k512_4, k512_2, k512_1 },
	{ "avx2", 1, k256_4, k256_2, k256_1 },
	{ "sse2", 1, k128_4, k128_2, k128_1 },
};

static const isa_kern *kern_cur;

static const isa_kern *kern_pick(const char *want)
{
	__builtin_cpu_init();
	int have[3] = { __builtin_cpu_supports("avx512f"), __builtin_cpu_supports("avx2"), 1 };
	for (int i = 0; i < 3; i++)
		if (have[i] && (!want || !*want || !strcmp(want, kerns[i].name)))
			return &kerns[i];
	return NULL;
}

int bk_host_rows_isa(const char *name)
{
	const isa_kern *k = kern_pick(name);
	if (!k)
		return -1;
	__atomic_store_n(&kern_cur, k, __ATOMIC_RELEASE);
	return 0;
}

const char *bk_host_rows_isa_name(void)
{
	const isa_kern *k = __atomic_load_n(&kern_cur, __ATOMIC_ACQUIRE);
	if (!k) {
		const char *e = getenv("BK_HOST_ISA");
		if (bk_host_rows_isa(e) < 0)
			die("BK_HOST_ISA=%s: not one of avx512, avx2, sse2 that this CPU runs", e);
		k = __atomic_load_n(&kern_cur, __ATOMIC_ACQUIRE);
	}
	return k->name;
}

enum { ROWS_CHUNK = 64,  /* rows whose inputs stay in L2 across an output block */
       OUT_BLOCK = 48 }; /* outputs per thread work item (a multiple of every C) */

/* y [T,out] (=|+=) alpha * x [T,in] W^T with W [out,in] */
static void rows_matmul(float *y, const float *x, const float *W, int T, int out, int in,
			float alpha, int acc)
{
	bk_host_rows_isa_name();
	const isa_kern *k = __atomic_load_n(&kern_cur, __ATOMIC_ACQUIRE);
	int C = k->C, nob = (out + OUT_BLOCK - 1) / OUT_BLOCK;
	for (int t0 = 0; t0 < T; t0 += ROWS_CHUNK) {
		int t1 = t0 + ROWS_CHUNK < T ? t0 + ROWS_CHUNK : T;
#pragma omp parallel for schedule(static) if ((double)(t1 - t0) * out * in > 2097152.0)
		for (int ob = 0; ob < nob; ob++) {
			int o0 = ob * OUT_BLOCK, o1 = o0 + OUT_BLOCK < out ? o0 + OUT_BLOCK : out;
			for (int t = t0; t < t1;) {
				int rn = t1 - t >= 4 ? 4 : t1 - t >= 2 ? 2 : 1;
				tile_fn *f = rn == 4 ? k->t4 : rn == 2 ? k->t2 : k->t1;
				for (int o = o0; o < o1; o += C)
					f(y + (size_t)t * out + o, (size_t)out, x + (size_t)t * in,
					  W + (size_t)o * in, in, rn, o1 - o < C ? o1 - o : C, alpha,
					  acc);
				t += rn;
			}
		}
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

/* ---- attention over the sequence's keys ----
 * A score is dot(q, k) summed in order of d (one float chain per key), the softmax's
 * sum in order of keys, the output in order of keys: one row's numbers never depend on
 * another's.  The kernel runs KB keys' chains side by side (independent sums, so the
 * same bits as one key at a time: dots() of gpu/host/host_dots.h) and each query head of
 * a GQA group against the keys of its kv head in turn. */

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
#pragma omp parallel if ((double)T * NH * maxkey * D > 262144.0)
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
				for (int j = j0; j < nk; j += KB) {
					int n = nk - j < KB ? nk - j : KB;
					const float *kj[KB];
					for (int i = 0; i < n; i++)
						kj[i] = kv_at(kc, tb, j + i, l, L, kh, NKV, D);
					dots(sc + j, qt, kj, n, D);
					for (int i = j; i < j + n; i++) {
						float s = sc[i] * scale;
						sc[i] = cap > 0 ? tanhf(s / cap) * cap : s;
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
					const float *vj = kv_at(vc, tb, j, l, L, kh, NKV, D);
					float wgt = sc[j] / sum;
#pragma omp simd
					for (int d = 0; d < D; d++)
						ot[d] += wgt * vj[d];
				}
			}
		}
		free(sc);
	}
}

/* the teacher top-k of logits rows: bk-teach's own function (gpu/host/loss.h), in its
 * logits form; the softcap is already in the logits, and 8192 is bk-teach's default
 * vocabulary chunk */
static void host_teacher_topk(float *logits, int N, int V, float temperature, int k,
			      int32_t *ids, float *logp, float *rest)
{
	bk_teacher_topk(NULL, NULL, logits, N, 1, V, 8192, temperature, 0, k, ids, logp, rest);
}

const bk_gen_ops bk_gen_ops_host = {
	.name = "host",
	.kv_bytes = sizeof(float),
	.linear = host_gen_linear,
	.lora = host_gen_lora,
	.kv_store = host_kv_store,
	.attend = host_attend,
	.sample = NULL,    /* the engine samples on the host (gpu/sample.h) */
	.teacher_topk = host_teacher_topk,
	.mem_free = NULL,  /* the pool grows on demand */
};
