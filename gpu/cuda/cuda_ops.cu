// cuda_ops.cu - bk_ops_cuda: the CUDA op table, and every op of gpu/ops.h but attention,
// loss and optimizer (gpu/cuda/cuda_attention.cu, cuda_loss.cu, cuda_optim.cu).  Base weights
// are stored in bf16 (rounded to nearest even at upload); activations, LoRA weights and
// their gradients are fp32.  Frozen linears are cuBLAS bf16 GEMMs with fp32 accumulation
// (the fp32 activation is rounded to bf16 first); the small LoRA GEMMs read the fp32
// operands as TF32 with fp32 accumulation; norms, RoPE and SwiGLU compute and reduce in
// fp32.  BK_ACT=bf16 (gpu/cuda/cuda_act.cuh, included below): the act ops, with the saved
// activations that feed GEMMs and attention in bf16.  Not the judge (gpu/host/host_ops.c
// is) and not the model (gpu/model.c).
#include "gpu/cuda/cuda_common.cuh"
#include "gpu/cuda/cuda_attention_tc.h" // BK_ATTN: fp32 or tensor-core attention
#include "gpu/cuda/cuda_vmm.h"           // weight placement: one shared copy of the weights

#include <algorithm>
#include <math.h>
#include <mutex>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <string>
#include <vector>

// ---------------------------------------------------------------------------------
// context: one stream, one cuBLAS handle, workspaces, allocation counters

static cudaStream_t g_stream;
static cublasHandle_t g_cublas;
static std::once_flag g_once;

static void cuda_init(void)
{
	std::call_once(g_once, [] {
		int n = 0;
		CUDA_CHECK(cudaGetDeviceCount(&n));
		if (n <= 0)
			die("cuda: no CUDA device");
		CUDA_CHECK(cudaStreamCreate(&g_stream));
		CUBLAS_CHECK(cublasCreate(&g_cublas));
		CUBLAS_CHECK(cublasSetStream(g_cublas, g_stream));
		// tensor-core math is chosen per call by the compute type; keep the default
		CUBLAS_CHECK(cublasSetMathMode(g_cublas, CUBLAS_DEFAULT_MATH));
	});
}

int bk_cuda_sync_launches(void)
{
	static int v = -1; // read once: the environment does not change during a run
	if (v < 0) {
		const char *e = getenv("BK_CUDA_SYNC");
		v = e && *e && strcmp(e, "0") != 0;
	}
	return v;
}

cudaStream_t bk_cuda_stream(void)
{
	cuda_init();
	return g_stream;
}

cublasHandle_t bk_cuda_cublas(void)
{
	cuda_init();
	return g_cublas;
}

// ---------------------------------------------------------------------------------
// the one device allocator: every device buffer of gpu/cuda/ is a bk_cuda_dev_alloc with a
// short stable name ("kv pool", "workspace 2"), so that running out of memory names the
// buffer and what this process holds, by name (bk_cuda_die_oom)

static std::mutex g_mem_mu;
struct dev_buf {
	void *p;
	size_t bytes;
	const char *name;
};
typedef std::pair<const char *, size_t> named_bytes;
static std::vector<dev_buf> g_live;     // device allocations
static std::vector<named_bytes> g_held; // bytes held, by name
static size_t g_cur, g_peak;
// the mappings of shared weights this process placed weights in (below: weight placement)
struct warena {
	char *base;
	size_t bytes, counted; // mapped; placed so far (counted in g_cur)
};
static std::vector<warena> g_warenas; // guarded by g_mem_mu

// bytes to name's entry of v (names are compared by text: the same name from two files)
static void add_named(std::vector<named_bytes> &v, const char *name, size_t bytes)
{
	for (auto &h : v)
		if (!strcmp(h.first, name)) {
			h.second += bytes;
			return;
		}
	v.push_back({ name, bytes });
}

// callers hold g_mem_mu
static void held_sub(const char *name, size_t bytes)
{
	for (auto &h : g_held)
		if (!strcmp(h.first, name)) {
			h.second -= bytes;
			return;
		}
	CUDA_BUG("device memory of '%s' freed but never counted", name);
}

// callers hold g_mem_mu
static void count_add(const char *name, size_t bytes)
{
	add_named(g_held, name, bytes);
	g_cur += bytes;
	if (g_cur > g_peak)
		g_peak = g_cur;
}

// "12.0 MiB": bytes in a unit a person reads at a glance
static const char *human(char *buf, size_t n, size_t bytes)
{
	static const char *const unit[] = { "KiB", "MiB", "GiB", "TiB" };
	if (bytes < 1024) {
		snprintf(buf, n, "%zu bytes", bytes);
		return buf;
	}
	double v = (double)bytes / 1024;
	int u = 0;
	for (; v >= 1024 && u < 3; u++)
		v /= 1024;
	snprintf(buf, n, "%.1f %s", v, unit[u]);
	return buf;
}

// what to change, by stage (the tools' own flags; bk-bake plans all of them)
static const char *oom_advice(void)
{
	if (!strcmp(bk_prog, "bk-gen"))
		return "lower --kv-memory or --max-batch, or use --load-in-4bit";
	if (!strcmp(bk_prog, "bk-step"))
		return "use --grad-checkpoint, a smaller --batch-size or --load-in-4bit";
	if (!strcmp(bk_prog, "bk-teach"))
		return "use a smaller --batch-size or --max-tokens, or --load-in-4bit";
	return "use a smaller batch or --load-in-4bit";
}

