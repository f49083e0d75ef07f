/* memplan.c - see memplan.h.  Every item names the allocation site it models; when a
 * site changes its sizes, change the item here (tests/unit/test_memplan.c compares the
 * activation sizes with what bk_acts_create_* allocates on the host twin, and the
 * stages' plans with hand-computed numbers for a tiny config). */
#include "gpu/memplan.h"
#include "gpu/quant4.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"

enum { GEN_BLOCK = 16 };      /* gpu/gen.h BK_GEN_BLOCK */
enum { NMOD = 7 };            /* gpu/model.h BK_LORA_NMOD */
#define TOPK_SCRATCH ((size_t)1 << 24)      /* cuda_loss.cu: teacher logits per row block */
#define LOSS_V2_BUDGET ((size_t)512 << 20)  /* cuda_loss.cu: v2 row blocks */
#define CUDA_CONTEXT ((size_t)512 << 20)    /* estimate: context, cuBLAS, module images */
enum { SQ_CHUNK = 65536 };                  /* cuda_optim.cu grad_sumsq */
enum { L2_TARGET_BLOCKS = 264, L2_NCNT = 4096 }; /* cuda_linear2.cuh */
enum { ATT_CH = 128 };                      /* cuda_gen.cu gen attend key split */
enum { SMP_MAX_BLOCKS = 264 };              /* cuda_sample.cu */
enum { Q8_BLOCK = 256 };                    /* gpu/optim8.h BK_Q8_BLOCK */

static int env_mode(const char *name, const char *first, const char *second, const char *third)
{
	const char *e = getenv(name);
	if (!e || !*e || !strcmp(e, first))
		return 1;
	if (!strcmp(e, second))
		return 2;
	if (third && !strcmp(e, third))
		return 3;
	if (third)
		die("%s='%s': expected %s (the default), %s or %s", name, e, first, second, third);
	die("%s=%s: expected %s (the default) or %s", name, e, first, second);
}

bk_mem_dev bk_mem_dev_cuda_env(void)
{
	bk_mem_dev d = {.cuda = 1, .weight_bytes = 2, .kv_bytes = 2};
	d.act_bytes = env_mode("BK_ACT", "fp32", "bf16", NULL) == 2 ? 2 : 4;
	d.linear = env_mode("BK_LINEAR", "v1", "v2", "v3");
	d.loss = env_mode("BK_LOSS", "v1", "v2", NULL);
	d.attn_tc = env_mode("BK_ATTN", "fp32", "tc", NULL) == 2;
	d.decode_fast = env_mode("BK_DECODE", "v1", "v2", NULL) == 2;
	return d;
}

bk_mem_dev bk_mem_dev_host(void)
{
	return (bk_mem_dev){.cuda = 0, .weight_bytes = 4, .act_bytes = 4, .kv_bytes = 4,
			    .linear = 1, .loss = 1};
}

/* ---- items ---- */

static void add(bk_mem_stage *s, int kind, const char *name, const char *site, size_t bytes)
{
	if (!bytes)
		return;
	if (s->n == BK_MEM_MAX_ITEMS)
		BUG("memory plan of %s: more than %d items", s->stage, BK_MEM_MAX_ITEMS);
	s->item[s->n++] = (bk_mem_item){name, site, bytes, kind};
}

static void finish(bk_mem_stage *s)
{
	s->weights = s->load = s->other = 0;
	for (int i = 0; i < s->n; i++) {
		size_t b = s->item[i].bytes;
		if (s->item[i].kind == BK_MEM_WEIGHTS)
			s->weights += b;
		else if (s->item[i].kind == BK_MEM_LOAD)
			s->load += b;
		else
			s->other += b;
	}
	size_t a = s->weights + s->load, b = s->weights + s->other;
	s->peak = a > b ? a : b;
}

static void begin(bk_mem_stage *s, const char *stage)
{
	memset(s, 0, sizeof *s);
	s->stage = stage;
}

static size_t max2(size_t a, size_t b) { return a > b ? a : b; }
static size_t max3(size_t a, size_t b, size_t c) { return max2(a, max2(b, c)); }
static size_t cdiv(size_t a, size_t b) { return (a + b - 1) / b; }
static size_t carve(size_t b) { return (b + 255) & ~(size_t)255; } /* cuda_loss.cu carve_size */
static size_t grown(size_t b) { return b + b / 4; } /* a grown workspace: bytes + bytes / 4 */

/* the CUDA ops' four shared workspace slots (cuda_ops.cu bk_cuda_workspace): the largest
 * request of each (invariant 4) */
typedef struct {
	size_t slot[4];
} ws4;

static void ws_req(ws4 *w, int slot, size_t bytes)
{
	w->slot[slot] = max2(w->slot[slot], bytes);
}

static void ws_add(bk_mem_stage *s, const ws4 *w)
{
	static const char *const name[4] = {"workspace slot 0", "workspace slot 1",
					    "workspace slot 2", "workspace slot 3"};
	for (int i = 0; i < 4; i++)
		add(s, BK_MEM_BUF, name[i],
		    "gpu/cuda/cuda_ops.cu bk_cuda_workspace (largest request x 1.25)",
		    w->slot[i] ? grown(w->slot[i]) : 0);
}

/* ---- the model ---- */

static size_t widest(const bk_mem_model *m)
{
	return max3((size_t)m->H, (size_t)m->NH * m->D, (size_t)m->I);
}

static void module_dims(const bk_mem_model *c, int module, size_t *in, size_t *out)
{
	size_t QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	switch (module) {
	case 0: *in = c->H, *out = QD; break;
	case 1:
	case 2: *in = c->H, *out = KVD; break;
	case 3: *in = QD, *out = c->H; break;
	case 4:
	case 5: *in = c->H, *out = c->I; break;
	default: *in = c->I, *out = c->H; break;
	}
}

