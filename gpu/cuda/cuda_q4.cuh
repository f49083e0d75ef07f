// cuda_q4.cuh - 4-bit base linears on the GPU (ops->weight_upload_q4, QLoRA): the weight
// stays on the device as bitsandbytes stores it (gpu/quant4.h: two NF4/FP4 codes a byte,
// an fp32 absmax per block of 64, or with double quantisation a byte per block, an fp32
// absmax2 per 256 blocks and the offset), 0.5 byte a weight plus the statistics.  A GEMM
// that needs it gets it dequantised to bf16 into one reusable scratch, just before the
// GEMM on the one stream (bk_cuda_weight_bf16): never a bf16 copy of the model, one
// linear at a time (the scratch is the largest linear's).  Every value is
// code[q] * absmax in fp32 rounded to bf16, as the host twin's compute dtype bf16
// (bk_q4_dequantize(q, out, 1)), so the CUDA GEMMs see the host twin's weights exactly.
// The codes and statistics of a linear are one piece when placed in the one shared copy
// of the weights (cuda_vmm.h; gpu/load.c), each its own allocation otherwise; the scratch
// and the nested absmax map are each process's.  Included by cuda_ops.cu (its allocator
// and placement).  The decode linears (cuda_gen.cu, up to 64
// rows) do not use the scratch: they read the 4 bits and the statistics themselves
// (cuda_wsrc.cuh, through bk_cuda_q4_view), computing the same values.
#ifndef BK_CUDA_Q4_CUH
#define BK_CUDA_Q4_CUH

#include "gpu/cuda/cuda_wsrc.cuh" // q4_book, q4_wview

typedef struct {
	int type;
	size_t n, nb;
	uint8_t *packed;  // [(n+1)/2]
	float *absmax;    // [nb] (no double quant) or NULL
	uint8_t *qabsmax; // [nb] (double quant) or NULL
	float *absmax2;   // [nb2]
	float offset;
	q4_book book;
} cuda_q4;

static float *g_q4_code2;           // the nested absmax map [256] on the device
static __nv_bfloat16 *g_q4_scratch; // one dequantised linear
static size_t g_q4_scratch_n;

// one byte (two values) per thread: out[2i], out[2i+1] from packed[i]; the block's absmax
// from its fp32 value or its nested code
__global__ void q4_dequant_kernel(__nv_bfloat16 *out, const uint8_t *packed, const float *absmax,
				  const uint8_t *qabsmax, const float *absmax2,
				  const float *code2, float offset, q4_book book, size_t n)
{
	size_t nbytes = (n + 1) / 2;
	for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < nbytes;
	     i += (size_t)gridDim.x * blockDim.x) {
		uint8_t b = packed[i];
		size_t e = 2 * i, blk = e / BK_Q4_BLOCK; // both values of a byte share a block
		float a;
		if (qabsmax) {
			float t = __fmul_rn(code2[qabsmax[blk]], absmax2[blk / BK_Q4_BLOCK2]);
			a = __fadd_rn(t, offset);
		} else {
			a = absmax[blk];
		}
		out[e] = __float2bfloat16_rn(__fmul_rn(book.c[b >> 4], a));
		if (e + 1 < n)
			out[e + 1] = __float2bfloat16_rn(__fmul_rn(book.c[b & 15], a));
	}
}

// One linear's storage as one piece (the shared copy places it so: cuda_vmm.h): the
// packed codes at 0, then (double quant) the absmax codes, the absmax2s and the offset,
// or the fp32 absmaxes, each part at a 256-byte boundary.  The offset is on the device
// too, so that a process attaching another's copy reads it there (it is the data's).
typedef struct {
	size_t qabsmax, absmax2, offset, absmax, bytes;
} q4_parts;

static size_t q4_align(size_t off) { return (off + 255) & ~(size_t)255; }

