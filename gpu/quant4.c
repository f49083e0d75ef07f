/* quant4.c - see quant4.h.  Plain fp32 arithmetic without contraction (C11 mode), so
 * every rounding is the one torch/bitsandbytes does. */
#include "gpu/quant4.h"

#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/flags.h"
#include "gpu/optim8.h"

/* NF4: bitsandbytes' table (functional.get_4bit_type("nf4")), already sorted */
static const float nf4_code[16] = {
	-1.0f, -0.6961928009986877f, -0.5250730514526367f, -0.39491748809814453f,
	-0.28444138169288635f, -0.18477343022823334f, -0.09105003625154495f, 0.0f,
	0.07958029955625534f, 0.16093020141124725f, 0.24611230194568634f, 0.33791524171829224f,
	0.44070982933044434f, 0.5626170039176941f, 0.7229568362236023f, 1.0f,
};

/* FP4 (1 sign, 2 exponent, 1 mantissa bits; bnb's layout): get_4bit_type("fp4")'s
 * values divided in fp32 by their absmax 12.  Code 8 is -0, as bnb's C dequantisation
 * kernels have it (get_4bit_type's list has +0 there, which its Python fallback for an
 * odd last dimension uses; the two differ only in the sign of a zero) */
static const float fp4_raw[16] = {0, 0.0625f, 8, 12, 4, 6, 2, 3,
				  -0.0f, -0.0625f, -8, -12, -4, -6, -2, -3};
/* bnb's torch.argsort of the FP4 book (sorted position -> code); its two zeros come
 * out as index 0 then index 8 */
static const uint8_t fp4_order[16] = {11, 10, 13, 12, 15, 14, 9, 0, 8, 1, 6, 7, 4, 5, 2, 3};

static float fp4_code[16];
static float bounds[3][15]; /* [type]: midpoints of the sorted book */

static pthread_once_t books_once = PTHREAD_ONCE_INIT;

static void make_books(void)
{
	for (int i = 0; i < 16; i++)
		fp4_code[i] = fp4_raw[i] / 12.0f;
	for (int i = 0; i < 15; i++) {
		bounds[BK_Q4_NF4][i] = (nf4_code[i] + nf4_code[i + 1]) / 2.0f;
		bounds[BK_Q4_FP4][i] = (fp4_code[fp4_order[i]] + fp4_code[fp4_order[i + 1]]) / 2.0f;
	}
}

static void init_books(void) { pthread_once(&books_once, make_books); }

int bk_q4_parse(const char *name)
{
	return !strcmp(name, "nf4") ? BK_Q4_NF4 : !strcmp(name, "fp4") ? BK_Q4_FP4 : -1;
}

const char *bk_q4_name(int type)
{
	return type == BK_Q4_NF4 ? "nf4" : type == BK_Q4_FP4 ? "fp4" : "none";
}

const float *bk_q4_code(int type)
{
	init_books();
	if (type != BK_Q4_NF4 && type != BK_Q4_FP4)
		BUG("4-bit type %d", type);
	return type == BK_Q4_NF4 ? nf4_code : fp4_code;
}

const float *bk_q4_code2(void) { return bk_q8_map(1); }

uint16_t bk_q4_bf16_bits(float x)
{
	uint32_t u;
	memcpy(&u, &x, 4);
	if (isnan(x))
		return (uint16_t)((u >> 16) | 0x40);
	u += 0x7fffu + ((u >> 16) & 1u);
	return (uint16_t)(u >> 16);
}

float bk_q4_bf16_round(float x)
{
	uint32_t u = (uint32_t)bk_q4_bf16_bits(x) << 16;
	float r;
	memcpy(&r, &u, 4);
	return r;
}

/* the 4-bit code of a scaled value s in [-1,1]: bucketize over the midpoints */
static uint8_t encode(int type, float s)
{
	const float *b = bounds[type];
	int k = 0;
	while (k < 15 && b[k] < s)
		k++;
	return type == BK_Q4_NF4 ? (uint8_t)k : fp4_order[k];
}

