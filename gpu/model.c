/* model.c - the transformer of the supported families (Llama, Qwen2/3, Gemma 1-3) over a
 * packed batch: forward, LoRA backward, logits and
 * the shared-prefix K/V, written only in terms of the ops table (gpu/ops.h).
 * Not the loss, not the optimizer, not a checkpoint loader.
 *
 * Design note.
 *
 * One layer l (x = resid[l], all [T,*] buffers row-major, dims as in ops.h):
 *     ln1    = rmsnorm(x; attn_norm)                       saved: ln1[l], rstd1[l]
 *     q,k,v  = ln1 Wq^T, ln1 Wk^T, ln1 Wv^T  (+ LoRA)      saved: xa[l][Q,K,V]
 *     q,k    = rope(q), rope(k)  (in place)                saved: q[l], k[l], v[l]
 *     att    = attention(q, k, v; cu_seqlens, prefix)      saved: att[l], lse[l]
 *     resid2 = x + att Wo^T (+ LoRA)                       saved: resid2[l], xa[l][O]
 *     ln2    = rmsnorm(resid2; mlp_norm)                   saved: ln2[l], rstd2[l]
 *     gate,up = ln2 Wg^T, ln2 Wu^T (+ LoRA)                saved: gate[l], up[l], xa
 *     h      = silu(gate) * up                             saved: hmlp[l]
 *     resid[l+1] = resid2 + h Wd^T (+ LoRA)                saved: resid[l+1], xa[l][DOWN]
 * and at the end out_hidden = rmsnorm(resid[L]; final_norm), saved: rstdf.
 *
 * Family deltas (bk_llama_config; each off for a plain Llama):
 *     x      = embed[ids] * embed_scale                    (Gemma)
 *     q,k,v += bq, bk, bv  after the linears               (Qwen2; frozen: no backward op)
 *     q,k    = rmsnorm per head over D of the raw q, k     (Qwen3, Gemma-3) before RoPE;
 *                                                          saved: qraw, kraw, rstdq/k
 *     RoPE   with the layer's inverse frequencies          (Gemma-3: local on sliding
 *                                                          layers, global on full ones)
 *     att    with the layer's bk_attn: scale, softcap, sliding window
 *     resid2 = x + rmsnorm(att Wo^T; post_attn_norm)       (sandwich, Gemma-2/3);
 *                                                          saved: oout, rstd3
 *     h      = gelu_tanh(gate) * up                        (GeGLU, Gemma)
 *     resid[l+1] = resid2 + rmsnorm(h Wd^T; post_mlp_norm) (sandwich); saved: dout, rstd4
 * Gemma's (1 + w) norm weights are folded by the loader (gpu/load.c), so the norms
 * here are plain.
 *
 * The backward walks the same list upwards with one running gradient dres = dLoss/d
 * (current residual stream): the residual add passes dres unchanged to both branches,
 * and every branch's input gradient is added into it by rmsnorm_backward.  Base weights
 * get no gradient; LoRA A/B gradients are added into `grads`.
 *
 * Gradient checkpointing (bk_acts_create_ckpt): the forward keeps every resid[l] (each
 * layer's input) and rstdf, but the per-layer activations above get ONE slot that each
 * layer overwrites.  The backward of layer l first reruns layer l's forward from
 * resid[l] into that slot (its output goes to tmp, resid[l+1] is left alone; the last
 * layer's activations are still there from the forward), then runs the layer's
 * backward as without checkpointing.  The rerun issues the same ops on the same inputs
 * with the same dropout keys, so activations and gradients are the same bits.  Cost:
 * L-1 more layer forwards per backward (and with fp32 acts one rmsnorm per layer,
 * invariant 12); saving: L-1 of the L layers' activations, and with fp32 acts most of
 * the backward's workspace (invariants 10-12; bk_acts_bytes tells what the acts
 * allocated).
 *
 * Invariants:
 *  1. acts are sized once for max_T tokens and rank max_r; a step allocates nothing.
 *  2. bk_model_backward uses the activations of the last bk_model_forward on the same
 *     acts, which must have had the same lora and batch (checked: T, S, lora pointer).
 *  3. A forward with a prefix is never followed by a backward (checked): the prefix is
 *     the frozen teacher's, and lse then covers keys the backward does not revisit.
 *  4. The dropout mask of (layer, module) is keyed by (batch->dropout_key, layer,
 *     module): forward, recompute and backward get the same mask; nothing else is
 *     random.
 *  5. Token ids are checked against V and cu_seqlens for monotonicity before anything
 *     reaches the ops (bad input dies here, not inside a kernel).
 *  6. Per-layer buffers have n_slot slots (L, or 1 with checkpointing); layer l uses
 *     slot slot(l) = l or 0, whose [T,W] activation starts at slot * max_T * W; lse of
 *     a slot is [NH,T] with row stride T (the current batch's T).  resid has L+1 slots
 *     (two forward only, invariant 8; fewer with segments, invariant 9).
 *  7. The "act" buffers (ln1, ln2, q, k, v, att, gate, up, hmlp, the prefix K/V) have
 *     elements of m->act_bytes: 4 (fp32) on the host twin and with BK_ACT=fp32, so every
 *     op, address and bit is as without this invariant; 2 (bf16) with BK_ACT=bf16 on
 *     CUDA, where they are written and read only by the ops' *_act variants and their
 *     addresses are computed in bytes (lay_act).  Design and list: gpu/cuda/cuda_act.cuh.
 *     In bf16 mode the projections of q/k/v and gate/up write fp32 into the backward's
 *     dq/dk/dv and dgate/dup (unused during a forward: the backward zeroes them before
 *     use), from where RoPE, to_act and the GLU store the bf16 activations.
 *  8. Acts made for a forward only (bk_acts_create_fwd: the teacher, a prefix) have one
 *     slot, resid in two slots used in turn (layer l reads slot l % 2 and writes the
 *     other), and none of the backward's workspace but, in bf16 mode, the dq/dk/dv and
 *     dgate/dup of invariant 7; a backward on them is a BUG.
 *  9. Checkpointing in segments of K layers (bk_acts_create_ckpt(..., K), K >= 2): resid
 *     keeps the inputs of layers 0, K, 2K, .. and resid[L] (the boundaries), plus K-1
 *     slots for the other layers of one segment (resid_at).  The forward writes the
 *     inner inputs of each segment over the previous one's; before the backward of a
 *     segment's top layer, its inner inputs are rerun from its boundary (unless they
 *     are still the forward's: seg_valid), with the same ops and dropout keys as the
 *     forward, so the gradients are the same bits as with K = 1.  Cost: about one more
 *     forward of every layer; saving: all but L/K + K of the L+1 residual slots.
 * 10. With checkpointing and fp32 activations the GLU backward writes dgate and dup over
 *     the slot's gate and up (the ops allow it) instead of two more [T,I] buffers; the
 *     slot then no longer holds a forward (slot_layer = -1), so a second backward of
 *     the same forward reruns every layer and adds the same gradient again.  Without
 *     checkpointing the slots are the forward's record and are never written.
 * 11. In the same mode (checkpointing, fp32 activations: a->reuse) the backward's
 *     workspaces live in slot buffers that are dead while they are alive, each only
 *     where it fits (I >= its width; else it has its own buffer): datt [T,QD] in dh (dh
 *     dies with the GLU backward, datt is born at the o_proj backward); dln [T,H] in the
 *     slot's hmlp (dead after the down_proj backward); dq, dk, dv [T,QD+2KVD] one after
 *     the other in the slot's gate and, with qk_norm, dqr, dkr [T,QD+KVD] in its up
 *     (dgate and dup, invariant 10, die with the gate/up backward).  Nothing of them
 *     outlives a layer's backward (only dres does), so the next layer's rerun may write
 *     the slot.  bk_acts_free frees the owners only (a->alias).
 * 12. In that mode ln1 and ln2 share one buffer: the forward's ln2 overwrites ln1 once
 *     the q/k/v projections have read it, and the backward recomputes ln1 (the forward's
 *     rmsnorm_forward from resid[l], so the same bits, rstd1 rewritten with its own
 *     value) right before the q/k/v backward, when ln2 is dead.  Cost: one rmsnorm per
 *     layer per backward.
 * 13. Between a forward and the backward two buffers are free, in every mode: tmp [T,H]
 *     from the end of a forward (which may write its out_hidden there) until the
 *     backward's first layer rerun, after the final norm's backward has read d_hidden
 *     (bk_acts_hidden: the trainer's hidden states and their gradient); and, on
 *     training acts, dh [T,I], which no forward writes, until the first layer's
 *     backward (bk_acts_spare: the trainer's loss rows, gpu/train.c).
 */