size_t bk_mem_lora_numbers(const bk_mem_model *m, int r, unsigned targets)
{
	size_t n = 0;
	for (int mod = 0; mod < NMOD; mod++)
		if (targets & (1u << mod)) {
			size_t in, out;
			module_dims(m, mod, &in, &out);
			n += (size_t)r * in + out * (size_t)r;
		}
	return n * (size_t)m->L;
}

/* gpu/model.c bk_model_create: ops->weight_upload of every tensor, rows x cols numbers
 * of weight_bytes (cuda_ops.cu: bf16), and the RoPE tables (ops->alloc).  With 4-bit
 * linears on a GPU (m->q4): each linear's packed codes and statistics
 * (ops->weight_upload_q4, bk_q4_bytes), and one scratch for a linear dequantised to
 * bf16 at a time (the largest) */
static void add_weights(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d)
{
	size_t H = m->H, I = m->I, QD = (size_t)m->NH * m->D, KVD = (size_t)m->NKV * m->D;
	int q4 = m->q4 && d->cuda;
	size_t layer = (q4 ? 0 : QD * H * 2 + KVD * H * 2 + I * H * 3) + 2 * H;
	if (m->qkv_bias)
		layer += QD + 2 * KVD;
	if (m->qk_norm)
		layer += 2 * (size_t)m->D;
	if (m->sandwich)
		layer += 2 * H;
	size_t n = (size_t)m->V * H * (m->tied ? 1 : 2) + H + layer * m->L;
	add(s, BK_MEM_WEIGHTS, "base weights", "gpu/model.c bk_model_create: ops->weight_upload",
	    n * (size_t)d->weight_bytes);
	if (q4) {
		int dq = m->q4_double_quant;
		size_t l4 = 2 * bk_q4_bytes(QD, H, dq) + 2 * bk_q4_bytes(KVD, H, dq) +
			    2 * bk_q4_bytes(I, H, dq) + bk_q4_bytes(H, I, dq);
		add(s, BK_MEM_WEIGHTS, "4-bit base linears",
		    "gpu/model.c bk_model_create: ops->weight_upload_q4", l4 * (size_t)m->L);
		add(s, BK_MEM_BUF, "4-bit dequantisation scratch",
		    "gpu/cuda/cuda_q4.cuh cuda_weight_upload_q4: one linear in bf16", max2(I * H, QD * H) * 2);
	}
	add(s, BK_MEM_BUF, "rope tables", "gpu/model.c bk_model_create: inv_freq(_local)",
	    (size_t)m->D / 2 * 4 * 2);
	if (d->cuda) {
		/* every tensor streams in bf16 through pinned host memory (cuda_wload.cuh),
		 * but for Gemma's (1 + w) norms, computed in fp32 on the host and uploaded
		 * through cuda_weight_upload's device staging: H floats at most */
		if (m->norm_plus_one)
			add(s, BK_MEM_LOAD, "weight staging (load only)",
			    "gpu/cuda/cuda_ops.cu cuda_weight_upload: the staging buffer", H * 4);
		add(s, BK_MEM_ESTIMATE, "CUDA context (estimate)",
		    "the driver: context, cuBLAS handle and workspace, kernels", CUDA_CONTEXT);
	}
}

/* resid's slots in a checkpointed training forward of L layers in segments of seg:
 * gpu/model.c resid_slots (invariant 9) */
static size_t resid_slots(int L, int seg)
{
	if (seg > L)
		seg = L;
	if (seg <= 1)
		return (size_t)L + 1;
	return (size_t)(L / seg + 1 + (L % seg != 0) + seg - 1);
}

size_t bk_mem_acts_bytes(const bk_mem_model *m, int ab, int max_T, int max_r, int mode, int seg)
{
	/* gpu/model.c acts_create, buffer by buffer in its order */
	size_t T = max_T, L = m->L, H = m->H, I = m->I, R = max_r > 0 ? max_r : 1;
	size_t QD = (size_t)m->NH * m->D, KVD = (size_t)m->NKV * m->D, W = widest(m);
	size_t NS = mode ? 1 : L, A = (size_t)ab;
	int fwd = mode == 2, act = ab != 4, reuse = mode == 1 && !act; /* invariants 10-12 */
	size_t b = (3 * T + 1) * 4;
	b += (fwd ? 2 : resid_slots(m->L, mode == 1 ? seg : 1)) * T * H * 4; /* resid */
	b += NS * T * H * 4;                      /* resid2 */
	b += (reuse ? 1 : 2) * NS * T * H * A;    /* ln1, ln2 (one with reuse: invariant 12) */
	b += 2 * NS * T * 4 + T * 4;              /* rstd1, rstd2, rstdf */
	b += 2 * NS * T * QD * A + 2 * NS * T * KVD * A; /* q, att, k, v */
	b += NS * m->NH * T * 4;                  /* lse */
	b += 3 * NS * T * I * A;                  /* gate, up, hmlp */
	b += NS * NMOD * T * R * 4;               /* xa */
	b += T * H * 4 + T * (W + R) * 4;         /* tmp, scratch */
	/* with reuse, dln, datt, dq/dk/dv and dqr/dkr live in slot buffers where they fit
	 * (invariant 11) */
	if (!fwd) {
		b += T * H * 4 + T * I * 4; /* dres, dh */
		b += reuse && I >= H ? 0 : T * H * 4; /* dln */
		b += reuse && I >= QD ? 0 : T * QD * 4; /* datt */
	}
	if ((!fwd && !(reuse && I >= QD + 2 * KVD)) || act)
		b += T * QD * 4 + 2 * T * KVD * 4; /* dq, dk, dv */
	if (act || mode == 0)
		b += 2 * T * I * 4; /* dgate, dup (in place otherwise: model.c invariant 10) */
	if (m->qk_norm) {
		b += NS * T * (QD + KVD) * 4 + NS * T * (size_t)(m->NH + m->NKV) * 4;
		if (!fwd && !(reuse && I >= QD + KVD))
			b += T * (QD + KVD) * 4; /* dqr, dkr */
	}
	if (m->sandwich) {
		b += 2 * NS * T * H * 4 + 2 * NS * T * 4;
		if (!fwd)
			b += T * H * 4;
	}
	return b;
}

