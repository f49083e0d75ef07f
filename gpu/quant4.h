/* quant4.h - 4-bit block-wise weights as bitsandbytes stores a Linear4bit (QLoRA,
 * Dettmers et al. 2023, arXiv:2305.14314): quantisation, double quantisation of the
 * statistics and dequantisation, bit for bit those of bitsandbytes 0.50
 * (bitsandbytes.functional.quantize_4bit / dequantize_4bit on the CPU; golden test:
 * tests/unit/test_quant4.c against tests/ref/make_nf4_golden.py's fixtures).  Not a
 * kernel (gpu/ computes with these weights) and not a file format of its own.
 *
 * The rules (a weight of n = rows*cols values, flattened row-major):
 *   - blocks of 64 consecutive values (the last one may be short); each keeps an fp32
 *     absmax = max |x| over the block (an all-zero final partial block: (float)1e-38);
 *   - a value is scaled into [-1,1] in fp32: a full block multiplies by 1.0f / absmax
 *     (absmax clamped to >= (float)1e-38, so an all-zero block scales to 0), the final
 *     partial block divides by its absmax; the result is clamped to [-1,1];
 *   - the 4-bit code is the code-book entry nearest the scaled value, found as torch's
 *     bucketize over the midpoints of the sorted code book: the count of midpoints
 *     strictly below the value, so a value on a midpoint takes the lower entry.  NF4's
 *     book is sorted; FP4's is not, and the sorted position maps back to its index by
 *     bnb's argsort order (both zeros: values <= the 0 midpoint take index 0, small
 *     positives index 8, which is +0 too);
 *   - two codes a byte, the first value in the HIGH nibble; an odd n is padded with 0.0;
 *   - double quantisation (bnb_4bit_use_double_quant): offset = torch.mean of the
 *     absmaxes (torch's CPU fp32 sum, emulated: bk_q4_torch_mean; above 32768 blocks,
 *     a weight of more than 2M values, its bits depend on torch's thread count,
 *     taken as torch's default: bk_q4_torch_threads), then the absmaxes minus
 *     offset are 8-bit block-wise quantised in blocks of 256 with the signed dynamic map
 *     (gpu/optim8.h's bk_q8_map(1)) as bnb's CPU kernel does: per nested block an fp32
 *     absmax2 = max |a|, and a * (1 / absmax2) looked up in a 65536-point table
 *     (bk_q4_q8_blockwise);
 *   - dequantisation: absmax_b = code2[q8_b] * absmax2[b/256] + offset (two fp32
 *     roundings) when nested; value = code[q] * absmax_b in fp32, then rounded to the
 *     output dtype (bf16: nearest even). */
#ifndef BK_QUANT4_H
#define BK_QUANT4_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { BK_Q4_NONE = 0, BK_Q4_NF4 = 1, BK_Q4_FP4 = 2 };
#define BK_Q4_BLOCK 64   /* values per block (quantize_4bit's default) */
#define BK_Q4_BLOCK2 256 /* absmaxes per nested block (double quantisation) */

/* The 4-bit setting of a model (BitsAndBytesConfig's fields that matter here). */
typedef struct bk_q4_config {
	int type;         /* BK_Q4_NONE (full precision), BK_Q4_NF4 or BK_Q4_FP4 */
	int double_quant; /* bnb_4bit_use_double_quant */
	int compute_bf16; /* bnb_4bit_compute_dtype bfloat16, which the tool ties to its
			   * torch_dtype: transformers loads the weights in bf16 (an fp32
			   * checkpoint's values rounded) before bitsandbytes quantises them,
			   * and dequantises them to bf16 values; else float32 for both */
	int threads;      /* with double_quant: the torch thread count the absmax mean
			   * assumes (bk_q4_torch_mean); 0: this machine's
			   * (bk_q4_torch_threads).  Not part of bk_q4_config_str: a stage
			   * records it beside it (gpu/load.h bk_q4_adopt_stream) */
} bk_q4_config;

/* The tools' 4-bit flags (bk-gen, bk-teach, bk-step, bk-eval), named after
 * BitsAndBytesConfig's fields: --load-in-4bit (load), --bnb-4bit-quant-type (type),
 * --bnb-4bit-use-double-quant 0..1 (double_quant), --bnb-4bit-compute-dtype (dtype) in
 * the tool's bk_opt table, BK_Q4_USAGE in its usage text; bk_q4_flags_config after
 * parsing. */
typedef struct {
	int load;          /* --load-in-4bit */
	const char *type;  /* --bnb-4bit-quant-type nf4|fp4 */
	long double_quant; /* --bnb-4bit-use-double-quant 1|0 */
	const char *dtype; /* --bnb-4bit-compute-dtype bfloat16|float32 */
} bk_q4_flags;
#define BK_Q4_FLAGS_INIT {0, "nf4", 1, "bfloat16"}
#define BK_Q4_USAGE                                                                       \
	"  --load-in-4bit       QLoRA: the base model's decoder linears (q/k/v/o, gate/up/down)\n" \
	"                       in 4 bits, quantised at load as bitsandbytes does\n"          \
	"  --bnb-4bit-quant-type T       nf4 (default) or fp4\n"                               \
	"  --bnb-4bit-use-double-quant N 1 (default): block absmaxes in 8 bits too; 0: fp32\n"  \
	"  --bnb-4bit-compute-dtype D    bfloat16 (default) or float32 (the tool's torch_dtype)\n"