#include "gpu/model.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"

const char *const bk_lora_module_names[BK_LORA_NMOD] = {
	"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj",
};

struct bk_acts {
	int max_T, max_r;
	int n_slot;           /* per-layer slots: L, or 1 with checkpointing (invariant 6) */
	int fwd_only;         /* forward only: two resid slots, no backward workspace (inv. 8) */
	int slot_layer;       /* with one slot: the layer whose activations it holds */
	int L, seg;           /* layers; checkpoint segment length (invariant 9), else 1 */
	int seg_valid;        /* the segment whose inner resid slots hold its inputs, -1 */
	size_t bytes;         /* device bytes allocated */
	/* what the last forward saw (invariant 2) */
	int T, S, has_forward, used_prefix;
	const bk_lora *lora;
	int train;
	uint64_t dropout_key;
	/* the batch, on the device */
	int32_t *ids, *pos; /* [max_T] */
	int32_t *cu;        /* [max_T+1] */
	/* saved activations: resid per layer boundary, the rest per slot (stride max_T * width) */
	float *resid;         /* [L+1][T,H] */
	float *resid2;        /* [n_slot][T,H] */
	int act_bytes;        /* the elements of the act buffers (invariant 7) */
	void *ln1, *ln2;      /* [n_slot][T,H] act */
	float *rstd1, *rstd2; /* [n_slot][T] */
	float *rstdf;         /* [T] */
	void *q;              /* [n_slot][T,NH*D] act, after RoPE */
	void *k, *v;          /* [n_slot][T,NKV*D] act, k after RoPE */
	void *att;            /* [n_slot][T,NH*D] act, attention output (input of o_proj) */
	float *lse;           /* [n_slot][NH,T] */
	void *gate, *up, *hmlp; /* [n_slot][T,I] act */
	float *xa;            /* [n_slot][NMOD][T,R] */
	/* only with cfg.qk_norm: q and k before their norm, and the norms' rstd */
	float *qraw, *kraw;   /* [n_slot][T,NH*D], [n_slot][T,NKV*D] */
	float *rstdq, *rstdk; /* [n_slot][T*NH], [n_slot][T*NKV] */
	/* only with cfg.sandwich: o_proj and down_proj outputs before their norms */
	float *oout, *dout;   /* [n_slot][T,H] */
	float *rstd3, *rstd4; /* [n_slot][T] */
	/* workspace */
	float *tmp;     /* [T,H] a branch output before the residual add */
	float *scratch; /* [T, max(H, NH*D, I) + R] for LoRA ops */
	float *dres, *dln;    /* [T,H] */
	float *dq, *datt;     /* [T,NH*D] */
	float *dk, *dv;       /* [T,NKV*D] */
	float *dgate, *dup, *dh; /* [T,I] */
	float *dqr, *dkr;     /* [T,NH*D], [T,NKV*D] (qk_norm) */
	float *dtmp;          /* [T,H] (sandwich) */
	int reuse;            /* checkpointing with fp32 acts: invariants 10-12 */
	unsigned alias;       /* ALIAS_* bits: workspaces living in other buffers (inv. 11, 12) */
};

/* the bk_acts buffers that, when their bit is set in a->alias, point into another one */
enum { ALIAS_DATT = 1, ALIAS_DLN = 2, ALIAS_DQKV = 4, ALIAS_DQKR = 8, ALIAS_LN2 = 16 };

/* ---- model ---- */

void bk_model_module_dims(const bk_llama_config *c, int module, int *in, int *out)
{
	switch (module) {
	case BK_LORA_Q: *in = c->H, *out = c->NH * c->D; break;
	case BK_LORA_K:
	case BK_LORA_V: *in = c->H, *out = c->NKV * c->D; break;
	case BK_LORA_O: *in = c->NH * c->D, *out = c->H; break;
	case BK_LORA_GATE:
	case BK_LORA_UP: *in = c->H, *out = c->I; break;
	case BK_LORA_DOWN: *in = c->I, *out = c->H; break;
	default: BUG("bad lora module %d", module);
	}
}

static bk_weight *up(const bk_ops *ops, const bk_weight_source *src, int layer, int id,
		     int rows, int cols)
{
	bk_bf16_fill fill;
	void *fctx;
	/* a bf16 device: the checkpoint's numbers chunk by chunk, no host copy of the tensor */
	if (ops->weight_upload_bf16 && src->bf16 &&
	    src->bf16(src->ctx, layer, id, rows, cols, &fill, &fctx))
		return ops->weight_upload_bf16(rows, cols, fill, fctx);
	const float *p = src->get(src->ctx, layer, id, rows, cols);
	BUG_ON(!p);
	bk_weight *w = ops->weight_upload(p, rows, cols);
	if (src->put)
		src->put(src->ctx, p);
	return w;
}

/* a base linear: 4-bit (quantised here from the source's fp32 values) when cfg->q4 */
static bk_weight *up_linear(const bk_ops *ops, const bk_weight_source *src,
			    const bk_q4_config *q4, int layer, int id, int rows, int cols)
{
	if (!q4->type)
		return up(ops, src, layer, id, rows, cols);
	bk_q4 q;
	if (src->no_numbers) { /* placed, not read: the shape is all the ops look at */
		bk_q4_shape(&q, rows, cols, q4->type, q4->double_quant);
		return ops->weight_upload_q4(&q, q4->compute_bf16);
	}
	const float *p = src->get(src->ctx, layer, id, rows, cols);
	BUG_ON(!p);
	float *r = NULL; /* compute dtype bf16: quantised from the bf16 values (quant4.h) */
	if (q4->compute_bf16) {
		size_t n = (size_t)rows * cols;
		r = xmalloc(n * sizeof(float));
		for (size_t i = 0; i < n; i++)
			r[i] = bk_q4_bf16_round(p[i]);
	}
	bk_q4_quantize(&q, r ? r : p, rows, cols, q4->type, q4->double_quant, q4->threads);
	free(r);
	if (src->put)
		src->put(src->ctx, p);
	bk_weight *w = ops->weight_upload_q4(&q, q4->compute_bf16);
	bk_q4_free(&q);
	return w;
}