/* the CUDA projection paths' own buffers for T tokens, rank R (0: no LoRA), with the
 * backward or not */
static void add_proj(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d, ws4 *w,
		     size_t T, size_t R, int backward, size_t P)
{
	size_t H = m->H, QD = (size_t)m->NH * m->D, KVD = (size_t)m->NKV * m->D, W = widest(m);
	size_t I = m->I, sum_out = max3(QD + 2 * KVD, 2 * I, H);
	if (d->act_bytes != 4) {
		/* cuda_act.cuh aw(): the fp32 q/k/v/o of attention, the bf16 x, dy, xa copies */
		const char *site = "gpu/cuda/cuda_act.cuh aw() (x 1.25)";
		add(s, BK_MEM_BUF, "act: fp32 q, o", site, 2 * grown(T * QD * 4));
		add(s, BK_MEM_BUF, "act: fp32 k, v", site, 2 * grown(T * KVD * 4));
		if (P)
			add(s, BK_MEM_BUF, "act: fp32 prefix k, v", site, 2 * grown(P * KVD * 4));
		add(s, BK_MEM_BUF, "act: bf16 x (dropout)", site, R ? grown(T * W * 2) : 0);
		add(s, BK_MEM_BUF, "act: bf16 A", site, R ? grown(R * W * 2) : 0);
		if (backward) {
			add(s, BK_MEM_BUF, "act: bf16 dy", site, grown(T * W * 2));
			add(s, BK_MEM_BUF, "act: bf16 dxa", site, R ? grown(T * R * 2) : 0);
		}
		return;
	}
	if (d->linear == 1) {
		ws_req(w, 0, T * W * 2); /* cuda_ops.cu linear_forward / _backward: bf16 x, dy */
		return;
	}
	/* v2 / v3 (cuda_proj.cuh pw()) */
	const char *site = "gpu/cuda/cuda_proj.cuh pw() (x 1.25)";
	add(s, BK_MEM_BUF, "proj: bf16 x", site, grown(T * W * 2));
	if (R) {
		size_t ain = max3(3 * R * H, R * QD, R * I);
		add(s, BK_MEM_BUF, "proj: bf16 A stack", site, grown(ain * 2));
	}
	size_t dyb = R ? T * W * 2 : 0;
	if (backward) {
		dyb = max2(dyb, T * sum_out * 2);
		if (R) {
			add(s, BK_MEM_BUF, "proj: bf16 xa", site, grown(T * 3 * R * 2));
			add(s, BK_MEM_BUF, "proj: dxa", site, grown(T * 3 * R * 4));
			add(s, BK_MEM_BUF, "proj: bf16 B", site, grown(max3(QD, I, H) * R * 2));
			add(s, BK_MEM_BUF, "proj: dA stack, fp32 A stack", site,
			    2 * grown(3 * R * W * 4));
		}
		if (d->linear == 3) /* built on a group's first backward, kept */
			add(s, BK_MEM_BUF, "v3: stacked weight copies",
			    "gpu/cuda/cuda_proj.cuh: qkv and gate/up W_cat, bf16",
			    (size_t)m->L * (QD + 2 * KVD + 2 * I) * H * 2);
	}
	add(s, BK_MEM_BUF, "proj: bf16 dy", site, dyb ? grown(dyb) : 0);
}

/* the CUDA attention's workspace requests for T tokens */
static void attn_ws(const bk_mem_model *m, const bk_mem_dev *d, ws4 *w, size_t T, int backward)
{
	if (!backward)
		return; /* the forward kernels need none (tc: a schedule of n ints in slot 0) */
	ws_req(w, 3, (size_t)m->NH * T * 4); /* Di [NH,T] */
	if (d->attn_tc) {
		ws_req(w, 0, 2 * cdiv(T, 64) * 4);
		if (m->NH != m->NKV) { /* per query head dK, dV partials [NH,T,D] */
			ws_req(w, 1, (size_t)m->NH * T * m->D * 4);
			ws_req(w, 2, (size_t)m->NH * T * m->D * 4);
		}
	}
}

/* ---- bk-step ---- */