static float clamp1(float s) { return s < -1.0f ? -1.0f : s > 1.0f ? 1.0f : s; }

/* ---- torch's fp32 sum on the CPU (aten/src/ATen/native/cpu/SumKernel.cpp
 * cascade_sum): one loop sums a row of items (scalars, or vectors of TORCH_LANES floats
 * added lane-wise) as 4 interleaved partial sums, each a cascade of 4 levels (an item is
 * added at level 0, every 2^p items a level is pushed up to the next), then the
 * partials in order.  A contiguous row of n >= TORCH_LANES floats: the vector sum of its
 * n / TORCH_LANES vectors, then the scalar tail, then the lanes in order.  8 lanes, as
 * torch 2.15's x86-64 wheel sums (measured against torch.sum for n = 3..5000, on an
 * AVX-512 CPU too).  From TORCH_GRAIN values on, with T > 1 threads, torch splits the
 * row (TensorIteratorReduce.cpp two_pass_reduction, at::parallel_for under OpenMP):
 * k = min(T, ceil(n / TORCH_GRAIN)) chunks of ceil(n / k) values (the last shorter),
 * chunk t summed by that loop into slot t of a buffer of T zeros, then the T slots
 * summed by the same loop.  So the bits of the mean depend on T
 * (torch.get_num_threads()): bk_q4_torch_threads below.  Checked bit for bit against
 * torch.mean for n up to 3M and T = 1..64 (tests/ref/make_q4_mean_golden.py). ---- */
#define TORCH_LANES 8
#define TORCH_GRAIN 32768 /* at::internal::GRAIN_SIZE */

static int ceil_log2(size_t x)
{
	if (x <= 2)
		return 1;
	int b = 0;
	for (size_t v = x - 1; v; v >>= 1)
		b++;
	return b;
}

/* row_sum over `items` items of w lanes each (item i, lane l at x[i*w + l]) */
static void torch_row_sum(const float *x, size_t items, int w, float *out /* [w] */)
{
	enum { ILP = 4, LEVELS = 4 };
	size_t size = items / ILP; /* multi_row_sum over rows of ILP items */
	int p = ceil_log2(size) / LEVELS;
	if (p < 4)
		p = 4;
	size_t step = (size_t)1 << p, mask = step - 1;
	float acc[LEVELS][ILP][TORCH_LANES];
	memset(acc, 0, sizeof acc);
	size_t i = 0;
	while (i + step <= size) {
		for (size_t j = 0; j < step; j++, i++)
			for (int k = 0; k < ILP; k++)
				for (int l = 0; l < w; l++)
					acc[0][k][l] += x[(i * ILP + k) * w + l];
		for (int j = 1; j < LEVELS; j++) {
			for (int k = 0; k < ILP; k++)
				for (int l = 0; l < w; l++) {
					acc[j][k][l] += acc[j - 1][k][l];
					acc[j - 1][k][l] = 0;
				}
			if (i & (mask << (j * p)))
				break;
		}
	}
	for (; i < size; i++)
		for (int k = 0; k < ILP; k++)
			for (int l = 0; l < w; l++)
				acc[0][k][l] += x[(i * ILP + k) * w + l];
	for (int j = 1; j < LEVELS; j++)
		for (int k = 0; k < ILP; k++)
			for (int l = 0; l < w; l++)
				acc[0][k][l] += acc[j][k][l];
	for (size_t r = size * ILP; r < items; r++) /* the items past the last full row */
		for (int l = 0; l < w; l++)
			acc[0][0][l] += x[r * w + l];
	for (int k = 1; k < ILP; k++)
		for (int l = 0; l < w; l++)
			acc[0][0][l] += acc[0][k][l];
	memcpy(out, acc[0][0], (size_t)w * sizeof(float));
}