// what this process holds by name, a mapping of shared weights with all its bytes
// (placed or not); callers hold g_mem_mu
static std::vector<named_bytes> holdings(void)
{
	std::vector<named_bytes> h;
	for (auto &e : g_held)
		if (e.second)
			h.push_back(e);
	for (auto &w : g_warenas)
		if (w.bytes > w.counted)
			add_named(h, BK_CUDA_SHARED_WEIGHTS, w.bytes - w.counted);
	std::sort(h.begin(), h.end(),
		  [](const named_bytes &x, const named_bytes &y) { return x.second > y.second; });
	return h;
}

// "3.1 MiB (activations 2.0 MiB, shared weights 1.0 MiB, 2 more 80.0 KiB)" or "nothing":
// the largest few by name; the sum in *total
static void say_holdings(char *out, size_t n, size_t *total)
{
	std::vector<named_bytes> h;
	{
		std::lock_guard<std::mutex> lk(g_mem_mu);
		h = holdings();
	}
	size_t sum = 0, rest = 0, i = 0;
	for (auto &e : h)
		sum += e.second;
	*total = sum;
	if (!sum) {
		snprintf(out, n, "nothing");
		return;
	}
	char u[32];
	std::string t = human(u, sizeof u, sum);
	for (; i < h.size() && i < 4; i++)
		t += std::string(i ? ", " : " (") + h[i].first + " " + human(u, sizeof u, h[i].second);
	for (size_t j = i; j < h.size(); j++)
		rest += h[j].second;
	if (i < h.size())
		t += ", " + std::to_string(h.size() - i) + " more " + human(u, sizeof u, rest);
	snprintf(out, n, "%s)", t.c_str());
}

extern "C" void bk_cuda_die_oom(const char *name, size_t bytes)
{
	size_t fr = 0, tot = 0, ours;
	cudaGetLastError();
	if (cudaMemGetInfo(&fr, &tot) != cudaSuccess)
		fr = tot = 0;
	cudaGetLastError();
	char held[512], a[32], b[32], c[32], o[32];
	say_holdings(held, sizeof held, &ours);
	size_t other = tot - fr > ours ? tot - fr - ours : 0;
	die("out of device memory for '%s' (%s asked): %s of %s free; this process holds %s; "
	    "%s held by other processes (other stages of the pipe, a shared weight copy) and "
	    "the CUDA context; %s, or see the plan with bk-bake --dry-run --gpu-memory SIZE",
	    name, human(a, sizeof a, bytes), human(b, sizeof b, fr), human(c, sizeof c, tot),
	    held, human(o, sizeof o, other), oom_advice());
}

void *bk_cuda_dev_alloc(size_t bytes, const char *name)
{
	cuda_init();
	void *p = NULL;
	cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
	if (e == cudaErrorMemoryAllocation)
		bk_cuda_die_oom(name, bytes);
	if (e != cudaSuccess)
		die("cuda: cudaMalloc of '%s' (%zu bytes) failed: %s (%s)", name, bytes,
		    cudaGetErrorName(e), cudaGetErrorString(e));
	std::lock_guard<std::mutex> lk(g_mem_mu);
	g_live.push_back({ p, bytes, name });
	count_add(name, bytes);
	return p;
}

void bk_cuda_dev_free(void *p)
{
	if (!p)
		return;
	{
		std::lock_guard<std::mutex> lk(g_mem_mu);
		size_t i = 0;
		for (; i < g_live.size() && g_live[i].p != p; i++)
			;
		if (i == g_live.size())
			CUDA_BUG("cuda free: %p was not allocated by bk_cuda_dev_alloc", p);
		g_cur -= g_live[i].bytes;
		held_sub(g_live[i].name, g_live[i].bytes);
		g_live[i] = g_live.back();
		g_live.pop_back();
	}
	// the stream may still use p: cudaFree waits for the device
	CUDA_CHECK(cudaStreamSynchronize(g_stream));
	CUDA_CHECK(cudaFree(p));
}

extern "C" void bk_cuda_mem_stats(size_t *current, size_t *peak)
{
	std::lock_guard<std::mutex> lk(g_mem_mu);
	*current = g_cur;
	*peak = g_peak;
}

extern "C" void bk_cuda_mem_reset_peak(void)
{
	std::lock_guard<std::mutex> lk(g_mem_mu);
	g_peak = g_cur;
}

extern "C" size_t bk_cuda_mem_used(void)
{
	cuda_init();
	size_t fr = 0, tot = 0;
	CUDA_CHECK(cudaMemGetInfo(&fr, &tot));
	return tot - fr;
}