void bk_mem_plan_step(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		      const bk_mem_step *o)
{
	begin(s, "bk-step");
	add_weights(s, m, d);
	size_t n = bk_mem_lora_numbers(m, o->r, o->targets), H = m->H, V = m->V;
	size_t T = o->max_T, N = o->rows;
	add(s, BK_MEM_BUF, "LoRA A, B", "gpu/model.c lora_alloc: flat", n * 4);
	add(s, BK_MEM_BUF, "LoRA gradients", "gpu/model.c lora_alloc (bk_lora_create_like)", n * 4);
	if (!o->optim8) {
		add(s, BK_MEM_BUF, "AdamW m, v (fp32)", "gpu/train.c optim_create", 2 * n * 4);
	} else {
		size_t blk = o->optim_block ? (size_t)o->optim_block : Q8_BLOCK, nb = 0;
		for (int mod = 0; mod < NMOD; mod++)
			if (o->targets & (1u << mod)) {
				size_t in, out;
				module_dims(m, mod, &in, &out);
				nb += (cdiv((size_t)o->r * in, blk) + cdiv(out * (size_t)o->r, blk)) *
				      (size_t)m->L;
			}
		add(s, BK_MEM_BUF, "AdamW 8-bit codes and absmax", "gpu/train.c optim_create",
		    2 * (n ? n : 1) + 2 * (nb ? nb : 1) * 4);
	}
	add(s, BK_MEM_BUF, o->grad_checkpoint > 1 ? "activations (checkpointed in segments)"
			   : o->grad_checkpoint ? "activations (checkpointed)" : "activations",
	    "gpu/model.c bk_acts_create_ckpt (gpu/train.c bk_trainer_reserve)",
	    bk_mem_acts_bytes(m, d->act_bytes, o->max_T, o->r, o->grad_checkpoint ? 1 : 0,
			      o->grad_checkpoint));
	/* the trainer's hidden states and their gradient: the acts' tmp (bk_acts_hidden) */
	/* gpu/train.c loss_reserve: the rows of the largest micro-batch */
	size_t cap = N, per = o->k > 0 ? (size_t)o->k : o->k == 0 ? V : 0;
	/* hrows, trows, drows: in the acts' dh (bk_acts_spare) when 3 H <= I */
	add(s, BK_MEM_BUF, "loss rows", "gpu/train.c loss_reserve: rows, hrows, trows, "
	    "drows, tk_rest", cap * 4 * 2 + (3 * H <= (size_t)m->I ? 0 : 3 * cap * H * 4));
	add(s, BK_MEM_BUF, "teacher fields", "gpu/train.c loss_reserve: tk_ids, tk_logp",
	    cap * per * 8);
	if (!d->cuda) {
		finish(s);
		return;
	}
	ws4 w = {{0}};
	add_proj(s, m, d, &w, T, (size_t)o->r, 1, 0);
	attn_ws(m, d, &w, T, 1);
	int C = o->vocab_chunk > 0 ? o->vocab_chunk : 4096;
	size_t nh = N * H, nc = N * (size_t)(C < m->V ? C : m->V);
	if (d->loss == 1) { /* cuda_loss.cu v1 */
		if (o->k > 0) {
			ws_req(&w, 0, carve(nh * 2) + carve(nc * 2));
			ws_req(&w, 1, nc * 4);
			ws_req(&w, 2, N * (size_t)o->k * 4);
			ws_req(&w, 3, carve(N * 8) * 6 + carve(N * 4));
		} else {
			ws_req(&w, 0, carve(nh * 2) * 2 + carve(nc * 2));
			ws_req(&w, 1, nc * 4);
			if (o->k < 0)
				ws_req(&w, 2, nc * 4);
			ws_req(&w, 3, carve(N * 8) * 5 + carve(N * 4));
		}
	} else { /* v2: rows in blocks of whole vocabulary rows */
		int sides = o->k < 0 ? 2 : 1;
		size_t nb = LOSS_V2_BUDGET / (V * (4 * (size_t)sides + 2));
		nb = nb < 1 ? 1 : nb > N ? N : nb;
		size_t nbv = nb * V;
		if (o->k > 0) {
			ws_req(&w, 0, nh * 2);
			ws_req(&w, 1, nbv * 4);
			ws_req(&w, 2, carve(nbv * 2) + carve(nb * (size_t)o->k * 4));
			ws_req(&w, 3, carve((N + 1) * 8) + carve(N * 8) * 2 + carve(N * 4));
		} else {
			ws_req(&w, 0, carve(nh * 2) * sides);
			ws_req(&w, 1, carve(nbv * 4) * sides);
			ws_req(&w, 2, nbv * 2);
			ws_req(&w, 3, carve((N + 1) * 8) + carve(N * 4));
		}
	}
	ws_add(s, &w);
	add(s, BK_MEM_BUF, "gradient norm scratch", "gpu/cuda/cuda_optim.cu sumsq_scratch",
	    2 * (cdiv(n, SQ_CHUNK) + 1) * 8);
	finish(s);
}

/* ---- bk-teach ---- */

void bk_mem_plan_teach(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		       const bk_mem_teach *o)
{
	begin(s, "bk-teach");
	add_weights(s, m, d);
	size_t T = o->max_T, N = o->rows, H = m->H, V = m->V;
	size_t KVD = (size_t)m->NKV * m->D, P = o->P > 0 ? (size_t)o->P : 0;
	size_t per = o->k > 0 ? (size_t)o->k : V;
	add(s, BK_MEM_BUF, o->fwd_only ? "activations (forward)" : "activations (training-sized)",
	    o->fwd_only ? "gpu/teach.c ensure_acts: bk_acts_create_fwd"
			: "gpu/model.c bk_acts_create",
	    bk_mem_acts_bytes(m, d->act_bytes, (int)T, 0, o->fwd_only ? 2 : 0, 1));
	add(s, BK_MEM_BUF, "hidden", "gpu/teach.c ensure_acts: hidden", T * H * 4);
	size_t cap = N; /* ensure_rows: the largest batch's rows */
	add(s, BK_MEM_BUF, "teacher rows",
	    "gpu/teach.c ensure_rows: rowidx, rows, logp, ids, rest",
	    cap * 4 + cap * H * 4 + cap * per * 4 + (o->k > 0 ? cap * per * 4 + cap * 4 : 0));
	add(s, BK_MEM_BUF, "prefix K, V", "gpu/model.c bk_model_prefix_build",
	    2 * (size_t)m->L * P * KVD * (size_t)d->act_bytes);
	if (d->cuda) {
		ws4 w = {{0}};
		add_proj(s, m, d, &w, T, 0, 0, P);
		ws_req(&w, 0, N * H * 2); /* cuda_loss.cu teacher_topk / _logprobs: bf16 rows */
		if (o->k > 0) {
			size_t nb = TOPK_SCRATCH / V;
			nb = nb < 1 ? 1 : nb > N ? N : nb;
			ws_req(&w, 1, nb * V * 4); /* a row block's logits */
		}
		ws_add(s, &w);
	}
	finish(s);
}