/* one loop's sum of a contiguous row of n floats */
static float torch_loop_sum(const float *a, size_t n)
{
	float s;
	if (n < TORCH_LANES) {
		torch_row_sum(a, n, 1, &s);
	} else {
		size_t nv = n / TORCH_LANES;
		float lanes[TORCH_LANES];
		torch_row_sum(a, nv, TORCH_LANES, lanes);
		s = 0;
		for (size_t k = nv * TORCH_LANES; k < n; k++)
			s += a[k];
		for (int l = 0; l < TORCH_LANES; l++)
			s += lanes[l];
	}
	return s;
}

float bk_q4_torch_mean(const float *a, size_t n, int threads)
{
	if (n < TORCH_GRAIN || threads <= 1)
		return (0.0f + torch_loop_sum(a, n)) / (float)n;
	size_t t = (size_t)threads, chunks = (n + TORCH_GRAIN - 1) / TORCH_GRAIN;
	size_t k = chunks < t ? chunks : t, len = (n + k - 1) / k;
	float *slot = xcalloc(t, sizeof(float));
	for (size_t i = 0; i * len < n; i++)
		slot[i] += torch_loop_sum(a + i * len, n - i * len < len ? n - i * len : len);
	float s = 0.0f + torch_loop_sum(slot, t);
	free(slot);
	return s / (float)n;
}

/* A physical core counts once: a CPU whose first hyperthread sibling (sysfs) is new. */
static int physical_cores(const cpu_set_t *cpus)
{
	cpu_set_t seen;
	CPU_ZERO(&seen);
	int cores = 0;
	for (int c = 0; c < CPU_SETSIZE; c++) {
		if (!CPU_ISSET(c, cpus))
			continue;
		char path[96];
		int first = c;
		snprintf(path, sizeof path,
			 "/sys/devices/system/cpu/cpu%d/topology/thread_siblings_list", c);
		FILE *f = fopen(path, "r");
		if (f) {
			if (fscanf(f, "%d", &first) != 1 || first < 0 || first >= CPU_SETSIZE)
				first = c;
			fclose(f);
		}
		if (!CPU_ISSET(first, &seen))
			cores++;
		CPU_SET(first, &seen);
	}
	return cores > 0 ? cores : 1;
}

/* a positive leading count ("4", "4,2"), else 0 */
static int env_threads(const char *name)
{
	const char *v = getenv(name);
	char *end;
	long n = v ? strtol(v, &end, 10) : 0;
	return n > 0 && n <= 1 << 20 && (*end == 0 || *end == ',') ? (int)n : 0;
}

int bk_q4_torch_threads(void)
{
	cpu_set_t cpus;
	int n = env_threads("MKL_NUM_THREADS");
	if (!n)
		n = env_threads("OMP_NUM_THREADS");
	if (!n) {
		if (sched_getaffinity(0, sizeof cpus, &cpus))
			return 1;
		return physical_cores(&cpus);
	}
	const char *dyn = getenv("MKL_DYNAMIC");
	if (dyn && !strcasecmp(dyn, "false"))
		return n;
	CPU_ZERO(&cpus);
	long all = sysconf(_SC_NPROCESSORS_ONLN);
	for (long c = 0; c < all && c < CPU_SETSIZE; c++)
		CPU_SET((int)c, &cpus);
	int cores = physical_cores(&cpus);
	return n < cores ? n : cores;
}

static int torch_threads;
static pthread_once_t threads_once = PTHREAD_ONCE_INIT;
static void get_torch_threads(void) { torch_threads = bk_q4_torch_threads(); }

/* bitsandbytes' 8-bit block-wise quantisation on the CPU (0.50.2's quantize_cpu_impl,
 * fp32 input, blocks of 256, fp32 absmax = max |x|): v = x * (1 / absmax) (the
 * reciprocal: dividing gives another code for a few values, tests/ref/make_q8_golden.py)
 * is looked up in a table of 65536 points of [-1,1]: the point
 * idx = (int)(((v + 1) * 0.5) * 65535 + 0.5) (bnb's build fuses the last multiply-add,
 * which gives the same idx for every fp32 (v + 1) * 0.5: within a binade adding 0.5
 * commutes with the rounding), and the table maps idx to the first code whose
 * midpoint with the next, in fp32, is not below the fp32 2 * idx / 65535 - 1.  An
 * all-zero block takes code 0, as bnb's does. */
