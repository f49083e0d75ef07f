// cuda_proj3.cuh - what BK_LINEAR=v3 (gpu/cuda/cuda_proj.cuh) adds to v2, as code that
// tests/emu/test_proj3.cc launches on its own on the emulated GPU:
//   - the interleaved layout of a projection group's output gradients and the one kernel
//     that writes it in bf16 from the members' fp32 dy_j (the conversion pass v2 already
//     makes, only strided), so that dx += sum_j dy_j W_j is ONE GEMM with K = sum out_j
//     over the members' weights stacked [sum out, in];
//   - the split of a group's members into batches of equal shape for the forward's
//     base GEMMs (one cublasGemmBatchedEx launch per batch), and the kernel that writes
//     a batch's device pointer table.
// Included by cuda_proj.cuh (and the test) after cuda_common.cuh; needs BK_PROJ_MAX
// (gpu/ops.h).

// The interleaved layout of a group of n members with out_j output features on T tokens:
// one row-major [T, ld] matrix, ld = sum_j out_j, member j in columns off[j] ..
// off[j+1] - 1, so element (t, o) of member j is at t * ld + off[j] + o.  It is the
// [T, sum out] matrix whose product with the members' weights stacked in member order
// ([sum out, in], member j in rows off[j] ..) is sum_j dy_j W_j.
struct proj_cat {
	int n, ld;
	int off[BK_PROJ_MAX + 1];
	const float *src[BK_PROJ_MAX]; // member j's [T, out_j], row-major
};

// fills c->n, c->off and c->ld from outs[0..n-1] (each >= 1); returns ld
static inline int proj_cat_layout(proj_cat *c, const int *outs, int n)
{
	c->n = n;
	c->off[0] = 0;
	for (int j = 0; j < n; j++)
		c->off[j + 1] = c->off[j] + outs[j];
	for (int j = n; j < BK_PROJ_MAX; j++)
		c->off[j + 1] = c->off[n];
	c->ld = c->off[n];
	return c->ld;
}

// cat [T, c.ld] bf16 = round(member j's dy_j) in the interleaved layout: blocks over rows
// (y, grid-stride) and columns (x, grid-stride); a column's member is found by its offset
// (n <= 3 compares), so reads and writes are both contiguous along a row
static __global__ void proj_interleave_bf16_kernel(__nv_bfloat16 *cat, proj_cat c, int T)
{
	for (int t = blockIdx.y; t < T; t += gridDim.y) {
		__nv_bfloat16 *row = cat + (size_t)t * c.ld;
		for (int col = blockIdx.x * blockDim.x + threadIdx.x; col < c.ld;
		     col += gridDim.x * blockDim.x) {
			int j = 0;
			while (j + 1 < c.n && col >= c.off[j + 1])
				j++;
			int out = c.off[j + 1] - c.off[j];
			row[col] = bk_f32_to_bf16(c.src[j][(size_t)t * out + (col - c.off[j])]);
		}
	}
}

// the grid of proj_interleave_bf16_kernel for T rows of ld columns at 256 threads
static inline void proj_interleave_grid(int T, int ld, unsigned *gx, unsigned *gy)
{
	unsigned x = (unsigned)((ld + 255) / 256);
	*gx = x > 64 ? 64 : x;
	*gy = T > 65535 ? 65535 : (unsigned)T;
}

// The forward's batches: members j of equal out_j and equal beta (LoRA on it or not: the
// base GEMM adds onto the LoRA product with beta 1, else writes with beta 0) go into one
// batched GEMM.  batch[j] = the batch of member j, batches numbered in order of their
// first member; returns the number of batches.  q/k/v under GQA: {q}, {k, v} (k and v
// both LoRA or both not); gate/up: one batch; a single member: one.
static inline int proj_batches(const int *outs, const int *lora, int n, int *batch)
{
	int nb = 0, first[BK_PROJ_MAX];
	for (int j = 0; j < n; j++) {
		int b = 0;
		while (b < nb && !(outs[first[b]] == outs[j] && !lora[first[b]] == !lora[j]))
			b++;
		if (b == nb)
			first[nb++] = j;
		batch[j] = b;
	}
	return nb;
}

// A batched GEMM's pointer table: the A pointers of its bs members, then the B pointers,
// then the C pointers (cublasGemmBatchedEx reads them from device memory).
enum { PROJ_PTRS = 3 * BK_PROJ_MAX };
struct proj_ptrs {
	const void *p[PROJ_PTRS];
};

// dst [k] = v.p [k], k <= PROJ_PTRS (one warp)
static __global__ void proj_ptrs_kernel(const void **dst, proj_ptrs v, int k)
{
	int i = threadIdx.x;
	if (i < k)
		dst[i] = v.p[i];
}