/* ---- bk-gen ---- */

static long nblk(long n) { return (n + GEN_BLOCK - 1) / GEN_BLOCK; }

long bk_mem_kv_blocks(int max_batch, int max_prompt, int max_new, int ntraj, int P)
{
	/* gpu/gen.c need_entry / need_sample: an entry holds its prompt's blocks past the
	 * prefix's full ones, a sample at most nblk(max_new) + 1 of its own; running samples
	 * may come from max_batch entries, and ceil(max_batch / ntraj) more are prefilled
	 * ahead of them */
	long MB = max_batch, nt = ntraj > 0 ? ntraj : 1, pre = P > 0 ? P / GEN_BLOCK : 0;
	long entries = MB + (MB + nt - 1) / nt;
	return nblk(P) + entries * (nblk(max_prompt) - pre) + MB * (nblk(max_new) + 1);
}

size_t bk_mem_kv_block_bytes(const bk_mem_model *m, int kv_bytes)
{
	return (size_t)m->L * GEN_BLOCK * (size_t)m->NKV * m->D * (size_t)kv_bytes;
}

/* the rounding of gpu/gen.c ws_ensure / draws_ensure */
static size_t round_up(size_t n, size_t to) { return cdiv(n, to) * to; }

static size_t pow2_ge(size_t n)
{
	size_t p = 1;
	while (p < n)
		p <<= 1;
	return p;
}

void bk_mem_plan_gen(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		     const bk_mem_gen *o)
{
	begin(s, "bk-gen");
	add_weights(s, m, d);
	size_t H = m->H, I = m->I, V = m->V, QD = (size_t)m->NH * m->D,
	       KVD = (size_t)m->NKV * m->D;
	size_t bb = bk_mem_kv_block_bytes(m, d->kv_bytes);
	long blocks = o->kv_memory ? (long)(o->kv_memory / (2 * bb))
				   : bk_mem_kv_blocks(o->max_batch, o->max_prompt, o->max_new,
						      o->ntraj, o->P);
	add(s, BK_MEM_BUF, "KV pool", "gpu/gen.c pool_grow: K and V pools",
	    2 * (size_t)(blocks + (d->decode_fast ? 1 : 0)) * bb);
	/* one step: max_batch decoding tokens and the prompts prefilled to start the next
	 * max_batch samples (gpu/gen.c bk_gen_step) */
	size_t MB = o->max_batch, nt = o->ntraj > 0 ? o->ntraj : 1, ahead = cdiv(MB, nt);
	size_t own = o->max_prompt - (o->P > 0 && o->P < o->max_prompt ? o->P : 0);
	size_t T = round_up(MB + ahead * own, 64), S = round_up(MB + ahead, 16);
	size_t R = o->r > 0 ? o->r : 1;
	size_t nh = m->NH > 1 ? m->NH : 1;
	add(s, BK_MEM_BUF, "step workspace", "gpu/gen.c ws_ensure: x .. logits",
	    T * (3 * H + 2 * QD + 2 * KVD + 3 * I + nh + R) * 4 + S * (2 * H + V) * 4 +
		    (5 * T + S) * 4);
	size_t Wt = nblk(o->max_prompt + o->max_new);
	add(s, BK_MEM_BUF, "block tables", "gpu/gen.c table_ensure", 2 * S * Wt * 4);
	size_t ND = round_up(MB + ahead * nt, 16); /* draws: running + new samples */
	size_t swork = 0;
	if (d->cuda) {
		/* cuda_sample.cu bk_cuda_sample_work_bytes */
		size_t vp = pow2_ge(V), blk = (V * 8 + vp * 12 + 64 + 15) & ~(size_t)15;
		swork = (ND < SMP_MAX_BLOCKS ? ND : SMP_MAX_BLOCKS) * blk;
	}
	add(s, BK_MEM_BUF, "draws and sampler work", "gpu/gen.c draws_ensure (sample_work_bytes)",
	    ND * 20 + swork);
	if (o->teacher_k > 0) /* the top-k runs on the step's logits in place (cuda_loss.cu) */
		add(s, BK_MEM_BUF, "teacher top-k of a step's rows",
		    "gpu/gen.c score_ensure: ids, logp, rest", S * ((size_t)o->teacher_k * 8 + 4));
	if (d->cuda) {
		if (d->decode_fast) /* only BK_DECODE=v2's linears use it */
			add(s, BK_MEM_BUF, "decode linear scratch", "gpu/cuda/cuda_gen.cu lin2_scratch",
			    (size_t)64 * 2 * L2_TARGET_BLOCKS * 64 * 4 + L2_NCNT * 4);
		size_t NC = cdiv(Wt * GEN_BLOCK, ATT_CH), nth = T * (size_t)m->NH;
		size_t att = nth * NC * ((size_t)m->D + 2) * 4;
		add(s, BK_MEM_BUF, "decode attention workspace",
		    "gpu/cuda/cuda_gen.cu att_workspace (x 1.5)", att + att / 2);
		if (d->decode_fast)
			add(s, BK_MEM_BUF, "fast step inputs and sampler work",
			    "gpu/gen.c fast_inputs", (5 * T + 4 * ND + S * Wt) * 4 + ND * 4 + swork);
	}
	finish(s);
}

/* ---- printing ---- */

static double mib(size_t b) { return (double)b / (1 << 20); }

void bk_mem_print(const bk_mem_stage *s, void *file)
{
	FILE *f = file;
	fprintf(f, "# %s\n", s->stage);
	for (int i = 0; i < s->n; i++) {
		const bk_mem_item *it = &s->item[i];
		fprintf(f, "#   %-34s %10.1f MiB  %s\n", it->name, mib(it->bytes), it->site);
	}
	fprintf(f, "#   %-34s %10.1f MiB  (weights %.1f + the rest %.1f)\n", "peak", mib(s->peak),
		mib(s->weights), mib(s->peak - s->weights));
}