static uint8_t q8_lut[65536];
static pthread_once_t lut_once = PTHREAD_ONCE_INIT;

static void make_lut(void)
{
	const float *map = bk_q8_map(1);
	int c = 0;
	for (int i = 0; i < 65536; i++) {
		float val = 2.0f * (float)i / 65535.0f - 1.0f;
		while (c < 255 && val > (map[c] + map[c + 1]) * 0.5f)
			c++;
		q8_lut[i] = (uint8_t)c;
	}
}

void bk_q4_q8_blockwise(const float *x, size_t n, uint8_t *q, float *absmax)
{
	pthread_once(&lut_once, make_lut);
	for (size_t b = 0; b * BK_Q4_BLOCK2 < n; b++) {
		size_t i0 = b * BK_Q4_BLOCK2, i1 = i0 + BK_Q4_BLOCK2 < n ? i0 + BK_Q4_BLOCK2 : n;
		float a = 0;
		for (size_t i = i0; i < i1; i++)
			a = fmaxf(a, fabsf(x[i]));
		absmax[b] = a;
		float inv = 1.0f / a;
		for (size_t i = i0; i < i1; i++) {
			if (!(a > 0)) {
				q[i] = 0;
				continue;
			}
			float v = clamp1(x[i] * inv);
			float t = ((v + 1.0f) * 0.5f) * 65535.0f + 0.5f;
			q[i] = q8_lut[(int)t];
		}
	}
}

void bk_q4_quantize(bk_q4 *q, const float *w, int rows, int cols, int type, int double_quant,
		    int threads)
{
	init_books();
	bk_q4_shape(q, rows, cols, type, double_quant);
	q->packed = xcalloc((q->n + 1) / 2, 1);
	float *absmax = xmalloc(q->nb * sizeof(float));
	const float tiny = (float)1e-38;
	size_t full = q->n / BK_Q4_BLOCK;
	for (size_t b = 0; b < q->nb; b++) {
		size_t i0 = b * BK_Q4_BLOCK, i1 = i0 + BK_Q4_BLOCK < q->n ? i0 + BK_Q4_BLOCK : q->n;
		float a = 0;
		for (size_t i = i0; i < i1; i++)
			a = fmaxf(a, fabsf(w[i]));
		float am = a < tiny ? tiny : a; /* clamp(min=1e-38) */
		float recip = 1.0f / am;
		absmax[b] = b < full ? a : am;
		for (size_t i = i0; i < i1; i++) {
			float s = clamp1(b < full ? w[i] * recip : w[i] / am);
			uint8_t c = encode(type, s);
			q->packed[i / 2] |= (uint8_t)(i % 2 ? c : c << 4);
		}
	}
	if (q->n % 2) /* the pad value 0.0 */
		q->packed[q->n / 2] |= encode(type, 0.0f);
	if (!double_quant) {
		q->absmax = absmax;
		return;
	}
	if (threads <= 0) {
		pthread_once(&threads_once, get_torch_threads);
		threads = torch_threads;
	}
	q->offset = bk_q4_torch_mean(absmax, q->nb, threads);
	for (size_t b = 0; b < q->nb; b++)
		absmax[b] -= q->offset;
	q->qabsmax = xmalloc(q->nb);
	q->absmax2 = xmalloc(q->nb2 * sizeof(float));
	bk_q4_q8_blockwise(absmax, q->nb, q->qabsmax, q->absmax2);
	free(absmax);
}