/* the source over a bk_llama_weights */
static const float *struct_get(void *ctx, int layer, int id, int rows, int cols)
{
	(void)rows, (void)cols;
	const bk_llama_weights *w = ctx;
	if (layer < 0)
		return id == BK_W_EMBED ? w->embed : id == BK_W_FINAL_NORM ? w->final_norm
									   : w->lm_head;
	const bk_llama_layer_weights *lw = &w->layers[layer];
	const float *const by_id[BK_W_LAYER_N] = {
		lw->wq, lw->wk, lw->wv, lw->wo, lw->w_gate, lw->w_up, lw->w_down,
		lw->attn_norm, lw->mlp_norm, lw->bq, lw->bk, lw->bv, lw->q_norm, lw->k_norm,
		lw->post_attn_norm, lw->post_mlp_norm,
	};
	BUG_ON(id < 0 || id >= BK_W_LAYER_N);
	return by_id[id];
}

bk_model *bk_model_create(const bk_ops *ops, const bk_llama_config *cfg,
			  const bk_llama_weights *w)
{
	bk_weight_source src = {struct_get, NULL, (void *)w, NULL, 0};
	return bk_model_create_from(ops, cfg, &src);
}

bk_model *bk_model_create_from(const bk_ops *ops, const bk_llama_config *cfg,
			       const bk_weight_source *src)
{
	const bk_llama_config *c = cfg;
	if (c->H <= 0 || c->I <= 0 || c->L <= 0 || c->NH <= 0 || c->NKV <= 0 || c->D <= 0 ||
	    c->V <= 0)
		die("model config: a dimension is not positive (H %d I %d L %d NH %d NKV %d D %d V %d)",
		    c->H, c->I, c->L, c->NH, c->NKV, c->D, c->V);
	if (c->NH % c->NKV)
		die("model config: num_attention_heads %d is not a multiple of num_key_value_heads %d",
		    c->NH, c->NKV);
	if (c->D % 2)
		die("model config: head_dim %d is odd", c->D);
	bk_model *m = xcalloc(1, sizeof(*m));
	m->ops = ops;
	m->cfg = *cfg;
	m->act_bytes = ops->act_bytes ? ops->act_bytes() : 4; /* invariant 7 */
	if (m->act_bytes != 4 &&
	    (m->act_bytes != 2 || !ops->rmsnorm_forward_act || !ops->rope_forward_act ||
	     !ops->to_act || !ops->glu_forward_act || !ops->glu_backward_act ||
	     !ops->attention_forward_act || !ops->attention_backward_act ||
	     !ops->proj_forward_act || !ops->proj_backward_act))
		BUG("ops %s: act_bytes %d without every act op", ops->name, m->act_bytes);
	m->inv_freq_host = xmalloc(c->D / 2 * sizeof(float));
	memcpy(m->inv_freq_host, cfg->inv_freq, c->D / 2 * sizeof(float));
	m->cfg.inv_freq = m->inv_freq_host;
	m->inv_freq = bk_alloc(ops, c->D / 2 * sizeof(float), "rope tables");
	ops->upload(m->inv_freq, m->inv_freq_host, c->D / 2 * sizeof(float));
	if (cfg->inv_freq_local) {
		m->inv_freq_local_host = xmalloc(c->D / 2 * sizeof(float));
		memcpy(m->inv_freq_local_host, cfg->inv_freq_local, c->D / 2 * sizeof(float));
		m->cfg.inv_freq_local = m->inv_freq_local_host;
		m->inv_freq_local = bk_alloc(ops, c->D / 2 * sizeof(float), "rope tables");
		ops->upload(m->inv_freq_local, m->inv_freq_local_host, c->D / 2 * sizeof(float));
	}
	if (cfg->window) {
		m->window_host = xmalloc(c->L * sizeof(int));
		memcpy(m->window_host, cfg->window, c->L * sizeof(int));
		m->cfg.window = m->window_host;
		for (int l = 0; l < c->L; l++)
			if (cfg->window[l] < 0)
				die("model config: layer %d: sliding window %d is negative", l,
				    cfg->window[l]);
	}
	if (c->attn_scale < 0 || c->attn_softcap < 0 || c->final_softcap < 0 || c->embed_scale < 0)
		die("model config: a scale or softcap is negative");
	if (c->q4.type != BK_Q4_NONE && c->q4.type != BK_Q4_NF4 && c->q4.type != BK_Q4_FP4)
		BUG("model config: 4-bit type %d", c->q4.type);
	if (c->q4.type && !ops->weight_upload_q4)
		die("4-bit base weights (load_in_4bit): the %s device has no 4-bit linears", ops->name);

	/* one tensor at a time: got from the source, uploaded, given back (so a loader
	 * holds at most one tensor on the host), or streamed in bf16 chunks (no tensor) */
#define UP(layer, id, r, cc) up(ops, src, layer, id, r, cc)
	m->embed = UP(-1, BK_W_EMBED, c->V, c->H);
	m->final_norm = UP(-1, BK_W_FINAL_NORM, 1, c->H);
	m->lm_head = c->tied ? m->embed : UP(-1, BK_W_LM_HEAD, c->V, c->H);
	m->layers = xcalloc(c->L, sizeof(*m->layers));
	for (int l = 0; l < c->L; l++) {
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(c, mod, &in, &out);
			m->layers[l].w[mod] = up_linear(ops, src, &c->q4, l, mod, out, in);
		}
		bk_layer *ly = &m->layers[l];
		ly->attn_norm = UP(l, BK_W_ATTN_NORM, 1, c->H);
		ly->mlp_norm = UP(l, BK_W_MLP_NORM, 1, c->H);
		if (c->qkv_bias) {
			ly->bq = UP(l, BK_W_BQ, 1, c->NH * c->D);
			ly->bk = UP(l, BK_W_BK, 1, c->NKV * c->D);
			ly->bv = UP(l, BK_W_BV, 1, c->NKV * c->D);
		}
		if (c->qk_norm) {
			ly->q_norm = UP(l, BK_W_Q_NORM, 1, c->D);
			ly->k_norm = UP(l, BK_W_K_NORM, 1, c->D);
		}
		if (c->sandwich) {
			ly->post_attn_norm = UP(l, BK_W_POST_ATTN_NORM, 1, c->H);
			ly->post_mlp_norm = UP(l, BK_W_POST_MLP_NORM, 1, c->H);
		}
#undef UP
		int win = c->window ? c->window[l] : 0;
		ly->attn = bk_attn_default(c->D);
		if (c->attn_scale > 0)
			ly->attn.scale = c->attn_scale;
		ly->attn.softcap = c->attn_softcap;
		ly->attn.window = win;
		ly->inv_freq = win > 0 && m->inv_freq_local ? m->inv_freq_local : m->inv_freq;
	}
	return m;
}

void bk_model_free(bk_model *m)
{
	if (!m)
		return;
	const bk_ops *ops = m->ops;
	for (int l = 0; l < m->cfg.L; l++) {
		for (int mod = 0; mod < BK_LORA_NMOD; mod++)
			ops->weight_free(m->layers[l].w[mod]);
		bk_layer *ly = &m->layers[l];
		bk_weight *ws[] = { ly->attn_norm, ly->mlp_norm, ly->bq, ly->bk, ly->bv,
				    ly->q_norm, ly->k_norm, ly->post_attn_norm, ly->post_mlp_norm };
		for (size_t i = 0; i < sizeof(ws) / sizeof(ws[0]); i++)
			if (ws[i])
				ops->weight_free(ws[i]);
	}
	if (m->lm_head != m->embed)
		ops->weight_free(m->lm_head);
	ops->weight_free(m->embed);
	ops->weight_free(m->final_norm);
	ops->free(m->inv_freq);
	ops->free(m->inv_freq_local);
	free(m->inv_freq_host);
	free(m->inv_freq_local_host);
	free(m->window_host);
	free(m->layers);
	free(m);
}