/* ---- a bake ---- */

size_t bk_mem_parse_size(const char *s)
{
	/* decimal digits and one point only: strtod would take " 24", "0x10", "1e3", "inf" */
	size_t n = strspn(s, "0123456789.");
	const char *dot = memchr(s, '.', n);
	if (!n || (dot && memchr(dot + 1, '.', n - (size_t)(dot - s) - 1)))
		return 0;
	char *end;
	double v = strtod(s, &end);
	if (end != s + n || !(v > 0))
		return 0;
	if (!*end && v < 1 << 20)
		return 0; /* "24": bytes without a unit, surely not meant */
	double mul = 1;
	if (*end) {
		const char *u = "KMGT", *q = strchr(u, *end >= 'a' ? *end - 32 : *end);
		if (!q)
			return 0;
		int e = (int)(q - u) + 1;
		end++;
		int dec = 0;
		if (!strcmp(end, "iB") || !*end)
			dec = 0;
		else if (!strcmp(end, "B"))
			dec = 1;
		else
			return 0;
		for (int i = 0; i < e; i++)
			mul *= dec ? 1000.0 : 1024.0;
	}
	if (v * mul > 1e18)
		return 0;
	return (size_t)(v * mul);
}

/* the stages side by side: the sum of their peaks, with one shared copy of the weights
 * the weights once (each stage's peak less its weights, plus the weights) */
static size_t side_by_side(const bk_mem_fit *f, int shared)
{
	size_t n = 0, w = 0;
	for (int i = 0; i < f->n_st; i++) {
		n += f->st[i].peak - (shared ? f->st[i].weights : 0);
		w = max2(w, f->st[i].weights);
	}
	return n + (shared ? w : 0);
}

static void plan_bake(const bk_mem_model *m, const bk_mem_dev *d, const bk_mem_bake *b,
		      bk_mem_fit *f)
{
	int B = f->batch, nt = b->paired ? 1 : b->ntraj, mn = b->paired ? b->max_resp : b->max_new;
	long seqs = (long)B * nt;
	f->n_st = 0;
	if (!b->paired) {
		bk_mem_gen g = {.max_batch = f->gen_batch, .max_prompt = b->max_t,
				.max_new = b->max_new, .ntraj = b->ntraj, .r = 0,
				.teacher_k = b->gen_scores ? b->top_k : 0};
		bk_mem_plan_gen(&f->st[f->n_st++], m, d, &g);
	}
	/* bk-teach (a teacher top-k or full field, top_k >= 0): a bk-lens batch (B prompts'
	 * trajectories) per group, packed under its budget; no credit taken for the prefix.
	 * top_k < 0: the exact KL, bk-step runs the teacher (no bk-teach) on the teacher's
	 * sequences, longer than the student's; bk-gen scoring: no bk-teach */
	if (b->top_k >= 0 && !(b->gen_scores && !b->paired)) {
		long tt = seqs * (b->max_t + mn - 1), one = b->max_t + mn - 1;
		if (tt > b->teach_budget)
			tt = b->teach_budget > one ? b->teach_budget : one;
		long rows = seqs * mn; /* a forward's rows are some of its tokens */
		bk_mem_teach t = {.max_T = (int)tt, .rows = (int)(rows < tt ? rows : tt), .k = b->top_k,
				  .P = b->P, .fwd_only = 1};
		bk_mem_plan_teach(&f->st[f->n_st++], m, d, &t);
	}
	/* bk-step's activations: the student's micro-batch, or in exact mode one teacher
	 * sequence when that is longer (gpu/train.c teacher_rows runs the teacher in
	 * chunks of at most that many tokens) */
	long step_T = seqs * (b->max_s + mn);
	if (b->top_k < 0 && b->max_t + mn > step_T)
		step_T = b->max_t + mn;
	bk_mem_step s = {.r = b->r, .targets = b->targets, .optim8 = b->optim8,
			 .grad_checkpoint = f->grad_ckpt, .max_T = (int)step_T,
			 .rows = (int)(seqs * mn), .k = b->top_k < 0 ? -1 : b->top_k};
	bk_mem_plan_step(&f->st[f->n_st++], m, d, &s);
	f->peak = 0;
	for (int i = 0; i < f->n_st; i++)
		f->peak = max2(f->peak, f->st[i].peak);
	if (!f->sequential)
		f->peak = side_by_side(f, b->shared);
}

/* the checkpoint segment bk-bake chooses for L layers: the K that keeps the fewest
 * layer inputs (about L / K + K: K near sqrt(L)); 1 when none keeps fewer than L + 1 */
static int seg_len(int L)
{
	int best = 1;
	for (int k = 2; k <= L; k++)
		if (resid_slots(L, k) < resid_slots(L, best))
			best = k;
	return best;
}

/* the largest divisor of b below b (1 for a prime) */
static int smaller_divisor(int b)
{
	for (int d = b / 2; d > 1; d--)
		if (b % d == 0)
			return d;
	return 1;
}

static double gib(size_t b) { return (double)b / (1u << 30); }

/* the bytes the stages may plan for: side by side, a GPU of 8 GiB or more keeps 1 GiB
 * back for what the plan of several processes cannot see (each allocator's slack and
 * fragmentation, the contexts beyond the estimate); one after another, all of it */
static size_t room(const bk_mem_bake *b, int sequential)
{
	size_t g = (size_t)1 << 30;
	return sequential || b->gpu < 8 * g ? b->gpu : b->gpu - g;
}