extern "C" void bk_cuda_sync(void)
{
	cuda_init();
	CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

#define BK_NWS 4
static void *g_ws[BK_NWS];
static size_t g_ws_bytes[BK_NWS];

void *bk_cuda_workspace(int slot, size_t bytes)
{
	if (slot < 0 || slot >= BK_NWS)
		CUDA_BUG("cuda workspace: slot %d out of range", slot);
	if (bytes <= g_ws_bytes[slot])
		return g_ws[slot];
#ifdef BK_CUDA_EMU
	size_t want = bytes; // the emulation: no slack, so an overrun reaches ASan
#else
	size_t want = bytes + bytes / 4; // some headroom against growth in small steps
#endif
	static const char *const name[BK_NWS] = { "workspace 0", "workspace 1", "workspace 2",
						   "workspace 3" };
	bk_cuda_dev_free(g_ws[slot]);
	g_ws[slot] = bk_cuda_dev_alloc(want, name[slot]);
	g_ws_bytes[slot] = want;
	return g_ws[slot];
}

// ---------------------------------------------------------------------------------
// memory ops

static void *cuda_alloc_as(size_t bytes, const char *name)
{
	void *p = bk_cuda_dev_alloc(bytes, name);
	if (bytes) // all-ones bytes are a NaN float, as on the host: unwritten reads show
		CUDA_CHECK(cudaMemsetAsync(p, 0xff, bytes, g_stream));
	return p;
}

static void *cuda_alloc(size_t bytes) { return cuda_alloc_as(bytes, "unnamed buffer"); }

static void cuda_free(void *p) { bk_cuda_dev_free(p); }

static void cuda_upload(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	cuda_init();
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, g_stream));
	// the caller may reuse src at once (pageable memory): wait for the copy
	CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

static void cuda_download(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	cuda_init();
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, g_stream));
	CUDA_CHECK(cudaStreamSynchronize(g_stream));
}

static void cuda_copy(void *dst, const void *src, size_t bytes)
{
	if (!bytes)
		return;
	cuda_init();
	CUDA_CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, g_stream));
}

static void cuda_zero(void *p, size_t bytes)
{
	if (!bytes)
		return;
	cuda_init();
	CUDA_CHECK(cudaMemsetAsync(p, 0, bytes, g_stream));
}

// out [n] bf16 = round(in [n] fp32)
__global__ void f32_to_bf16_kernel(__nv_bfloat16 *out, const float *in, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		out[i] = bk_f32_to_bf16(in[i]);
}

static void to_bf16(__nv_bfloat16 *out, const float *in, size_t n)
{
	if (!n)
		return;
	unsigned blocks = bk_cuda_blocks(n, 256);
	if (blocks > 65535u * 8)
		blocks = 65535u * 8;
	BK_LAUNCH(f32_to_bf16_kernel, blocks, 256, 0, g_stream, out, in, n);
}

// weight placement (gpu/cuda/cuda_vmm.h): where weight_upload puts a weight.  OWN: its
// own allocation.  MEASURE: nowhere (data NULL), the layout recorded.  UPLOAD: at the next
// offset of an arena (one shared physical allocation), converted there.  ATTACH: at the
// next offset of an arena that already holds the weights (another process uploaded
// them), nothing read or written; each tensor's shape and offset must be the layout's.
// Arena weights are counted in the allocation counters as own ones are (the stage uses
// them as before), freed with the arena (bk_cuda_warena_drop), never by weight_free.
static int g_wmode = BK_WPLACE_OWN;
static char *g_wbase;
static size_t g_wbytes, g_woff;
static std::vector<bk_wdesc> g_wdesc;
static size_t g_wn; // tensors placed since begin

static size_t walign(size_t off) { return (off + 255) & ~(size_t)255; }

extern "C" void bk_cuda_wplace_begin(int mode, void *base, size_t bytes, const bk_wdesc *desc,
				     size_t n)
{
	if (g_wmode != BK_WPLACE_OWN || mode < BK_WPLACE_OWN || mode > BK_WPLACE_ATTACH ||
	    ((mode == BK_WPLACE_UPLOAD || mode == BK_WPLACE_ATTACH) && (!base || !desc)))
		CUDA_BUG("weight placement: begin mode %d in mode %d", mode, g_wmode);
	g_wmode = mode;
	g_wbase = (char *)base;
	g_wbytes = bytes;
	g_woff = 0;
	g_wn = 0;
	g_wdesc.assign(desc, desc + (desc ? n : 0));
	if (mode == BK_WPLACE_UPLOAD || mode == BK_WPLACE_ATTACH) {
		std::lock_guard<std::mutex> lk(g_mem_mu);
		g_warenas.push_back({ g_wbase, bytes, 0 });
	}
}

extern "C" size_t bk_cuda_wplace_end(bk_wdesc **desc, size_t *n)
{
	if (g_wmode == BK_WPLACE_OWN)
		CUDA_BUG("weight placement: end without begin");
	if ((g_wmode == BK_WPLACE_UPLOAD || g_wmode == BK_WPLACE_ATTACH) && g_wn != g_wdesc.size())
		die("shared weights: the layout has %zu tensors, the model %zu", g_wdesc.size(),
		    g_wn);
	if (desc) {
		*desc = (bk_wdesc *)malloc((g_wdesc.size() ? g_wdesc.size() : 1) * sizeof(bk_wdesc));
		if (!*desc)
			die("out of memory");
		if (!g_wdesc.empty())
			memcpy(*desc, g_wdesc.data(), g_wdesc.size() * sizeof(bk_wdesc));
		*n = g_wdesc.size();
	}
	size_t used = g_woff;
	g_wmode = BK_WPLACE_OWN;
	g_wdesc.clear();
	return used;
}