/* ---- activations ---- */

static float *falloc(const bk_ops *ops, size_t n, const char *name)
{
	return bk_alloc(ops, n * sizeof(float), name);
}

/* an activation buffer of n floats, counted in a->bytes */
static float *aalloc(const bk_ops *ops, bk_acts *a, size_t n)
{
	a->bytes += n * sizeof(float);
	return falloc(ops, n, "activations");
}

/* an act buffer of n elements of a->act_bytes (invariant 7), counted in a->bytes */
static void *aalloc_act(const bk_ops *ops, bk_acts *a, size_t n)
{
	a->bytes += n * a->act_bytes;
	return bk_alloc(ops, n * a->act_bytes, "activations");
}

/* resid slots of a checkpointed training forward of L layers in segments of seg
 * (invariant 9; gpu/memplan.c resid_slots the same) */
static size_t resid_slots(int L, int seg)
{
	if (seg <= 1)
		return (size_t)L + 1;
	return (size_t)(L / seg + 1 + (L % seg != 0) + seg - 1);
}

/* mode 0: training; 1: training with gradient checkpointing (in segments of seg layers
 * when seg > 1, invariant 9); 2: forward only (invariant 8).  The sizes are
 * gpu/memplan.c's bk_mem_acts_bytes: change both. */
static bk_acts *acts_create(const bk_model *m, int max_T, int max_r, int mode, int seg)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	BUG_ON(max_T <= 0 || max_r < 0);
	bk_acts *a = xcalloc(1, sizeof(*a));
	size_t T = max_T, L = c->L, H = c->H, I = c->I, R = max_r > 0 ? max_r : 1;
	size_t QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	size_t widest = H > QD ? H : QD;
	widest = widest > I ? widest : I;
	size_t NS = mode ? 1 : L;
	int fwd = mode == 2, act = m->act_bytes != 4;
	a->max_T = max_T;
	a->max_r = max_r;
	a->n_slot = (int)NS;
	a->fwd_only = fwd;
	a->L = (int)L;
	a->seg = mode == 1 && seg > 1 ? (seg < (int)L ? seg : (int)L) : 1;
	a->seg_valid = -1;
	a->act_bytes = m->act_bytes;
	a->reuse = mode == 1 && !act; /* invariants 10-12 */
	a->ids = bk_alloc(ops, T * sizeof(int32_t), "activations");
	a->pos = bk_alloc(ops, T * sizeof(int32_t), "activations");
	a->cu = bk_alloc(ops, (T + 1) * sizeof(int32_t), "activations");
	a->bytes = (3 * T + 1) * sizeof(int32_t);
	a->resid = aalloc(ops, a, (fwd ? 2 : resid_slots((int)L, a->seg)) * T * H);
	a->resid2 = aalloc(ops, a, NS * T * H);
	a->ln1 = aalloc_act(ops, a, NS * T * H);
	if (a->reuse) /* ln1 recomputed before the q/k/v backward (invariant 12) */
		a->ln2 = a->ln1, a->alias |= ALIAS_LN2;
	else
		a->ln2 = aalloc_act(ops, a, NS * T * H);
	a->rstd1 = aalloc(ops, a, NS * T);
	a->rstd2 = aalloc(ops, a, NS * T);
	a->rstdf = aalloc(ops, a, T);
	a->q = aalloc_act(ops, a, NS * T * QD);
	a->k = aalloc_act(ops, a, NS * T * KVD);
	a->v = aalloc_act(ops, a, NS * T * KVD);
	a->att = aalloc_act(ops, a, NS * T * QD);
	a->lse = aalloc(ops, a, NS * c->NH * T);
	a->gate = aalloc_act(ops, a, NS * T * I);
	a->up = aalloc_act(ops, a, NS * T * I);
	a->hmlp = aalloc_act(ops, a, NS * T * I);
	a->xa = aalloc(ops, a, NS * BK_LORA_NMOD * T * R);
	a->tmp = aalloc(ops, a, T * H);
	a->scratch = aalloc(ops, a, T * (widest + R));
	/* the backward's workspace; a bf16 forward also writes its fp32 q/k/v and
	 * gate/up into dq/dk/dv and dgate/dup (invariant 7) */
	if (!fwd) {
		a->dres = aalloc(ops, a, T * H);
		if (a->reuse && I >= H) /* in the slot's hmlp (invariant 11) */
			a->dln = a->hmlp, a->alias |= ALIAS_DLN;
		else
			a->dln = aalloc(ops, a, T * H);
		a->dh = aalloc(ops, a, T * I);
		if (a->reuse && I >= QD) /* in dh (invariant 11) */
			a->datt = a->dh, a->alias |= ALIAS_DATT;
		else
			a->datt = aalloc(ops, a, T * QD);
	}
	if (!fwd && a->reuse && I >= QD + 2 * KVD) { /* in the slot's gate (invariant 11) */
		a->dq = a->gate;
		a->dk = a->dq + T * QD;
		a->dv = a->dk + T * KVD;
		a->alias |= ALIAS_DQKV;
	} else if (!fwd || act) {
		a->dq = aalloc(ops, a, T * QD);
		a->dk = aalloc(ops, a, T * KVD);
		a->dv = aalloc(ops, a, T * KVD);
	}
	if (act || mode == 0) { /* else the GLU backward runs in place (invariant 10) */
		a->dgate = aalloc(ops, a, T * I);
		a->dup = aalloc(ops, a, T * I);
	}
	if (c->qk_norm) {
		a->qraw = aalloc(ops, a, NS * T * QD);
		a->kraw = aalloc(ops, a, NS * T * KVD);
		a->rstdq = aalloc(ops, a, NS * T * c->NH);
		a->rstdk = aalloc(ops, a, NS * T * c->NKV);
		if (!fwd && a->reuse && I >= QD + KVD) { /* in the slot's up (invariant 11) */
			a->dqr = a->up;
			a->dkr = a->dqr + T * QD;
			a->alias |= ALIAS_DQKR;
		} else if (!fwd) {
			a->dqr = aalloc(ops, a, T * QD);
			a->dkr = aalloc(ops, a, T * KVD);
		}
	}
	if (c->sandwich) {
		a->oout = aalloc(ops, a, NS * T * H);
		a->dout = aalloc(ops, a, NS * T * H);
		a->rstd3 = aalloc(ops, a, NS * T);
		a->rstd4 = aalloc(ops, a, NS * T);
		if (!fwd)
			a->dtmp = aalloc(ops, a, T * H);
	}
	return a;
}

bk_acts *bk_acts_create_ckpt(const bk_model *m, int max_T, int max_r, int checkpoint)
{
	if (checkpoint < 0)
		BUG("acts: checkpoint %d", checkpoint);
	return acts_create(m, max_T, max_r, checkpoint ? 1 : 0, checkpoint);
}

bk_acts *bk_acts_create(const bk_model *m, int max_T, int max_r)
{
	return acts_create(m, max_T, max_r, 0, 1);
}

bk_acts *bk_acts_create_fwd(const bk_model *m, int max_T, int max_r)
{
	return acts_create(m, max_T, max_r, 2, 1);
}

