/* optim8.h - the optimizer ops' shared rules: the AdamW scalars and per-element update
 * that every implementation (host twin, CUDA) uses, and 8-bit AdamW: block-wise
 * quantised moments with the bitsandbytes dynamic map, and its host twin update.
 * Not the host AdamW object of gpu/optim.h (the torch-golden reference these rules
 * equal bit for bit) and not a CUDA kernel (gpu/cuda/cuda_optim.cu copies these rules).
 *
 * 8-bit state (bitsandbytes' blockwise 8-bit Adam, Dettmers et al. 2022, "8-bit
 * Optimizers via Block-wise Quantization", arXiv:2110.02861):
 *   - a tensor of n moments is cut into blocks of `block` consecutive values (256 or
 *     2048; the last block may be short); each block keeps one fp32 absmax and one
 *     uint8 code per value: value = map[code] * absmax;
 *   - the map is bitsandbytes' create_dynamic_map(signed, max_exponent_bits = 7,
 *     total_bits = 8) (bitsandbytes/functional.py): 256 codes sorted ascending.  For
 *     exponent e = 0..6 the decade [0.1, 1] * 10^(e-6) is cut by linspace(0.1, 1, k+1)
 *     into k intervals whose midpoints are codes; signed (first moment m): k = 2^e, each
 *     midpoint with both signs, plus 0 and 1.0 (codes span [-0.993, 1]); unsigned
 *     (second moment v): k = 2^(e+1), plus 0 and 1.0.  The floats are computed in
 *     float32 the way torch evaluates that Python (linspace with FMA), so both maps
 *     equal bitsandbytes' bit for bit (checked against torch when written);
 *   - encoding x = value / absmax (|x| <= 1) takes the nearest code (a tie takes the
 *     lower one); for m, as bitsandbytes, a nonzero x whose nearest code has the other
 *     sign moves one code towards x (a small negative m never becomes +0);
 *   - one update (bitsandbytes' kOptimizerStatic8bit2StateBlockwise): dequantise m and
 *     v with the block's old absmax, update them in fp32 exactly as fp32 AdamW does,
 *     update the parameter with these fp32 moments, then take the block's new absmax
 *     (max |m|, max v) and requantise.  Unlike bitsandbytes the weight decay, bias
 *     correction and eps are torch AdamW's (bk_adamw_elem below), and small tensors are
 *     quantised too (bitsandbytes keeps tensors under 4096 values in fp32).
 * Everything is a pure function of its inputs in IEEE float arithmetic without
 * contraction, so the CUDA version (written with __f*_rn intrinsics) gives the same
 * bits. */
#ifndef BK_OPTIM8_H
#define BK_OPTIM8_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { BK_OPTIM_ADAMW, BK_OPTIM_ADAMW8BIT } bk_optim_kind;

/* "adamw", "adamw8bit" -> 0; unknown -> -1 */
int bk_optim_parse(const char *name, bk_optim_kind *kind);
const char *bk_optim_name(bk_optim_kind kind);

#define BK_Q8_BLOCK 256 /* default 8-bit block; 2048 is the other size allowed */

/* AdamW's float scalars of one update, derived in double from the hyper-parameters
 * exactly as bk_adamw_step (gpu/optim.c) derives them. */
typedef struct {
	float decay;    /* 1 - lr*wd */
	float w1;       /* 1 - beta1 */
	float b2, w2;   /* beta2, 1 - beta2 */
	float neg_step; /* -lr / (1 - beta1^step) */
	float bc2s;     /* sqrt(1 - beta2^step) */
	float eps;
	int do_decay;   /* wd != 0 */
} bk_adamw_scalars;

void bk_adamw_scalars_make(bk_adamw_scalars *s, double lr, double beta1, double beta2,
			   double eps, double weight_decay, int64_t step);

/* One element of torch AdamW: *p, *m, *v updated from g (bk_adamw_step's loop body). */
static inline void bk_adamw_elem(const bk_adamw_scalars *s, float *p, float *m, float *v,
				 float g)
{
	float pi = *p;
	if (s->do_decay)
		pi *= s->decay;
	float mi = *m + s->w1 * (g - *m); /* torch lerp_, weight < 0.5 */
	float vi = *v * s->b2 + s->w2 * g * g;
	float denom = sqrtf(vi) / s->bc2s + s->eps;
	*p = pi + s->neg_step * (mi / denom);
	*m = mi;
	*v = vi;
}

/* ---- block-wise 8-bit quantisation ---- */

/* The dynamic map: 256 codes sorted ascending (is_signed: for m; else for v). */
const float *bk_q8_map(int is_signed);
/* Code of x (a value divided by its block's absmax, |x| <= 1) under the rules above. */
uint8_t bk_q8_encode(const float *map /* [256] */, int is_signed, float x);
/* Blocks of a tensor of n values: ceil(n / block).  block must be 256 or 2048. */
size_t bk_q8_blocks(size_t n, int block);
void bk_q8_quantize(const float *x /* [n] */, size_t n, int block, int is_signed,
		    uint8_t *q /* [n] */, float *absmax /* [blocks] */);
void bk_q8_dequantize(const uint8_t *q /* [n] */, const float *absmax /* [blocks] */,
		      size_t n, int block, int is_signed, float *x /* [n] */);

/* One 8-bit AdamW update of a tensor of n values (host twin of ops->adamw8_step):
 * qm/qv and absmax_m/absmax_v are its 8-bit m and v (before the first update: absmax 0,
 * which makes every code 0); step is the update's 1-based count. */
void bk_adamw8_update(float *param /* [n] */, const float *grad /* [n] */,
		      uint8_t *qm /* [n] */, uint8_t *qv /* [n] */,
		      float *absmax_m /* [blocks] */, float *absmax_v /* [blocks] */, size_t n,
		      int block, double lr, double beta1, double beta2, double eps,
		      double weight_decay, int64_t step);

#ifdef __cplusplus
}
#endif

#endif
