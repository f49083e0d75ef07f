/* bakemem.c - see bakemem.h. */
#include "gpu/bakemem.h"

#include <string.h>

#include "common/diag.h"
#include "formats/stream.h"
#include "gpu/model.h"
#include "gpu/wshare.h"

bk_mem_model bk_mem_model_of(const bk_config *c)
{
	return (bk_mem_model){.H = c->hidden_size, .I = c->intermediate_size, .L = c->n_layers,
			      .NH = c->n_heads, .NKV = c->n_kv_heads, .D = c->head_dim,
			      .V = c->vocab_size, .tied = c->tie_word_embeddings,
			      .qkv_bias = c->qkv_bias, .qk_norm = c->qk_norm,
			      .sandwich = c->sandwich, .norm_plus_one = c->norm_plus_one};
}

void bk_bake_token_lengths(const char *path, int *max_t, int *max_s, int *max_resp,
			   int *sys_tokens)
{
	bk_reader *r = bk_reader_open(path);
	const msgpack_object *o = bk_reader_prov(r, "system_tokens");
	*sys_tokens = o && o->type == MSGPACK_OBJECT_POSITIVE_INTEGER ? (int)o->via.u64 : 0;
	*max_t = *max_s = *max_resp = 0;
	int32_t *ids = NULL;
	size_t cap = 0, n;
	const msgpack_object *rec;
	while ((rec = bk_reader_next(r))) {
		n = bk_rec_ids(r, rec, "t_prompt", &ids, &cap);
		*max_t = (int)n > *max_t ? (int)n : *max_t;
		n = bk_rec_ids(r, rec, "s_prompt", &ids, &cap);
		*max_s = (int)n > *max_s ? (int)n : *max_s;
		if (bk_rec_ids_opt(r, rec, "resp", &ids, &cap, &n))
			*max_resp = (int)n > *max_resp ? (int)n : *max_resp;
	}
	free(ids);
	bk_reader_close(r);
}

/* enum bk_lora_module bits of "q_proj,v_proj" or "all-linear" */
static unsigned targets_of(const char *list)
{
	unsigned t = 0;
	char *copy = xstrdup(list), *save = NULL;
	for (char *tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
		if (!strcmp(tok, "all-linear"))
			t |= BK_LORA_ALL;
		for (int m = 0; m < BK_LORA_NMOD; m++)
			if (!strcmp(tok, bk_lora_module_names[m]))
				t |= 1u << m;
	}
	free(copy);
	return t;
}

void bk_bake_mem_shape(bk_mem_bake *b, const bk_bake_plan *p, const bk_bake_caps *caps,
		       int paired, int max_t, int max_s, int max_resp, int sys_tokens,
		       size_t gpu)
{
	memset(b, 0, sizeof *b);
	b->batch = (int)p->batch_size;
	b->grad_accum = (int)p->grad_accum;
	b->ntraj = (int)p->num_trajectories;
	b->max_new = (int)p->trajectory_length;
	b->r = (int)p->lora_r;
	b->top_k = (int)p->top_k;
	b->gen_scores = !paired && bk_bake_gen_scores(p);
	b->optim8 = p->optim_8bit;
	b->grad_ckpt = p->grad_checkpoint;
	b->can_ckpt = caps->grad_checkpoint;
	b->can_seg = caps->grad_ckpt_every;
	b->can_q4 = caps->load_4bit;
	b->targets = targets_of(p->target_modules);
	b->max_t = max_t;
	b->max_s = max_s;
	b->P = sys_tokens > 0 && sys_tokens < max_t ? sys_tokens : 0;
	/* bk-teach --max-tokens on a GPU: forwards of about 1024 tokens (3 trajectories of
	 * 300) still fill the GEMMs; its default 4096 held 4x the activations */
	b->teach_budget = BK_BAKE_TEACH_TOKENS;
	/* bk-gen --max-batch: its default (64), at most the samples one optimizer step takes
	 * (the KV pool is bounded by what the stream needs: bk-step consumes a step's
	 * samples at a time, so a larger decode batch only runs further ahead of it) */
	long step = (long)p->batch_size * (p->grad_accum > 0 ? p->grad_accum : 1) *
		    (p->num_trajectories > 0 ? p->num_trajectories : 1);
	b->gen_batch = (int)(step < 64 ? step : 64);
	b->paired = paired;
	b->max_resp = max_resp;
	b->gpu = gpu;
	b->shared = bk_wshare_enabled(); /* the stages' default; BK_SHARE_WEIGHTS=0 */
}

void bk_bake_mem_apply(const bk_mem_fit *f, const bk_mem_bake *b, bk_bake_plan *p,
		       bk_bake_cmds *c)
{
	p->grad_checkpoint = f->grad_ckpt;
	p->batch_size = f->batch;
	p->grad_accum = f->grad_accum;
	c->teach_max_tokens = b->teach_budget;
	if (b->paired)
		return;
	c->gen_max_batch = f->gen_batch != 64 ? f->gen_batch : 0; /* 64: the default */
	c->gen_max_prompt = b->max_t;
	c->sequential = f->sequential;
}