extern "C" void bk_cuda_warena_drop(void *base)
{
	if (!base)
		return;
	std::lock_guard<std::mutex> lk(g_mem_mu);
	for (size_t i = 0; i < g_warenas.size(); i++)
		if (g_warenas[i].base == base) {
			g_cur -= g_warenas[i].counted;
			held_sub(BK_CUDA_SHARED_WEIGHTS, g_warenas[i].counted);
			g_warenas[i] = g_warenas.back();
			g_warenas.pop_back();
			return;
		}
	CUDA_BUG("weight arena %p was not placed", base);
}

// the arena holding p, or NULL (callers hold g_mem_mu)
static warena *arena_of(const void *p)
{
	for (auto &a : g_warenas)
		if ((const char *)p >= a.base && (const char *)p < a.base + a.bytes)
			return &a;
	return NULL;
}

// the next tensor of the placement (kind and bytes: bk_wdesc's): its address, checked
// against the layout; NULL when measuring
static char *wplace_take(int rows, int cols, int kind, size_t bytes)
{
	size_t off = walign(g_woff);
	if (g_wmode == BK_WPLACE_MEASURE) {
		g_wdesc.push_back({ rows, cols, kind, 0, (uint64_t)off, (uint64_t)bytes });
	} else {
		const bk_wdesc *d = g_wn < g_wdesc.size() ? &g_wdesc[g_wn] : NULL;
		if (!d || d->rows != rows || d->cols != cols || d->kind != kind || d->off != off ||
		    d->bytes != bytes || off + bytes > g_wbytes)
			die("shared weights: tensor %zu (%d x %d, kind %#x, %zu bytes at byte %zu) is not "
			    "the layout's%s", g_wn, rows, cols, (unsigned)kind, bytes, off,
			    d ? "" : " (the layout has fewer tensors)");
		std::lock_guard<std::mutex> lk(g_mem_mu);
		warena *a = arena_of(g_wbase);
		a->counted += bytes;
		count_add(BK_CUDA_SHARED_WEIGHTS, bytes);
	}
	g_wn++;
	g_woff = off + bytes;
	return g_wmode == BK_WPLACE_MEASURE ? NULL : g_wbase + off;
}

// the next bf16 tensor of the placement
static __nv_bfloat16 *wplace_next(int rows, int cols)
{
	size_t bytes = (size_t)rows * cols * sizeof(__nv_bfloat16);
	return (__nv_bfloat16 *)wplace_take(rows, cols, BK_WDESC_BF16, bytes);
}

// a bf16 weight's handle and its device storage: placed in the shared layout (g_wmode)
// or its own allocation
static bk_weight *weight_new_bf16(int rows, int cols)
{
	bk_weight *w = (bk_weight *)malloc(sizeof(*w));
	if (!w)
		die("out of memory allocating a weight handle");
	w->rows = rows;
	w->cols = cols;
	w->kind = BK_WEIGHT_PLAIN;
	w->data = g_wmode != BK_WPLACE_OWN
			  ? (void *)wplace_next(rows, cols)
			  : bk_cuda_dev_alloc((size_t)rows * cols * sizeof(__nv_bfloat16), "weights");
	return w;
}

// true when an upload has nothing to read: the layout only, or another process's upload
static int weight_placed_only(void)
{
	return g_wmode == BK_WPLACE_MEASURE || g_wmode == BK_WPLACE_ATTACH;
}

// weights: host fp32 -> device bf16 through a bounded fp32 staging buffer
static bk_weight *cuda_weight_upload(const float *host, int rows, int cols)
{
	if (rows <= 0 || cols <= 0)
		CUDA_BUG("weight_upload: %d x %d", rows, cols);
	cuda_init();
	size_t n = (size_t)rows * cols, chunk = (size_t)1 << 24;
	bk_weight *w = weight_new_bf16(rows, cols);
	__nv_bfloat16 *d = (__nv_bfloat16 *)w->data;
	if (weight_placed_only())
		return w;
	size_t sb = (n < chunk ? n : chunk) * sizeof(float);
	float *stage = (float *)bk_cuda_dev_alloc(sb, "weight staging");
	for (size_t off = 0; off < n; off += chunk) {
		size_t m = n - off < chunk ? n - off : chunk;
		CUDA_CHECK(cudaMemcpyAsync(stage, host + off, m * sizeof(float),
					   cudaMemcpyHostToDevice, g_stream));
		to_bf16(d + off, stage, m);
	}
	bk_cuda_dev_free(stage); // waits for the conversions
	return w;
}

#include "gpu/cuda/cuda_wload.cuh" // weights streamed in bf16: weight_upload_bf16
#include "gpu/cuda/cuda_q4.cuh" // 4-bit base linears (QLoRA): weight_upload_q4

static void cuda_weight_free(bk_weight *w)
{
	if (!w)
		return;
	if (w->kind == BK_WEIGHT_Q4) {
		cuda_q4_free(w);
		return;
	}
	int in_arena;
	{
		std::lock_guard<std::mutex> lk(g_mem_mu);
		in_arena = !w->data || arena_of(w->data); // placed: freed with its arena
	}
	if (!in_arena)
		bk_cuda_dev_free(w->data);
	free(w);
}