size_t bk_acts_bytes(const bk_acts *a) { return a->bytes; }

float *bk_acts_hidden(bk_acts *a) { return a->tmp; }

float *bk_acts_spare(const bk_model *m, bk_acts *a, size_t *n)
{
	*n = a->dh ? (size_t)a->max_T * m->cfg.I : 0;
	return a->dh;
}

void bk_acts_free(const bk_model *m, bk_acts *a)
{
	if (!a)
		return;
	/* the aliases point into buffers freed below (invariants 11, 12) */
	if (a->alias & ALIAS_LN2)
		a->ln2 = NULL;
	if (a->alias & ALIAS_DLN)
		a->dln = NULL;
	if (a->alias & ALIAS_DATT)
		a->datt = NULL;
	if (a->alias & ALIAS_DQKV)
		a->dq = a->dk = a->dv = NULL;
	if (a->alias & ALIAS_DQKR)
		a->dqr = a->dkr = NULL;
	void *bufs[] = { a->ids, a->pos, a->cu, a->resid, a->resid2, a->ln1, a->ln2,
			 a->rstd1, a->rstd2, a->rstdf, a->q, a->k, a->v, a->att, a->lse,
			 a->gate, a->up, a->hmlp, a->xa, a->tmp, a->scratch, a->dres, a->dln,
			 a->dq, a->datt, a->dk, a->dv, a->dgate, a->dup, a->dh, a->qraw,
			 a->kraw, a->rstdq, a->rstdk, a->dqr, a->dkr, a->oout, a->dout,
			 a->rstd3, a->rstd4, a->dtmp };
	for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
		m->ops->free(bufs[i]);
	free(a);
}

/* the slot of layer l's activations (invariant 6) */
static int slot(const bk_acts *a, int l) { return a->n_slot == 1 ? 0 : l; }

/* resid[l], the input of layer l (l = L: the last layer's output); forward only: one
 * of two slots in turn (invariant 8); in segments: a boundary's own slot, else the
 * segment's inner slot l % K - 1 after the boundaries (invariant 9) */
static float *resid_at(const bk_acts *a, int l, size_t H)
{
	int i = l, k = a->seg;
	if (a->fwd_only) {
		i = l & 1;
	} else if (k > 1) {
		int nb = a->L / k + 1 + (a->L % k != 0);
		i = l % k == 0 ? l / k : l == a->L ? nb - 1 : nb + l % k - 1;
	}
	return a->resid + (size_t)i * a->max_T * H;
}

/* slot s of a per-slot [T,width] buffer, or boundary s of resid (invariant 6) */
static float *lay(const bk_acts *a, float *base, int s, size_t width)
{
	return base + (size_t)s * a->max_T * width;
}

/* slot s of a per-slot [T,width] act buffer (invariants 6 and 7: in bytes) */
static void *lay_act(const bk_acts *a, void *base, int s, size_t width)
{
	return (char *)base + (size_t)s * a->max_T * width * a->act_bytes;
}

static float *xa_of(const bk_acts *a, int l, int mod)
{
	size_t R = a->max_r > 0 ? a->max_r : 1;
	return a->xa + ((size_t)slot(a, l) * BK_LORA_NMOD + mod) * a->max_T * R;
}

/* ---- LoRA ---- */

static bk_lora *lora_alloc(const bk_model *m, int r, float alpha, float dropout,
			   unsigned targets)
{
	const bk_llama_config *c = &m->cfg;
	if (r <= 0)
		die("lora: rank r = %d is not positive", r);
	if (!(dropout >= 0 && dropout < 1))
		die("lora: dropout %g is not in [0,1)", dropout);
	if (targets & ~BK_LORA_ALL)
		BUG("lora: bad target mask %#x", targets);
	bk_lora *lo = xcalloc(1, sizeof(*lo));
	lo->L = c->L;
	lo->r = r;
	lo->alpha = alpha;
	lo->scale = alpha / r;
	lo->dropout = dropout;
	lo->targets = targets;
	lo->A = xcalloc(c->L, sizeof(*lo->A));
	lo->B = xcalloc(c->L, sizeof(*lo->B));
	size_t n = 0;
	for (int pass = 0; pass < 2; pass++) { /* pass 0 counts, pass 1 points */
		n = 0;
		for (int l = 0; l < c->L; l++)
			for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
				if (!(targets & (1u << mod)))
					continue;
				int in, out;
				bk_model_module_dims(c, mod, &in, &out);
				if (pass) {
					lo->A[l][mod] = lo->flat + n;
					lo->B[l][mod] = lo->flat + n + (size_t)r * in;
				}
				n += (size_t)r * in + (size_t)out * r;
			}
		if (!pass) {
			lo->n_flat = n;
			lo->flat = falloc(m->ops, n, "LoRA adapter");
			m->ops->zero(lo->flat, n * sizeof(float));
		}
	}
	return lo;
}

bk_lora *bk_lora_create(const bk_model *m, int r, float alpha, float dropout,
			unsigned targets)
{
	return lora_alloc(m, r, alpha, dropout, targets);
}

bk_lora *bk_lora_create_like(const bk_model *m, const bk_lora *like)
{
	return lora_alloc(m, like->r, like->alpha, like->dropout, like->targets);
}

void bk_lora_free(const bk_model *m, bk_lora *l)
{
	if (!l)
		return;
	m->ops->free(l->flat);
	free(l->A);
	free(l->B);
	free(l);
}

void bk_lora_init_peft(const bk_model *m, bk_lora *lo, uint64_t seed)
{
	float *h = xcalloc(lo->n_flat ? lo->n_flat : 1, sizeof(float));
	bk_rng rng;
	bk_rng_seed(&rng, seed);
	for (int l = 0; l < lo->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			if (!lo->A[l][mod])
				continue;
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			float *A = h + (lo->A[l][mod] - lo->flat), bound = 1.0f / sqrtf((float)in);
			for (size_t i = 0; i < (size_t)lo->r * in; i++)
				A[i] = (float)((2 * bk_rng_uniform(&rng) - 1) * bound);
		}
	m->ops->upload(lo->flat, h, lo->n_flat * sizeof(float));
	free(h);
}

/* ---- forward ---- */

static float lora_p(const bk_lora *lora, const bk_acts *a) { return a->train ? lora->dropout : 0; }

static uint64_t lora_key(const bk_acts *a, int l, int mod)
{
	return bk_crng_key(a->dropout_key, (uint64_t)l, (uint64_t)mod, 0x6c6f7261 /* "lora" */);
}

/* the projection group of modules mod0 .. mod0+n-1 (one input, consecutive in enum
 * order: q/k/v, gate/up, or one module): members with their LoRA (when targeted), y[j]
 * or dy[j] their outputs or output gradients */
static int proj_group(const bk_model *m, const bk_lora *lora, const bk_lora *grads,
		      const bk_acts *a, int l, int mod0, int n, float *const *y,
		      const float *const *dy, bk_proj *p)
{
	int any = 0;
	for (int j = 0; j < n; j++) {
		int mod = mod0 + j;
		const float *A = lora ? lora->A[l][mod] : NULL;
		p[j] = (bk_proj){ .W = m->layers[l].w[mod], .A = A, .B = A ? lora->B[l][mod] : NULL,
				  .key = lora_key(a, l, mod), .y = y ? y[j] : NULL,
				  .dy = dy ? dy[j] : NULL, .dA = A && grads ? grads->A[l][mod] : NULL,
				  .dB = A && grads ? grads->B[l][mod] : NULL };
		any |= A != NULL;
	}
	return any;
}