static q4_parts q4_parts_of(const bk_q4 *q)
{
	q4_parts p = { 0, 0, 0, 0, 0 };
	size_t at = q4_align((q->n + 1) / 2);
	if (q->nb2) { // double quant (bk_q4's nb2 is 0 without)
		p.qabsmax = at;
		p.absmax2 = q4_align(p.qabsmax + q->nb);
		p.offset = q4_align(p.absmax2 + q->nb2 * sizeof(float));
		p.bytes = p.offset + sizeof(float);
	} else {
		p.absmax = at;
		p.bytes = p.absmax + q->nb * sizeof(float);
	}
	return p;
}

// bk_wdesc's kind of a 4-bit linear: its type and double quant (the share key says the
// same; a layout of another setting is another layout)
static int32_t q4_kind(const bk_q4 *q)
{
	return BK_WDESC_Q4 | q->type << 4 | (q->nb2 ? 1 : 0) << 8;
}

// the parts' device addresses from base (the piece), or each its own allocation
static void q4_point(cuda_q4 *d, const bk_q4 *q, char *base)
{
	size_t pb = (q->n + 1) / 2;
	if (base) {
		q4_parts p = q4_parts_of(q);
		d->packed = (uint8_t *)base;
		if (q->nb2) {
			d->qabsmax = (uint8_t *)(base + p.qabsmax);
			d->absmax2 = (float *)(base + p.absmax2);
		} else {
			d->absmax = (float *)(base + p.absmax);
		}
		return;
	}
	d->packed = (uint8_t *)bk_cuda_dev_alloc(pb, "4-bit weights");
	if (q->nb2) {
		d->qabsmax = (uint8_t *)bk_cuda_dev_alloc(q->nb, "4-bit weights");
		d->absmax2 = (float *)bk_cuda_dev_alloc(q->nb2 * sizeof(float), "4-bit weights");
	} else {
		d->absmax = (float *)bk_cuda_dev_alloc(q->nb * sizeof(float), "4-bit weights");
	}
}

// q's numbers to d's storage (the offset too when it has a place: base)
static void q4_copy_in(cuda_q4 *d, const bk_q4 *q, char *base)
{
	CUDA_CHECK(cudaMemcpy(d->packed, q->packed, (q->n + 1) / 2, cudaMemcpyHostToDevice));
	if (q->nb2) {
		CUDA_CHECK(cudaMemcpy(d->qabsmax, q->qabsmax, q->nb, cudaMemcpyHostToDevice));
		CUDA_CHECK(cudaMemcpy(d->absmax2, q->absmax2, q->nb2 * sizeof(float),
				      cudaMemcpyHostToDevice));
		if (base)
			CUDA_CHECK(cudaMemcpy(base + q4_parts_of(q).offset, &q->offset, sizeof(float),
					      cudaMemcpyHostToDevice));
	} else {
		CUDA_CHECK(cudaMemcpy(d->absmax, q->absmax, q->nb * sizeof(float),
				      cudaMemcpyHostToDevice));
	}
}