// a weight as bf16 for the next GEMM (a 4-bit one dequantised into a scratch: cuda_q4.cuh)
static const __nv_bfloat16 *wbf(const bk_weight *w) { return bk_cuda_weight_bf16(w); }

// ---------------------------------------------------------------------------------
// GEMMs (column-major cuBLAS on row-major buffers: a row-major [r,c] matrix is a
// column-major [c,r] one, so y = x W^T becomes y^T = W x^T with op(W) = T)

static void gemm_bf16(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
		      float alpha, const __nv_bfloat16 *A, int lda, const __nv_bfloat16 *B,
		      int ldb, float beta, float *C, int ldc)
{
	CUBLAS_CHECK(cublasGemmEx(g_cublas, ta, tb, m, n, k, &alpha, A, CUDA_R_16BF, lda, B,
				  CUDA_R_16BF, ldb, &beta, C, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
				  CUBLAS_GEMM_DEFAULT));
}

static void gemm_tf32(cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
		      float alpha, const float *A, int lda, const float *B, int ldb, float beta,
		      float *C, int ldc)
{
	CUBLAS_CHECK(cublasGemmEx(g_cublas, ta, tb, m, n, k, &alpha, A, CUDA_R_32F, lda, B,
				  CUDA_R_32F, ldb, &beta, C, CUDA_R_32F, ldc,
				  CUBLAS_COMPUTE_32F_FAST_TF32, CUBLAS_GEMM_DEFAULT));
}

// ---------------------------------------------------------------------------------
// embedding

// x [T,H] = embed [V,H] rows; an id out of range writes NaN (model.c checks ids first)
__global__ void embedding_kernel(float *x, const int32_t *ids, const __nv_bfloat16 *embed,
				 int V, int H)
{
	int t = blockIdx.x, id = ids[t];
	float *xt = x + (size_t)t * H;
	if (id < 0 || id >= V) {
		for (int i = threadIdx.x; i < H; i += blockDim.x)
			xt[i] = __int_as_float(0x7fffffff);
		return;
	}
	const __nv_bfloat16 *er = embed + (size_t)id * H;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		xt[i] = bk_bf16_to_f32(er[i]);
}

static void cuda_embedding_forward(float *x /* [T,H] */, const int32_t *ids /* [T] */,
				   const bk_weight *embed /* [V,H] */, int T)
{
	if (T <= 0)
		return;
	BK_LAUNCH(embedding_kernel, T, 256, 0, g_stream, x, ids, wbf(embed), embed->rows, embed->cols);
}

// ---------------------------------------------------------------------------------
// RMSNorm: one block per row

#define NORM_THREADS 256

__global__ void rmsnorm_forward_kernel(float *out, float *rstd, const float *x,
				       const __nv_bfloat16 *w, int H, float eps)
{
	__shared__ float sh[32];
	int t = blockIdx.x;
	const float *xt = x + (size_t)t * H;
	float *ot = out + (size_t)t * H;
	float ss = 0;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		ss += xt[i] * xt[i];
	ss = bk_block_sum(ss, sh);
	float r = 1.0f / sqrtf(ss / (float)H + eps); // as the host (not rsqrtf)
	if (threadIdx.x == 0)
		rstd[t] = r;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		ot[i] = bk_bf16_to_f32(w[i]) * (xt[i] * r);
}

static void cuda_rmsnorm_forward(float *out /* [T,H] */, float *rstd /* [T] */,
				 const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				 int T, int H, float eps)
{
	if (w->rows * w->cols != H)
		CUDA_BUG("rmsnorm_forward: weight %d x %d for H %d", w->rows, w->cols, H);
	if (T <= 0)
		return;
	BK_LAUNCH(rmsnorm_forward_kernel, T, NORM_THREADS, 0, g_stream, out, rstd, x, wbf(w), H, eps);
}

// dx += rstd * (g - xh * mean(g*xh)), g = dout*w, xh = x*rstd
__global__ void rmsnorm_backward_kernel(float *dx, const float *dout, const float *x,
					const __nv_bfloat16 *w, const float *rstd, int H)
{
	__shared__ float sh[32];
	int t = blockIdx.x;
	const float *xt = x + (size_t)t * H, *dt = dout + (size_t)t * H;
	float *dxt = dx + (size_t)t * H;
	float r = rstd[t], dot = 0;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		dot += dt[i] * bk_bf16_to_f32(w[i]) * xt[i] * r;
	dot = bk_block_sum(dot, sh) / (float)H;
	for (int i = threadIdx.x; i < H; i += blockDim.x)
		dxt[i] += r * (dt[i] * bk_bf16_to_f32(w[i]) - xt[i] * r * dot);
}

static void cuda_rmsnorm_backward(float *dx /* [T,H] += */, const float *dout /* [T,H] */,
				  const float *x /* [T,H] */, const bk_weight *w /* [1,H] */,
				  const float *rstd /* [T] */, int T, int H)
{
	if (w->rows * w->cols != H)
		CUDA_BUG("rmsnorm_backward: weight %d x %d for H %d", w->rows, w->cols, H);
	if (T <= 0)
		return;
	BK_LAUNCH(rmsnorm_backward_kernel, T, NORM_THREADS, 0, g_stream, dx, dout, x, wbf(w), rstd, H);
}