/* y[j] [T,out_j] = x [T,in] W_j^T (+ LoRA of module mod0+j when targeted), j < n: one
 * proj_forward (or, on a table without it, linear_forward + lora_forward per member,
 * the same function); the group's xa lives in the slots of its modules */
static void linear_fwd(const bk_model *m, const bk_lora *lora, bk_acts *a, int l, int mod0,
		       int n, float *const *y, const void *x /* act */, int T)
{
	bk_proj p[BK_PROJ_MAX];
	int in, out, R = lora ? lora->r : 0;
	int any = proj_group(m, lora, NULL, a, l, mod0, n, y, NULL, p);
	float *xa = any ? xa_of(a, l, mod0) : NULL, sc = lora ? lora->scale : 0;
	float drop = lora ? lora_p(lora, a) : 0;
	bk_model_module_dims(&m->cfg, mod0, &in, &out);
	if (m->act_bytes != 4) { /* bf16 x (invariant 7) */
		m->ops->proj_forward_act(p, n, x, xa, T, in, R, sc, drop, a->scratch);
		return;
	}
	if (m->ops->proj_forward) {
		m->ops->proj_forward(p, n, x, xa, T, in, R, sc, drop, a->scratch);
		return;
	}
	for (int j = 0; j < n; j++) {
		m->ops->linear_forward(p[j].y, x, p[j].W, T);
		if (p[j].A)
			m->ops->lora_forward(p[j].y, xa + (size_t)j * T * R, x, p[j].A, p[j].B, T,
					     in, p[j].W->rows, R, sc, drop, p[j].key, a->scratch);
	}
}

static void check_batch(const bk_model *m, const bk_batch *b, const bk_acts *a, int P)
{
	if (b->T <= 0 || b->T > a->max_T)
		die("model: batch of %d tokens does not fit the %d allocated", b->T, a->max_T);
	if (b->S <= 0 || b->cu_seqlens[0] != 0 || b->cu_seqlens[b->S] != b->T)
		die("model: cu_seqlens must run from 0 to T = %d over S = %d sequences", b->T, b->S);
	for (int s = 0; s < b->S; s++)
		if (b->cu_seqlens[s + 1] < b->cu_seqlens[s])
			die("model: cu_seqlens decreases at sequence %d", s);
	for (int t = 0; t < b->T; t++) {
		if (b->ids[t] < 0 || b->ids[t] >= m->cfg.V)
			die("model: token %d: id %d is not in [0,%d)", t, b->ids[t], m->cfg.V);
		if (b->pos[t] < P)
			die("model: token %d: position %d is inside the %d-token prefix", t,
			    b->pos[t], P);
	}
}

/* the per-slot activations of layer l (slot(l)) */
typedef struct {
	void *ln1, *q, *k, *v, *att, *ln2, *gate, *up, *hm; /* act (invariant 7) */
	float *rstd1, *lse, *resid2, *rstd2;
	float *qraw, *kraw, *rstdq, *rstdk, *oout, *dout, *rstd3, *rstd4; /* or NULL */
} layer_acts;

static layer_acts layer_slot(const bk_model *m, const bk_acts *a, int l)
{
	const bk_llama_config *c = &m->cfg;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	int s = slot(a, l);
	return (layer_acts){
		.ln1 = lay_act(a, a->ln1, s, H), .rstd1 = lay(a, a->rstd1, s, 1),
		.q = lay_act(a, a->q, s, QD), .k = lay_act(a, a->k, s, KVD),
		.v = lay_act(a, a->v, s, KVD), .att = lay_act(a, a->att, s, QD),
		.lse = lay(a, a->lse, s, c->NH), .resid2 = lay(a, a->resid2, s, H),
		.ln2 = lay_act(a, a->ln2, s, H), .rstd2 = lay(a, a->rstd2, s, 1),
		.gate = lay_act(a, a->gate, s, I), .up = lay_act(a, a->up, s, I),
		.hm = lay_act(a, a->hmlp, s, I),
		.qraw = c->qk_norm ? lay(a, a->qraw, s, QD) : NULL,
		.kraw = c->qk_norm ? lay(a, a->kraw, s, KVD) : NULL,
		.rstdq = c->qk_norm ? lay(a, a->rstdq, s, c->NH) : NULL,
		.rstdk = c->qk_norm ? lay(a, a->rstdk, s, c->NKV) : NULL,
		.oout = c->sandwich ? lay(a, a->oout, s, H) : NULL,
		.dout = c->sandwich ? lay(a, a->dout, s, H) : NULL,
		.rstd3 = c->sandwich ? lay(a, a->rstd3, s, 1) : NULL,
		.rstd4 = c->sandwich ? lay(a, a->rstd4, s, 1) : NULL,
	};
}

/* Layer l of the forward recorded in a (T, S, lora, train, dropout key, batch on the
 * device): x = resid[l] [T,H] -> out [T,H] (resid[l+1], or tmp for a recompute: out
 * may alias tmp), saving the layer's activations in its slot.  pk/pv: the layer's
 * prefix K/V [P,NKV,D] or NULL. */
