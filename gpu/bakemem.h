/* bakemem.h - bk-bake's memory plan: the shape of a bake from its mapped config
 * (formats/config_yaml.h) and its tokenized data, the plan and fit of its GPU stages
 * (gpu/memplan.h), and the choices applied to the stages' commands
 * (formats/bakeplan.h).  No processes here (cmd/bk-bake.c runs them). */
#ifndef BK_BAKEMEM_H
#define BK_BAKEMEM_H

#include "formats/bakeplan.h"
#include "formats/hfconfig.h"
#include "gpu/memplan.h"

/* bk-teach --max-tokens in a bake on a GPU (gpu/memplan.c plans bk-teach for it) */
enum { BK_BAKE_TEACH_TOKENS = 1024 };

/* the buffer-sizing numbers of a config.json */
bk_mem_model bk_mem_model_of(const bk_config *c);

/* The longest t_prompt, s_prompt and resp of a bk-tokenize stream, and its header's
 * system_tokens (0 when absent). */
void bk_bake_token_lengths(const char *path, int *max_t, int *max_s, int *max_resp,
			   int *sys_tokens);

/* The bake's shape for the memory plan; lengths from bk_bake_token_lengths (or
 * assumed), gpu the GPU's bytes (0: unknown). */
void bk_bake_mem_shape(bk_mem_bake *b, const bk_bake_plan *p, const bk_bake_caps *caps,
		       int paired, int max_t, int max_s, int max_resp, int sys_tokens,
		       size_t gpu);

/* Applies the fit's choices: gradient checkpointing, the micro-batch split into
 * p's batch_size and grad_accum; bk-teach's --max-tokens, bk-gen's --max-batch and
 * --max-prompt (the KV plan) and the one-after-another run into c (rebuild the
 * commands after). */
void bk_bake_mem_apply(const bk_mem_fit *f, const bk_mem_bake *b, bk_bake_plan *p,
		       bk_bake_cmds *c);

#endif