// ---------------------------------------------------------------------------------
// frozen linear

static void cuda_linear_forward(float *y /* [T,out] */, const float *x /* [T,in] */,
				const bk_weight *W /* [out,in] */, int T)
{
	int out = W->rows, in = W->cols;
	if (T <= 0)
		return;
	__nv_bfloat16 *xb = (__nv_bfloat16 *)bk_cuda_workspace(0, (size_t)T * in * 2);
	to_bf16(xb, x, (size_t)T * in);
	// y^T [out,T] = W [out,in] . x^T [in,T]
	gemm_bf16(CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, 1.0f, wbf(W), in, xb, in, 0.0f, y, out);
}

static void cuda_linear_backward(float *dx /* [T,in] += */, const float *dy /* [T,out] */,
				 const bk_weight *W /* [out,in] */, int T)
{
	int out = W->rows, in = W->cols;
	if (T <= 0)
		return;
	__nv_bfloat16 *dyb = (__nv_bfloat16 *)bk_cuda_workspace(0, (size_t)T * out * 2);
	to_bf16(dyb, dy, (size_t)T * out);
	// dx^T [in,T] += W^T [in,out] . dy^T [out,T]
	gemm_bf16(CUBLAS_OP_N, CUBLAS_OP_N, in, T, out, 1.0f, wbf(W), in, dyb, out, 1.0f, dx, in);
}

// ---------------------------------------------------------------------------------
// LoRA

// xd [n] = x * keep / (1-p), keep(i) = crng(key, i) >= p
__global__ void dropout_kernel(float *xd, const float *x, size_t n, float p, float inv,
			       uint64_t key)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		xd[i] = bk_crng_uniform_dev(key, i) >= (double)p ? x[i] * inv : 0.0f;
}

// dx [n] += dxd * keep / (1-p)
__global__ void dropout_backward_kernel(float *dx, const float *dxd, size_t n, float p,
					float inv, uint64_t key)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		if (bk_crng_uniform_dev(key, i) >= (double)p)
			dx[i] += dxd[i] * inv;
}

static unsigned grid_capped(size_t n)
{
	unsigned b = bk_cuda_blocks(n, 256);
	return b > 65535u * 8 ? 65535u * 8 : b;
}

static const float *lora_dropped(float *xd, const float *x, int T, int in, float p,
				 uint64_t key)
{
	if (p <= 0)
		return x;
	size_t n = (size_t)T * in;
	BK_LAUNCH(dropout_kernel, grid_capped(n), 256, 0, g_stream, xd, x, n, p, 1.0f / (1.0f - p), key);
	return xd;
}

static void cuda_lora_forward(float *y /* [T,out] += */, float *xa /* [T,R] */,
			      const float *x /* [T,in] */, const float *A /* [R,in] */,
			      const float *B /* [out,R] */, int T, int in, int out, int R,
			      float scale, float p, uint64_t key, float *scratch /* [T,in+R] */)
{
	if (p < 0 || p >= 1)
		CUDA_BUG("lora_forward: dropout %g", p);
	if (T <= 0)
		return;
	const float *xd = lora_dropped(scratch, x, T, in, p, key);
	// xa^T [R,T] = A [R,in] . xd^T [in,T]
	gemm_tf32(CUBLAS_OP_T, CUBLAS_OP_N, R, T, in, 1.0f, A, in, xd, in, 0.0f, xa, R);
	// y^T [out,T] += scale B [out,R] . xa^T [R,T]
	gemm_tf32(CUBLAS_OP_T, CUBLAS_OP_N, out, T, R, scale, B, R, xa, R, 1.0f, y, out);
}

static void cuda_lora_backward(float *dx /* [T,in] += */, float *dA /* [R,in] += */,
			       float *dB /* [out,R] += */, const float *dy /* [T,out] */,
			       const float *x /* [T,in] */, const float *xa /* [T,R] */,
			       const float *A /* [R,in] */, const float *B /* [out,R] */, int T,
			       int in, int out, int R, float scale, float p, uint64_t key,
			       float *scratch /* [T,in+R] */)
{
	if (p < 0 || p >= 1)
		CUDA_BUG("lora_backward: dropout %g", p);
	if (T <= 0)
		return;
	float *dxa = scratch + (size_t)T * in; // [T,R]
	// dB [out,R] += scale dy^T xa:  (dB^T [R,out] += scale xa^T [R,T] . dy [T,out])
	gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, R, out, T, scale, xa, R, dy, out, 1.0f, dB, R);
	// dxa [T,R] = scale dy B:  (dxa^T [R,T] = scale B^T [R,out] . dy^T [out,T])
	gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, R, T, out, scale, B, R, dy, out, 0.0f, dxa, R);
	const float *xd = lora_dropped(scratch, x, T, in, p, key);
	// dA [R,in] += dxa^T xd:  (dA^T [in,R] += xd^T [in,T] . dxa [T,R])
	gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_T, in, R, T, 1.0f, xd, in, dxa, R, 1.0f, dA, in);
	if (p <= 0) {
		// dx [T,in] += dxa A:  (dx^T [in,T] += A^T [in,R] . dxa^T [R,T])
		gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, A, in, dxa, R, 1.0f, dx, in);
		return;
	}
	float *dxd = scratch; // [T,in]; drop(x) is no longer needed
	gemm_tf32(CUBLAS_OP_N, CUBLAS_OP_N, in, T, R, 1.0f, A, in, dxa, R, 0.0f, dxd, in);
	size_t n = (size_t)T * in;
	BK_LAUNCH(dropout_backward_kernel, grid_capped(n), 256, 0, g_stream, dx, dxd, n, p,
								      1.0f / (1.0f - p), key);
}