/* the choices of bk_mem_fit_bake, without the refusal */
static void fit_choose(const bk_mem_model *m, const bk_mem_dev *d, const bk_mem_bake *b,
		       bk_mem_fit *f)
{
	memset(f, 0, sizeof *f);
	f->grad_ckpt = b->grad_ckpt;
	f->batch = b->batch;
	f->grad_accum = b->grad_accum;
	f->gen_batch = b->gen_batch;
	f->sequential = b->paired; /* paired data: bk-teach writes a file, then bk-step */
	plan_bake(m, d, b, f);
	if (!b->gpu) {
		f->fits = -1;
		return;
	}
	/* bk-gen's batch halves down to one prompt's samples (num_trajectories): below that
	 * its decode runs a prompt's trajectories one after another, several times slower
	 * than the stages one after another through files (Gemma-7B r 64 on 24 GiB: batch 1) */
	int gen_floor = b->ntraj > 1 ? b->ntraj : 1;
	if (gen_floor > b->gen_batch)
		gen_floor = b->gen_batch > 1 ? b->gen_batch : 1;
	for (int seq = b->paired; seq <= 1; seq++) {
		f->sequential = seq;
		f->grad_ckpt = b->grad_ckpt;
		f->batch = b->batch;
		f->grad_accum = b->grad_accum;
		f->gen_batch = b->gen_batch;
		for (;;) {
			plan_bake(m, d, b, f);
			if (f->peak <= room(b, seq))
				break;
			/* the stage that sets the peak, when one after another */
			const bk_mem_stage *top = &f->st[0];
			for (int i = 1; i < f->n_st; i++)
				if (f->st[i].peak > top->peak)
					top = &f->st[i];
			int gen_counts = !b->paired && (!seq || top == &f->st[0]);
			int step_top = !seq || !strcmp(top->stage, "bk-step");
			if (!f->grad_ckpt && b->can_ckpt && step_top)
				f->grad_ckpt = 1;
			else if (f->grad_ckpt == 1 && b->can_seg && step_top && seg_len(m->L) > 1)
				f->grad_ckpt = seg_len(m->L); /* the same result, before a split */
			else if (gen_counts && f->gen_batch > gen_floor)
				f->gen_batch = max2((size_t)gen_floor, (size_t)(f->gen_batch + 1) / 2);
			else if (f->batch > 1 && strcmp(top->stage, "bk-gen")) {
				int nb = smaller_divisor(f->batch);
				f->grad_accum = f->grad_accum * (f->batch / nb);
				f->batch = nb;
			} else
				break;
		}
		if (f->peak <= room(b, seq))
			break;
	}
	f->fits = f->peak <= room(b, f->sequential);
	char *c = f->chose;
	size_t cn = sizeof f->chose, o = 0;
	c[0] = 0;
#define SAY(...) (o += (size_t)snprintf(c + o, o < cn ? cn - o : 0, __VA_ARGS__))
	if (f->grad_ckpt && !b->grad_ckpt)
		SAY("%sgradient checkpointing", o ? "; " : "");
	if (f->grad_ckpt > 1)
		SAY("%sits checkpoints every %d layers (bk-step --grad-checkpoint-every %d: the "
		    "same result, about one more forward a step)", o ? "; " : "", f->grad_ckpt,
		    f->grad_ckpt);
	if (f->gen_batch != b->gen_batch)
		SAY("%sbk-gen --max-batch %d (its KV cache)", o ? "; " : "", f->gen_batch);
	if (f->batch != b->batch)
		SAY("%smicro-batches of %d prompt%s x %d accumulation steps (per_device_train_batch_"
		    "size %d x gradient_accumulation_steps %d: the same steps)", o ? "; " : "",
		    f->batch, f->batch == 1 ? "" : "s", f->grad_accum, b->batch, b->grad_accum);
	if (f->sequential && !b->paired)
		SAY("%sthe GPU stages one after another through files (%s: side by side they need "
		    "%.1f GiB)", o ? "; " : "",
		    b->shared ? "one shared copy of the weights" : "each loads its own copy of the weights",
		    gib(side_by_side(f, b->shared)));
#undef SAY
}

/* whether the bake fits with one field changed (the choices made again) */
static int fits_as(const bk_mem_model *m, const bk_mem_dev *d, const bk_mem_bake *b,
		   size_t *peak)
{
	bk_mem_fit *g = malloc(sizeof *g);
	if (!g)
		die("out of memory");
	fit_choose(m, d, b, g);
	int ok = g->fits == 1;
	*peak = g->peak;
	free(g);
	return ok;
}

/* the changes of the tool's config a refusal may name: the field, its candidate values
 * for a bake (best first: the least change), how it is set, how it is said */
enum { CH_R, CH_OPTIM8, CH_TRAJ, CH_TOPK, CH_N };

static int change_values(int ch, const bk_mem_bake *b, int *v, int cap)
{
	int n = 0;
	switch (ch) {
	case CH_R: { /* powers of two below lora_r */
		int r0 = 1;
		while (r0 * 2 < b->r)
			r0 *= 2;
		for (int r = r0; r >= 1 && r < b->r && n < cap; r /= 2)
			v[n++] = r;
		break;
	}
	case CH_OPTIM8:
		if (!b->optim8)
			v[n++] = 1;
		break;
	case CH_TRAJ: /* halved, down to 16 (paired data: the responses are the data's) */
		for (int t = b->max_new / 2; !b->paired && t >= 16 && n < cap; t /= 2)
			v[n++] = t;
		break;
	default: /* a smaller top-k, or one for the exact KL or the full field */
		if (b->top_k <= 0 || b->top_k > 16)
			for (int k = b->top_k <= 0 || b->top_k > 256 ? 256 : b->top_k / 2;
			     k >= 16 && n < cap; k /= 2)
				v[n++] = k;
	}
	return n;
}