static void layer_forward(const bk_model *m, const bk_lora *lora, bk_acts *a, int l,
			  const void *pk, const void *pv, int P, float *out)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	const bk_layer *w = &m->layers[l];
	int T = a->T;
	size_t H = c->H, I = c->I;
	const float *x = resid_at(a, l, H);
	layer_acts s = layer_slot(m, a, l);
	a->slot_layer = l;
	int act = m->act_bytes != 4; /* bf16 act buffers: the *_act ops (invariant 7) */

	/* attention block */
	if (act)
		ops->rmsnorm_forward_act(s.ln1, s.rstd1, x, w->attn_norm, T, c->H, c->rms_eps);
	else
		ops->rmsnorm_forward(s.ln1, s.rstd1, x, w->attn_norm, T, c->H, c->rms_eps);
	/* the fp32 q, k, v: the saved buffers, or with act the backward's dq, dk, dv */
	float *qf = act ? a->dq : s.q, *kf = act ? a->dk : s.k, *v = act ? a->dv : s.v;
	float *q = c->qk_norm ? s.qraw : qf, *k = c->qk_norm ? s.kraw : kf;
	linear_fwd(m, lora, a, l, BK_LORA_Q, 3, (float *const[]){ q, k, v }, s.ln1, T);
	if (c->qkv_bias) {
		ops->bias_forward(q, w->bq, T);
		ops->bias_forward(k, w->bk, T);
		ops->bias_forward(v, w->bv, T);
	}
	if (c->qk_norm) { /* per head: rows of D */
		ops->rmsnorm_forward(qf, s.rstdq, s.qraw, w->q_norm, T * c->NH, c->D, c->rms_eps);
		ops->rmsnorm_forward(kf, s.rstdk, s.kraw, w->k_norm, T * c->NKV, c->D, c->rms_eps);
	}
	if (act) {
		ops->rope_forward_act(s.q, qf, a->pos, w->inv_freq, T, c->NH, c->D);
		ops->rope_forward_act(s.k, kf, a->pos, w->inv_freq, T, c->NKV, c->D);
		ops->to_act(s.v, v, (size_t)T * c->NKV * c->D);
		ops->attention_forward_act(s.att, s.lse, s.q, s.k, s.v, a->cu, a->S, T, c->NH,
					   c->NKV, c->D, pk, pv, P, &w->attn);
	} else {
		ops->rope_forward(s.q, a->pos, w->inv_freq, T, c->NH, c->D);
		ops->rope_forward(s.k, a->pos, w->inv_freq, T, c->NKV, c->D);
		ops->attention_forward(s.att, s.lse, s.q, s.k, s.v, a->cu, a->S, T, c->NH, c->NKV,
				       c->D, pk, pv, P, &w->attn);
	}
	if (c->sandwich) {
		linear_fwd(m, lora, a, l, BK_LORA_O, 1, &s.oout, s.att, T);
		ops->rmsnorm_forward(a->tmp, s.rstd3, s.oout, w->post_attn_norm, T, c->H,
				     c->rms_eps);
	} else {
		linear_fwd(m, lora, a, l, BK_LORA_O, 1, &a->tmp, s.att, T);
	}
	ops->residual_forward(s.resid2, x, a->tmp, (size_t)T * H);

	/* MLP block */
	if (act) {
		ops->rmsnorm_forward_act(s.ln2, s.rstd2, s.resid2, w->mlp_norm, T, c->H, c->rms_eps);
		linear_fwd(m, lora, a, l, BK_LORA_GATE, 2, (float *const[]){ a->dgate, a->dup },
			   s.ln2, T);
		ops->glu_forward_act(s.hm, s.gate, s.up, a->dgate, a->dup, (size_t)T * I, c->geglu);
	} else {
		ops->rmsnorm_forward(s.ln2, s.rstd2, s.resid2, w->mlp_norm, T, c->H, c->rms_eps);
		linear_fwd(m, lora, a, l, BK_LORA_GATE, 2, (float *const[]){ s.gate, s.up }, s.ln2,
			   T);
		if (c->geglu)
			ops->geglu_forward(s.hm, s.gate, s.up, (size_t)T * I);
		else
			ops->swiglu_forward(s.hm, s.gate, s.up, (size_t)T * I);
	}
	if (c->sandwich) {
		linear_fwd(m, lora, a, l, BK_LORA_DOWN, 1, &s.dout, s.hm, T);
		ops->rmsnorm_forward(a->tmp, s.rstd4, s.dout, w->post_mlp_norm, T, c->H,
				     c->rms_eps);
	} else {
		linear_fwd(m, lora, a, l, BK_LORA_DOWN, 1, &a->tmp, s.hm, T);
	}
	ops->residual_forward(out, s.resid2, a->tmp, (size_t)T * H);
}

/* checks the batch, records it in a (invariant 2), uploads it and embeds it into
 * resid[0] */
static void forward_begin(const bk_model *m, const bk_lora *lora, const bk_batch *b,
			  const bk_prefix *prefix, bk_acts *a)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	int T = b->T;
	check_batch(m, b, a, prefix ? prefix->P : 0);
	if (lora && (lora->L != c->L || lora->r > a->max_r))
		BUG("lora with L %d r %d on a model of %d layers, acts for rank %d", lora->L,
		    lora->r, c->L, a->max_r);
	BUG_ON(prefix && prefix->L != c->L);
	a->T = T;
	a->S = b->S;
	a->lora = lora;
	a->train = b->train;
	a->dropout_key = b->dropout_key;
	a->used_prefix = prefix != NULL;
	a->has_forward = 1;
	ops->upload(a->ids, b->ids, T * sizeof(int32_t));
	ops->upload(a->pos, b->pos, T * sizeof(int32_t));
	ops->upload(a->cu, b->cu_seqlens, (b->S + 1) * sizeof(int32_t));
	ops->embedding_forward(a->resid, a->ids, m->embed, T);
	if (c->embed_scale > 0 && c->embed_scale != 1)
		ops->scale(a->resid, c->embed_scale, (size_t)T * c->H);
}

void bk_model_forward(const bk_model *m, const bk_lora *lora, const bk_batch *b,
		      const bk_prefix *prefix, bk_acts *a, float *out_hidden)
{
	const bk_llama_config *c = &m->cfg;
	size_t H = c->H;
	forward_begin(m, lora, b, prefix, a);
	for (int l = 0; l < c->L; l++)
		layer_forward(m, lora, a, l, prefix ? prefix->k[l] : NULL,
			      prefix ? prefix->v[l] : NULL, prefix ? prefix->P : 0,
			      resid_at(a, l + 1, H));
	a->seg_valid = (c->L - 1) / a->seg * a->seg; /* the last segment's (invariant 9) */
	m->ops->rmsnorm_forward(out_hidden, a->rstdf, resid_at(a, c->L, H), m->final_norm,
				b->T, c->H, c->rms_eps);
}

/* ---- backward ---- */

/* dx [T,in] += dy[j] [T,out_j] W_j (+ LoRA backward, adding into grads' A/B of module
 * mod0+j), j < n: the backward of linear_fwd's group, its members in the same order */
static void linear_bwd(const bk_model *m, const bk_lora *lora, bk_lora *grads, bk_acts *a,
		       int l, int mod0, int n, float *dx, const float *const *dy,
		       const void *x /* act */, int T)
{
	bk_proj p[BK_PROJ_MAX];
	int in, out, R = lora ? lora->r : 0;
	int any = proj_group(m, lora, grads, a, l, mod0, n, NULL, dy, p);
	const float *xa = any ? xa_of(a, l, mod0) : NULL;
	float sc = lora ? lora->scale : 0, drop = lora ? lora_p(lora, a) : 0;
	bk_model_module_dims(&m->cfg, mod0, &in, &out);
	if (m->act_bytes != 4) { /* bf16 x (invariant 7) */
		m->ops->proj_backward_act(dx, p, n, x, xa, T, in, R, sc, drop, a->scratch);
		return;
	}
	if (m->ops->proj_backward) {
		m->ops->proj_backward(dx, p, n, x, xa, T, in, R, sc, drop, a->scratch);
		return;
	}
	for (int j = 0; j < n; j++) {
		m->ops->linear_backward(dx, p[j].dy, p[j].W, T);
		if (p[j].A)
			m->ops->lora_backward(dx, p[j].dA, p[j].dB, p[j].dy, x,
					      xa + (size_t)j * T * R, p[j].A, p[j].B, T, in,
					      p[j].W->rows, R, sc, drop, p[j].key, a->scratch);
	}
}

/* Layer l's backward: a->dres = dLoss/d resid[l+1] on entry, dLoss/d resid[l] on exit;
 * the layer's slot holds its forward activations. */