// ---------------------------------------------------------------------------------
// RoPE (HF rotate_half), in place; one thread per (t, head, i < D/2)

__global__ void rope_kernel(float *x, const int32_t *pos, const float *inv_freq, int T, int n,
			    int D, float sign)
{
	int half = D / 2;
	size_t total = (size_t)T * n * half;
	size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	if (idx >= total)
		return;
	int i = (int)(idx % half);
	size_t th = idx / half; // t * n + h
	int t = (int)(th / n);
	float ang = (float)pos[t] * inv_freq[i];
	float c = cosf(ang), s = sign * sinf(ang);
	float *xh = x + th * D;
	float a = xh[i], b = xh[i + half];
	xh[i] = a * c - b * s;
	xh[i + half] = b * c + a * s;
}

static void rope(float *x, const int32_t *pos, const float *inv_freq, int T, int n, int D,
		 float sign)
{
	if (D % 2)
		CUDA_BUG("rope: odd head dimension %d", D);
	size_t total = (size_t)T * n * (D / 2);
	if (!total)
		return;
	BK_LAUNCH(rope_kernel, bk_cuda_blocks(total, 256), 256, 0, g_stream, x, pos, inv_freq, T, n, D,
								      sign);
}

static void cuda_rope_forward(float *x, const int32_t *pos, const float *inv_freq, int T,
			      int n, int D)
{
	rope(x, pos, inv_freq, T, n, D, 1.0f);
}

static void cuda_rope_backward(float *dx, const int32_t *pos, const float *inv_freq, int T,
			       int n, int D)
{
	rope(dx, pos, inv_freq, T, n, D, -1.0f);
}

// ---------------------------------------------------------------------------------
// SwiGLU and residual (elementwise, fp32)

__global__ void swiglu_forward_kernel(float *h, const float *gate, const float *up, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		float g = gate[i];
		h[i] = g / (1.0f + expf(-g)) * up[i];
	}
}

__global__ void swiglu_backward_kernel(float *dgate, float *dup, const float *dh,
				       const float *gate, const float *up, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		// written, not added; dgate/dup may be gate/up (read first): the host twin's
		float g = gate[i], u = up[i], d = dh[i], sg = 1.0f / (1.0f + expf(-g));
		dgate[i] = d * u * sg * (1.0f + g * (1.0f - sg));
		dup[i] = d * g * sg;
	}
}

__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		out[i] = a[i] + b[i];
}

static void cuda_swiglu_forward(float *h, const float *gate, const float *up, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(swiglu_forward_kernel, grid_capped(n), 256, 0, g_stream, h, gate, up, n);
}

static void cuda_swiglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
				 const float *up, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(swiglu_backward_kernel, grid_capped(n), 256, 0, g_stream, dgate, dup, dh, gate, up, n);
}

static void cuda_residual_forward(float *out, const float *a, const float *b, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(residual_kernel, grid_capped(n), 256, 0, g_stream, out, a, b, n);
}

// ---------------------------------------------------------------------------------
// GeGLU (gelu_pytorch_tanh), bias, final-logit softcap (elementwise, fp32; the host
// twin's formulas, host_ops.c)

#define GELU_K0 0.7978845608028654f // sqrt(2/pi)
#define GELU_K1 0.044715f

__global__ void geglu_forward_kernel(float *h, const float *gate, const float *up, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		float g = gate[i];
		float th = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
		h[i] = 0.5f * g * (1.0f + th) * up[i];
	}
}

__global__ void geglu_backward_kernel(float *dgate, float *dup, const float *dh,
				      const float *gate, const float *up, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride) {
		float g = gate[i], u = up[i], d = dh[i];
		float th = tanhf(GELU_K0 * (g + GELU_K1 * g * g * g));
		float gl = 0.5f * g * (1.0f + th);
		float dg = 0.5f * (1.0f + th) +
			   0.5f * g * (1.0f - th * th) * GELU_K0 * (1.0f + 3.0f * GELU_K1 * g * g);
		dgate[i] = d * u * dg; // as swiglu: written, may be in place
		dup[i] = d * gl;
	}
}

static void cuda_geglu_forward(float *h, const float *gate, const float *up, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(geglu_forward_kernel, grid_capped(n), 256, 0, g_stream, h, gate, up, n);
}

static void cuda_geglu_backward(float *dgate, float *dup, const float *dh, const float *gate,
				const float *up, size_t n)
{
	if (!n)
		return;
	BK_LAUNCH(geglu_backward_kernel, grid_capped(n), 256, 0, g_stream, dgate, dup, dh, gate, up, n);
}