/* the config of the flags (type BK_Q4_NONE without --load-in-4bit); a bad value, or a
 * --bnb-4bit-* flag without --load-in-4bit, is a usage error */
bk_q4_config bk_q4_flags_config(const bk_q4_flags *f);
/* "no" or e.g. "nf4,double-quant,bfloat16" (static storage) */
const char *bk_q4_config_str(const bk_q4_config *c);
/* the torch thread count c quantises with: 0 without double quantisation, else
 * c->threads, or this machine's when that is 0 */
int bk_q4_config_threads(const bk_q4_config *c);

/* One quantised weight [rows, cols]. */
typedef struct bk_q4 {
	int type;          /* BK_Q4_NF4 or BK_Q4_FP4 */
	int rows, cols;
	size_t n;          /* rows * cols */
	size_t nb, nb2;    /* blocks of 64; nested blocks of 256 (0 without double quant) */
	uint8_t *packed;   /* [(n+1)/2] */
	float *absmax;     /* [nb] fp32 absmax; NULL with double quant */
	uint8_t *qabsmax;  /* [nb] 8-bit absmax codes (double quant), else NULL */
	float *absmax2;    /* [nb2] (double quant) */
	float offset;      /* (double quant) */
} bk_q4;

/* "nf4", "fp4" -> BK_Q4_NF4 / BK_Q4_FP4; else -1 */
int bk_q4_parse(const char *name);
const char *bk_q4_name(int type); /* "nf4", "fp4", "none" */
/* the 16 fp32 code-book values of a type, by 4-bit code */
const float *bk_q4_code(int type);
/* the signed dynamic map of the nested absmax codes [256] */
const float *bk_q4_code2(void);

/* Quantises w [rows, cols] (fp32 values; a bf16 checkpoint's values are exact in fp32
 * and quantise as bnb quantises the bf16 tensor).  Fills *q (allocations its own).
 * threads: double quantisation's torch thread count (bk_q4_torch_mean); <= 0: this
 * machine's (bk_q4_torch_threads). */
void bk_q4_quantize(bk_q4 *q, const float *w, int rows, int cols, int type, int double_quant,
		    int threads);
void bk_q4_free(bk_q4 *q);
/* *q with the shape of such a weight only (type, rows, cols, n, nb, nb2) and no numbers:
 * for a placement that reads none (gpu/load.c: the shared copy's layout, or attaching
 * a copy another process quantised) */
void bk_q4_shape(bk_q4 *q, int rows, int cols, int type, int double_quant);
/* the per-block absmax that dequantisation applies [nb] (nested: dequantised) */
void bk_q4_block_absmax(const bk_q4 *q, float *absmax);
/* out [rows, cols] = the dequantised weight in fp32; round_bf16: rounded to bf16
 * values (nearest even), as dequantize_4bit(..., bfloat16) */
void bk_q4_dequantize(const bk_q4 *q, float *out, int round_bf16);
/* bytes a device stores for a quantised [rows, cols] weight: the packed codes plus the
 * statistics (fp32 absmax per block; double quant: a byte per block, an fp32 absmax2
 * per nested block and the offset) */
size_t bk_q4_bytes(size_t rows, size_t cols, int double_quant);

/* torch.mean of n contiguous fp32 values on the CPU as torch 2.15 computes it with
 * `threads` threads (torch.get_num_threads()): below 32768 values, or with one thread,
 * one cascade sum; else the sum split into min(threads, ceil(n / 32768)) chunks whose
 * sums are then summed (quant4.c).  Then divided by n in fp32. */
float bk_q4_torch_mean(const float *a, size_t n, int threads);
/* bitsandbytes' quantize_blockwise on the CPU with the signed dynamic map, blocks of
 * 256 (the nested statistics of double quantisation): q [n] codes, absmax
 * [ceil(n / 256)] */
void bk_q4_q8_blockwise(const float *x, size_t n, uint8_t *q, float *absmax);
/* the thread count torch starts with on this machine, as its x86-64 wheel (OpenMP
 * sized by MKL) picks it: MKL_NUM_THREADS, else OMP_NUM_THREADS (a positive leading
 * count), capped at the machine's physical cores unless MKL_DYNAMIC is false; neither
 * set: the physical cores of this process's CPU affinity.  bk_q4_quantize uses it unless
 * told another count. */
int bk_q4_torch_threads(void);

/* fp32 x rounded to bf16 (nearest even; NaN stays NaN), as its bits / as a float */
uint16_t bk_q4_bf16_bits(float x);
float bk_q4_bf16_round(float x);

#ifdef __cplusplus
}
#endif

#endif