static void layer_backward(const bk_model *m, const bk_lora *lora, bk_lora *grads,
			   bk_acts *a, int l)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	const bk_layer *w = &m->layers[l];
	int T = a->T;
	size_t H = c->H, I = c->I, QD = (size_t)c->NH * c->D, KVD = (size_t)c->NKV * c->D;
	size_t fT = (size_t)T * sizeof(float);
	const float *x = resid_at(a, l, H);
	layer_acts s = layer_slot(m, a, l);

	/* MLP block: dres = d resid[l+1] = d (down output, after its norm when sandwich) */
	const float *dy = a->dres;
	if (c->sandwich) {
		ops->zero(a->dtmp, fT * H);
		ops->rmsnorm_backward(a->dtmp, a->dres, s.dout, w->post_mlp_norm, s.rstd4, T, c->H);
		dy = a->dtmp;
	}
	ops->zero(a->dh, fT * I);
	linear_bwd(m, lora, grads, a, l, BK_LORA_DOWN, 1, a->dh, &dy, s.hm, T);
	float *dgate = a->dgate, *dup = a->dup;
	if (m->act_bytes != 4) {
		ops->zero(dgate, fT * I);
		ops->zero(dup, fT * I);
		ops->glu_backward_act(dgate, dup, a->dh, s.gate, s.up, (size_t)T * I, c->geglu);
	} else {
		if (!dgate) { /* in place over the slot's gate and up (invariant 10) */
			dgate = s.gate, dup = s.up;
			a->slot_layer = -1;
		}
		(c->geglu ? ops->geglu_backward : ops->swiglu_backward)(dgate, dup, a->dh, s.gate,
									 s.up, (size_t)T * I);
	}
	ops->zero(a->dln, fT * H);
	linear_bwd(m, lora, grads, a, l, BK_LORA_GATE, 2, a->dln,
		   (const float *const[]){ dgate, dup }, s.ln2, T);
	ops->rmsnorm_backward(a->dres, a->dln, s.resid2, w->mlp_norm, s.rstd2, T, c->H);

	/* attention block: dres = d resid2 = d (o_proj output, after its norm) */
	dy = a->dres;
	if (c->sandwich) {
		ops->zero(a->dtmp, fT * H);
		ops->rmsnorm_backward(a->dtmp, a->dres, s.oout, w->post_attn_norm, s.rstd3, T, c->H);
		dy = a->dtmp;
	}
	ops->zero(a->datt, fT * QD);
	linear_bwd(m, lora, grads, a, l, BK_LORA_O, 1, a->datt, &dy, s.att, T);
	ops->zero(a->dq, fT * QD);
	ops->zero(a->dk, fT * KVD);
	ops->zero(a->dv, fT * KVD);
	if (m->act_bytes != 4)
		ops->attention_backward_act(a->dq, a->dk, a->dv, a->datt, s.q, s.k, s.v, s.att, s.lse,
					    a->cu, a->S, T, c->NH, c->NKV, c->D, &w->attn);
	else
		ops->attention_backward(a->dq, a->dk, a->dv, a->datt, s.q, s.k, s.v, s.att, s.lse,
					a->cu, a->S, T, c->NH, c->NKV, c->D, &w->attn);
	ops->rope_backward(a->dq, a->pos, w->inv_freq, T, c->NH, c->D);
	ops->rope_backward(a->dk, a->pos, w->inv_freq, T, c->NKV, c->D);
	float *dq = a->dq, *dk = a->dk;
	if (c->qk_norm) {
		ops->zero(a->dqr, fT * QD);
		ops->zero(a->dkr, fT * KVD);
		ops->rmsnorm_backward(a->dqr, a->dq, s.qraw, w->q_norm, s.rstdq, T * c->NH, c->D);
		ops->rmsnorm_backward(a->dkr, a->dk, s.kraw, w->k_norm, s.rstdk, T * c->NKV, c->D);
		dq = a->dqr, dk = a->dkr;
	}
	if (a->alias & ALIAS_LN2) /* ln2 is dead: ln1 again, the same bits (invariant 12) */
		ops->rmsnorm_forward(s.ln1, s.rstd1, x, w->attn_norm, T, c->H, c->rms_eps);
	ops->zero(a->dln, fT * H);
	linear_bwd(m, lora, grads, a, l, BK_LORA_Q, 3, a->dln,
		   (const float *const[]){ dq, dk, a->dv }, s.ln1, T);
	ops->rmsnorm_backward(a->dres, a->dln, x, w->attn_norm, s.rstd1, T, c->H);
}

void bk_model_backward(const bk_model *m, const bk_lora *lora, const bk_batch *b,
		       bk_acts *a, const float *d_hidden, bk_lora *grads)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	int T = b->T;
	if (!a->has_forward || a->T != T || a->S != b->S || a->lora != lora)
		BUG("model backward: acts do not hold the forward of this batch and adapter");
	if (a->used_prefix)
		BUG("model backward: the forward used a prefix (forward only)");
	if (a->fwd_only)
		BUG("model backward: acts made for a forward only (bk_acts_create_fwd)");
	if (lora && (!grads || grads->targets != lora->targets || grads->r != lora->r ||
		     grads->L != lora->L))
		BUG("model backward: grads do not have the adapter's shape");

	/* final norm: dres = d resid[L] */
	ops->zero(a->dres, (size_t)T * c->H * sizeof(float));
	ops->rmsnorm_backward(a->dres, d_hidden, resid_at(a, c->L, c->H), m->final_norm,
			      a->rstdf, T, c->H);
	for (int l = c->L - 1; l >= 0; l--) {
		int s0 = l / a->seg * a->seg;
		if (a->seg > 1 && a->seg_valid != s0) { /* the segment's inputs (invariant 9) */
			for (int j = s0; j < l; j++)
				layer_forward(m, lora, a, j, NULL, NULL, 0, resid_at(a, j + 1, c->H));
			a->seg_valid = s0;
		}
		if (a->n_slot == 1 && a->slot_layer != l) /* checkpointing: rerun layer l */
			layer_forward(m, lora, a, l, NULL, NULL, 0, a->tmp);
		layer_backward(m, lora, grads, a, l);
	}
}

void bk_model_logits(const bk_model *m, const float *hidden, float *logits, int T)
{
	m->ops->linear_forward(logits, hidden, m->lm_head, T);
	if (m->cfg.final_softcap > 0)
		m->ops->softcap_forward(logits, m->cfg.final_softcap, (size_t)T * m->cfg.V);
}

/* ---- shared prefix ---- */

bk_prefix *bk_model_prefix_build(const bk_model *m, bk_acts *a, const int32_t *ids, int P)
{
	const bk_ops *ops = m->ops;
	const bk_llama_config *c = &m->cfg;
	if (P <= 0 || P > a->max_T)
		die("model: prefix of %d tokens does not fit the %d allocated", P, a->max_T);
	size_t KVD = (size_t)c->NKV * c->D;
	int32_t *pos = xmalloc(P * sizeof(int32_t)), cu[2] = { 0, P };
	for (int t = 0; t < P; t++)
		pos[t] = t;
	bk_batch b = { .T = P, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu };
	bk_prefix *p = xcalloc(1, sizeof(*p));
	p->P = P;
	p->L = c->L;
	p->k = xcalloc(c->L, sizeof(*p->k));
	p->v = xcalloc(c->L, sizeof(*p->v));
	/* the base model's layers one by one, keeping each layer's K and V before the next
	 * layer may reuse its slot (invariant 6); no final norm */
	forward_begin(m, NULL, &b, NULL, a);
	for (int l = 0; l < c->L; l++) {
		layer_forward(m, NULL, a, l, NULL, NULL, 0, resid_at(a, l + 1, c->H));
		layer_acts s = layer_slot(m, a, l);
		size_t bytes = P * KVD * m->act_bytes; /* invariant 7 */
		p->k[l] = bk_alloc(ops, bytes, "prefix k, v");
		p->v[l] = bk_alloc(ops, bytes, "prefix k, v");
		ops->copy(p->k[l], s.k, bytes);
		ops->copy(p->v[l], s.v, bytes);
	}
	a->has_forward = 0; /* acts now hold no forward a backward could use */
	free(pos);
	return p;
}

void bk_prefix_free(const bk_model *m, bk_prefix *p)
{
	if (!p)
		return;
	for (int l = 0; l < p->L; l++) {
		m->ops->free(p->k[l]);
		m->ops->free(p->v[l]);
	}
	free(p->k);
	free(p->v);
	free(p);
}