// y [T,n] += b [n] (bf16 weight)
__global__ void bias_kernel(float *y, const __nv_bfloat16 *b, size_t total, int n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < total; i += stride)
		y[i] += bk_bf16_to_f32(b[i % (size_t)n]);
}

static void cuda_bias_forward(float *y, const bk_weight *b, int T)
{
	if (b->rows != 1)
		CUDA_BUG("bias_forward: weight %d x %d is not a row", b->rows, b->cols);
	size_t total = (size_t)T * b->cols;
	if (!total)
		return;
	BK_LAUNCH(bias_kernel, grid_capped(total), 256, 0, g_stream, y, wbf(b), total, b->cols);
}

__global__ void softcap_kernel(float *x, float cap, size_t n)
{
	size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	size_t stride = (size_t)gridDim.x * blockDim.x;
	for (; i < n; i += stride)
		x[i] = tanhf(x[i] / cap) * cap;
}

static void cuda_softcap_forward(float *x, float cap, size_t n)
{
	if (!(cap > 0))
		CUDA_BUG("softcap_forward: cap %g is not positive", (double)cap);
	if (!n)
		return;
	BK_LAUNCH(softcap_kernel, grid_capped(n), 256, 0, g_stream, x, cap, n);
}

// ---------------------------------------------------------------------------------
#include "gpu/cuda/cuda_proj.cuh" // proj_forward / proj_backward: BK_LINEAR=v1 | v2

// ---------------------------------------------------------------------------------
#include "gpu/cuda/cuda_act.cuh" // the act ops: BK_ACT=fp32 | bf16

// ---------------------------------------------------------------------------------

// designated initialisers in declaration order: ops other files add to bk_ops (and
// that are not wired here) stay NULL, which test_cuda_ops reports as absent.  The
// attention, loss and optimizer ops are those of gpu/cuda/cuda_attention.cu,
// gpu/cuda/cuda_loss.cu and gpu/cuda/cuda_optim.cu (declared in cuda.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmissing-field-initializers"
extern "C" const bk_ops bk_ops_cuda = {
	.name = "cuda",
	.alloc = cuda_alloc,
	.alloc_as = cuda_alloc_as,
	.free = cuda_free,
	.upload = cuda_upload,
	.download = cuda_download,
	.copy = cuda_copy,
	.zero = cuda_zero,
	.weight_upload = cuda_weight_upload,
	.weight_upload_bf16 = cuda_weight_upload_bf16,
	.weight_free = cuda_proj_weight_free, // and BK_LINEAR=v3's stacked copies of it
	.weight_upload_q4 = cuda_weight_upload_q4,
	.embedding_forward = cuda_embedding_forward,
	.rmsnorm_forward = cuda_rmsnorm_forward,
	.rmsnorm_backward = cuda_rmsnorm_backward,
	.linear_forward = cuda_linear_forward,
	.linear_backward = cuda_linear_backward,
	.lora_forward = cuda_lora_forward,
	.lora_backward = cuda_lora_backward,
	.rope_forward = cuda_rope_forward,
	.rope_backward = cuda_rope_backward,
	.attention_forward = bk_cuda_attention_forward_sel,   // BK_ATTN=fp32 (default) | tc
	.attention_backward = bk_cuda_attention_backward_sel, // (gpu/cuda/cuda_attention_tc.cu)
	.swiglu_forward = cuda_swiglu_forward,
	.swiglu_backward = cuda_swiglu_backward,
	.geglu_forward = cuda_geglu_forward,
	.geglu_backward = cuda_geglu_backward,
	.bias_forward = cuda_bias_forward,
	.softcap_forward = cuda_softcap_forward,
	.residual_forward = cuda_residual_forward,
	.gather_rows = bk_cuda_gather_rows,
	.scatter_rows = bk_cuda_scatter_rows,
	.kl_exact = bk_cuda_kl_exact,
	.kl_topk = bk_cuda_kl_topk,
	.teacher_topk = bk_cuda_teacher_topk,
	.teacher_logprobs = bk_cuda_teacher_logprobs,
	.adamw_step = bk_cuda_adamw_step,
	.adamw8_step = bk_cuda_adamw8_step,
	.grad_sumsq = bk_cuda_grad_sumsq,
	.scale = bk_cuda_scale,
	.proj_forward = cuda_proj_forward,   // BK_LINEAR=v1 (default) | v2
	.proj_backward = cuda_proj_backward,
	.act_bytes = cuda_act_bytes, // BK_ACT=fp32 (default: 4) | bf16 (2; gpu/cuda/cuda_act.cuh)
	.rmsnorm_forward_act = cuda_rmsnorm_forward_act,
	.rope_forward_act = cuda_rope_forward_act,
	.to_act = cuda_to_act,
	.glu_forward_act = cuda_glu_forward_act,
	.glu_backward_act = cuda_glu_backward_act,
	.attention_forward_act = cuda_attention_forward_act,
	.attention_backward_act = cuda_attention_backward_act,
	.proj_forward_act = cuda_proj_forward_act,
	.proj_backward_act = cuda_proj_backward_act,
};
#pragma GCC diagnostic pop