// Placement (g_wmode, cuda_vmm.h) as cuda_weight_upload: OWN, each part its own
// allocation; MEASURE, nothing (q may be its shape only: bk_q4_shape); UPLOAD, q's
// numbers into the arena; ATTACH, nothing read but the offset another process wrote.
// The nested absmax map and the dequantisation scratch are this process's either way.
static bk_weight *cuda_weight_upload_q4(const bk_q4 *q, int compute_bf16)
{
	(void)compute_bf16; // the GPU's GEMMs are bf16 either way (man/bk-step.1)
	cuda_init();
	cuda_q4 *d = (cuda_q4 *)calloc(1, sizeof(*d));
	bk_weight *w = (bk_weight *)calloc(1, sizeof(*w));
	if (!d || !w)
		die("out of memory allocating a 4-bit weight handle");
	d->type = q->type;
	d->n = q->n;
	d->nb = q->nb;
	d->offset = q->offset;
	memcpy(d->book.c, bk_q4_code(q->type), sizeof d->book.c);
	w->rows = q->rows;
	w->cols = q->cols;
	w->kind = BK_WEIGHT_Q4;
	w->data = d;
	char *base = NULL;
	if (g_wmode != BK_WPLACE_OWN) {
		base = wplace_take(q->rows, q->cols, q4_kind(q), q4_parts_of(q).bytes);
		if (g_wmode == BK_WPLACE_MEASURE)
			return w; // the layout only: no storage, nothing read
	}
	q4_point(d, q, base);
	if (g_wmode == BK_WPLACE_ATTACH) {
		if (q->nb2)
			CUDA_CHECK(cudaMemcpy(&d->offset, base + q4_parts_of(q).offset, sizeof(float),
					      cudaMemcpyDeviceToHost));
	} else {
		q4_copy_in(d, q, base);
	}
	if (q->nb2 && !g_q4_code2) {
		g_q4_code2 = (float *)bk_cuda_dev_alloc(256 * sizeof(float), "4-bit weights");
		CUDA_CHECK(cudaMemcpy(g_q4_code2, bk_q4_code2(), 256 * sizeof(float),
				      cudaMemcpyHostToDevice));
	}
	if (q->n > g_q4_scratch_n) { // at load, before any GEMM reads it
		CUDA_CHECK(cudaStreamSynchronize(g_stream));
		bk_cuda_dev_free(g_q4_scratch);
		g_q4_scratch = (__nv_bfloat16 *)bk_cuda_dev_alloc(q->n * sizeof(__nv_bfloat16),
								  "4-bit dequantisation scratch");
		g_q4_scratch_n = q->n;
	}
	return w;
}

// a placed linear (in an arena, or measured: no storage) is freed with its arena
static void cuda_q4_free(bk_weight *w)
{
	cuda_q4 *d = (cuda_q4 *)w->data;
	int placed;
	{
		std::lock_guard<std::mutex> lk(g_mem_mu);
		placed = !d->packed || arena_of(d->packed);
	}
	if (!placed) {
		bk_cuda_dev_free(d->packed);
		bk_cuda_dev_free(d->absmax);
		bk_cuda_dev_free(d->qabsmax);
		bk_cuda_dev_free(d->absmax2);
	}
	free(d);
	free(w);
}

extern "C" int bk_cuda_q4_view(const bk_weight *w, q4_wview *v)
{
	if (w->kind != BK_WEIGHT_Q4)
		return 0;
	const cuda_q4 *d = (const cuda_q4 *)w->data;
	v->packed = d->packed;
	v->absmax = d->absmax;
	v->qabsmax = d->qabsmax;
	v->absmax2 = d->absmax2;
	v->code2 = g_q4_code2;
	v->offset = d->offset;
	v->book = d->book;
	return 1;
}

// The weight as bf16 [rows, cols] for the next GEMM on the stream: a plain weight's own
// storage; a 4-bit one dequantised into the scratch, valid until the next 4-bit weight
// is asked for (the callers take one weight per GEMM, in stream order).
extern "C" const __nv_bfloat16 *bk_cuda_weight_bf16(const bk_weight *w)
{
	if (w->kind != BK_WEIGHT_Q4)
		return (const __nv_bfloat16 *)w->data;
	const cuda_q4 *d = (const cuda_q4 *)w->data;
	if (d->n > g_q4_scratch_n)
		CUDA_BUG("4-bit weight of %zu values, scratch %zu", d->n, g_q4_scratch_n);
	size_t nbytes = (d->n + 1) / 2;
	unsigned blocks = (unsigned)((nbytes + 255) / 256 < 65535 ? (nbytes + 255) / 256 : 65535);
	BK_LAUNCH(q4_dequant_kernel, blocks, 256, 0, g_stream, g_q4_scratch, d->packed, d->absmax,
		  d->qabsmax, d->absmax2, g_q4_code2, d->offset, d->book, d->n);
	return g_q4_scratch;
}

#endif