static void change_set(int ch, bk_mem_bake *c, int v)
{
	if (ch == CH_R)
		c->r = v;
	else if (ch == CH_OPTIM8)
		c->optim8 = v;
	else if (ch == CH_TRAJ)
		c->max_new = v;
	else
		c->top_k = v;
}

static int change_say(int ch, int v, char *buf, size_t cap)
{
	static const char *const fmt[CH_N] = {"lower lora_r to %d", "set optim: adamw_8bit",
					      "lower trajectory_length to %d",
					      "set teacher_top_k: %d"};
	return snprintf(buf, cap, fmt[ch], v);
}

/* the fields of the tool's config whose change alone makes the bake fit, each with the
 * value that does and the peak it gives, ", or "-joined into buf ("" for none): 4-bit
 * base linears (load_in_4bit, when the stages can and the model is not already), else
 * each of a lower lora_r (a power of two), the 8-bit AdamW, a shorter trajectory_length
 * (halved), a smaller teacher_top_k, alone, or failing that with load_in_4bit */
static void suggest(const bk_mem_model *m0, const bk_mem_dev *d, const bk_mem_bake *b,
		    char *buf, size_t cap)
{
	size_t o = 0, peak;
	buf[0] = 0;
#define SAY(...) (o += (size_t)snprintf(buf + o, o < cap ? cap - o : 0, __VA_ARGS__))
	bk_mem_model m4 = *m0;
	int can4 = !m0->q4 && b->can_q4;
	if (can4) {
		m4.q4 = 1;
		m4.q4_double_quant = 1; /* the tool's bnb_4bit_use_double_quant */
		if (fits_as(&m4, d, b, &peak)) {
			SAY("set load_in_4bit: true (peak %.2f GiB)", gib(peak));
			return;
		}
	}
	for (int ch = 0; ch < CH_N; ch++) {
		int v[16], n = change_values(ch, b, v, 16);
		for (int with4 = 0; with4 <= can4; with4++) {
			int found = 0;
			for (int i = 0; i < n && !found; i++) {
				bk_mem_bake c = *b;
				change_set(ch, &c, v[i]);
				if (!fits_as(with4 ? &m4 : m0, d, &c, &peak))
					continue;
				char what[64];
				change_say(ch, v[i], what, sizeof what);
				SAY("%s%s%s (peak %.2f GiB)", o ? ", or " : "",
				    with4 ? "set load_in_4bit: true and " : "", what, gib(peak));
				found = 1;
			}
			if (found)
				break;
		}
	}
#undef SAY
}

void bk_mem_fit_bake(const bk_mem_model *m, const bk_mem_dev *d, const bk_mem_bake *b,
		     bk_mem_fit *f)
{
	fit_choose(m, d, b, f);
	if (f->fits)
		return;
	const bk_mem_stage *top = &f->st[0];
	for (int i = 1; i < f->n_st; i++)
		if (f->st[i].peak > top->peak)
			top = &f->st[i];
	char what[512];
	suggest(m, d, b, what, sizeof what);
	const char *fields = what[0] ? "" : "no one change of load_in_4bit, lora_r, optim, "
					    "trajectory_length or teacher_top_k makes it fit";
	if (top->weights >= b->gpu) {
		snprintf(f->refuse, sizeof f->refuse,
			 "the model's weights alone take %.1f GiB of the GPU's %.1f GiB; %s%s%s "
			 "use a GPU with more memory or a smaller model", gib(top->weights),
			 gib(b->gpu), what, fields, what[0] ? ", or" : ":");
		return;
	}
	snprintf(f->refuse, sizeof f->refuse,
		 "%s alone needs %.2f GiB of the GPU's %.2f GiB (%.1f GiB of weights)%s%s%s; %s%s%s "
		 "use a GPU with more memory", top->stage, gib(top->peak), gib(b->gpu),
		 gib(top->weights), f->grad_ckpt ? " with gradient checkpointing" : "",
		 f->batch < b->batch ? " and micro-batches of " : "",
		 f->batch < b->batch ? (f->batch == 1 ? "1 prompt" : "fewer prompts") : "", what,
		 fields, what[0] ? ", or" : ":");
}

void bk_mem_fit_print(const bk_mem_fit *f, const bk_mem_bake *b, void *file)
{
	FILE *o = file;
	for (int i = 0; i < f->n_st; i++)
		bk_mem_print(&f->st[i], o);
	fprintf(o, "# the pipe:");
	for (int i = 0; i < f->n_st; i++)
		fprintf(o, "%s %s %.2f GiB", i ? (f->sequential ? "," : " +") : "", f->st[i].stage,
			gib(f->st[i].peak));
	fprintf(o, f->sequential ? " (one after another: the largest)\n" : " (side by side)\n");
	if (f->n_st > 1 && b->shared) /* gpu/wshare.h */
		fprintf(o, "# one copy of the weights (%.2f GiB) mapped by every stage: side by side "
			"%.2f GiB, each with its own copy %.2f GiB\n", gib(f->st[0].weights),
			gib(side_by_side(f, 1)), gib(side_by_side(f, 0)));
	else if (f->n_st > 1)
		fprintf(o, "# each stage loads its own copy of the weights (BK_SHARE_WEIGHTS=0): side "
			"by side %.2f GiB, with one shared copy %.2f GiB\n", gib(side_by_side(f, 0)),
			gib(side_by_side(f, 1)));
	if (f->chose[0])
		fprintf(o, "# chose: %s\n", f->chose);
	if (f->fits < 0)
		fprintf(o, "fits: unknown, peak %.2f GiB (give --gpu-memory SIZE)\n", gib(f->peak));
	else
		fprintf(o, "fits: %s, peak %.2f GiB of %.2f GiB\n", f->fits ? "yes" : "no",
			gib(f->peak), gib(b->gpu));
}