void bk_q4_shape(bk_q4 *q, int rows, int cols, int type, int double_quant)
{
	if ((type != BK_Q4_NF4 && type != BK_Q4_FP4) || rows <= 0 || cols <= 0)
		BUG("bk_q4_shape: type %d, %d x %d", type, rows, cols);
	memset(q, 0, sizeof(*q));
	q->type = type;
	q->rows = rows;
	q->cols = cols;
	q->n = (size_t)rows * (size_t)cols;
	q->nb = (q->n + BK_Q4_BLOCK - 1) / BK_Q4_BLOCK;
	q->nb2 = double_quant ? (q->nb + BK_Q4_BLOCK2 - 1) / BK_Q4_BLOCK2 : 0;
}

void bk_q4_free(bk_q4 *q)
{
	if (!q)
		return;
	free(q->packed);
	free(q->absmax);
	free(q->qabsmax);
	free(q->absmax2);
	memset(q, 0, sizeof(*q));
}

void bk_q4_block_absmax(const bk_q4 *q, float *absmax)
{
	if (!q->qabsmax) {
		memcpy(absmax, q->absmax, q->nb * sizeof(float));
		return;
	}
	const float *map = bk_q8_map(1);
	for (size_t b = 0; b < q->nb; b++) {
		float a = map[q->qabsmax[b]] * q->absmax2[b / BK_Q4_BLOCK2];
		absmax[b] = a + q->offset;
	}
}

void bk_q4_dequantize(const bk_q4 *q, float *out, int round_bf16)
{
	const float *code = bk_q4_code(q->type);
	float *am = xmalloc(q->nb * sizeof(float));
	bk_q4_block_absmax(q, am);
	for (size_t i = 0; i < q->n; i++) {
		uint8_t byte = q->packed[i / 2];
		float v = code[i % 2 ? byte & 15 : byte >> 4] * am[i / BK_Q4_BLOCK];
		out[i] = round_bf16 ? bk_q4_bf16_round(v) : v;
	}
	free(am);
}

size_t bk_q4_bytes(size_t rows, size_t cols, int double_quant)
{
	size_t n = rows * cols, nb = (n + BK_Q4_BLOCK - 1) / BK_Q4_BLOCK;
	if (!double_quant)
		return (n + 1) / 2 + nb * sizeof(float);
	size_t nb2 = (nb + BK_Q4_BLOCK2 - 1) / BK_Q4_BLOCK2;
	return (n + 1) / 2 + nb + nb2 * sizeof(float) + sizeof(float);
}

bk_q4_config bk_q4_flags_config(const bk_q4_flags *f)
{
	bk_q4_config c = {0};
	static const char *const dep[] = {"bnb-4bit-quant-type", "bnb-4bit-use-double-quant",
					  "bnb-4bit-compute-dtype"};
	if (!f->load) {
		for (int i = 0; i < 3; i++)
			if (bk_flag_given(dep[i]))
				die_usage("--%s needs --load-in-4bit", dep[i]);
		return c;
	}
	c.type = bk_q4_parse(f->type);
	if (c.type < 0)
		die_usage("--bnb-4bit-quant-type: '%s' is not nf4 or fp4", f->type);
	c.double_quant = f->double_quant != 0;
	if (!strcmp(f->dtype, "bfloat16"))
		c.compute_bf16 = 1;
	else if (strcmp(f->dtype, "float32"))
		die_usage("--bnb-4bit-compute-dtype: '%s' is not bfloat16 or float32", f->dtype);
	return c;
}

const char *bk_q4_config_str(const bk_q4_config *c)
{
	static char buf[64];
	if (!c->type)
		return "no";
	snprintf(buf, sizeof buf, "%s,%s%s", bk_q4_name(c->type),
		 c->double_quant ? "double-quant," : "", c->compute_bf16 ? "bfloat16" : "float32");
	return buf;
}

int bk_q4_config_threads(const bk_q4_config *c)
{
	if (!c->type || !c->double_quant)
		return 0;
	if (c->threads > 0)
		return c->threads;
	pthread_once(&threads_once, get_torch_threads);
	return torch_threads;
}
