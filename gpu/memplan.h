/* memplan.h - the device memory plan of the GPU stages (bk-gen, bk-teach, bk-step),
 * computed before anything is allocated from the model's shape (config.json) and the
 * stage's flags: every buffer the code allocates, sized as its allocation site sizes
 * it, each item naming that site.  Pure host C: no device, no weights.
 * Not an allocator (the stages allocate through their ops table); the choice of what
 * to change so that a bake fits (bk_mem_fit_bake) is here, bk-bake's wiring of it in
 * gpu/bakemem.c.
 *
 * Invariants:
 *  1. An item's bytes are what the site passes to its allocator for the given shape
 *     (including the site's own growth rule: the CUDA workspace slots' 1.25x headroom;
 *     the trainer's and bk-teach's rows are sized exactly), so a stage that runs with
 *     at most the planned shape allocates at most the plan.
 *  2. Items of kind BK_MEM_ESTIMATE are not allocations (the CUDA context); they are
 *     counted in the total and said to be estimates.
 *  3. Items of kind BK_MEM_LOAD exist only while the weights load (the staging buffer);
 *     the peak is max(weights + load items, everything but load items).
 *  4. The workspace slots shared by the CUDA ops (bk_cuda_workspace) hold the largest
 *     request of any op the stage runs, times 1.25; one item per slot. */
#ifndef BK_MEMPLAN_H
#define BK_MEMPLAN_H

#include <stddef.h>
#include <stdint.h>

/* the model's shape: the numbers of gpu/model.h's bk_llama_config that size buffers */
typedef struct {
	int H, I, L, NH, NKV, D, V;
	int tied, qkv_bias, qk_norm, sandwich;
	int norm_plus_one; /* Gemma's (1 + w) norms: loaded in fp32 through the device staging */
	int q4, q4_double_quant; /* load_in_4bit: the 7 base linears of every layer in 4 bits
				  * (gpu/quant4.h bk_q4_bytes on a GPU; the host twin
				  * expands them to fp32), with or without double quant */
} bk_mem_model;

/* the device and the environment switches that change what is allocated */
typedef struct {
	int cuda;         /* 1: the CUDA ops (their own workspaces, the context); 0: host twin */
	int weight_bytes; /* 2 (CUDA: bf16 weights) or 4 (host twin) */
	int act_bytes;    /* BK_ACT: 2 (bf16) or 4 (fp32, the default) */
	int kv_bytes;     /* the generation KV cache: 2 (CUDA) or 4 (host) */
	int linear;       /* BK_LINEAR: 1 (default), 2 or 3 (stacked weight copies) */
	int loss;         /* BK_LOSS: 1 (default) or 2 */
	int attn_tc;      /* BK_ATTN=tc */
	int decode_fast;  /* BK_DECODE=v2 */
} bk_mem_dev;

/* the CUDA device of a plan with the defaults, then the environment (BK_ACT, BK_LINEAR,
 * BK_LOSS, BK_ATTN, BK_DECODE) read as the CUDA ops read it; bad values die as they do */
bk_mem_dev bk_mem_dev_cuda_env(void);
/* the host twin */
bk_mem_dev bk_mem_dev_host(void);

enum bk_mem_kind {
	BK_MEM_WEIGHTS,  /* the frozen base weights */
	BK_MEM_BUF,      /* a buffer held while the stage runs */
	BK_MEM_LOAD,     /* only while loading (invariant 3) */
	BK_MEM_ESTIMATE, /* not an allocation (invariant 2) */
};

typedef struct {
	const char *name; /* "kv pool", "activations", ... */
	const char *site; /* "gpu/gen.c pool_grow" */
	size_t bytes;
	int kind;         /* enum bk_mem_kind */
} bk_mem_item;

enum { BK_MEM_MAX_ITEMS = 48 };

typedef struct {
	const char *stage; /* "bk-gen", "bk-teach", "bk-step" */
	bk_mem_item item[BK_MEM_MAX_ITEMS];
	int n;
	size_t weights;   /* bytes of BK_MEM_WEIGHTS items */
	size_t load;      /* bytes of BK_MEM_LOAD items */
	size_t other;     /* bytes of BK_MEM_BUF and BK_MEM_ESTIMATE items */
	size_t peak;      /* max(weights + load, weights + other) (invariant 3) */
} bk_mem_stage;

/* bk-step: one trainer (gpu/train.c) on micro-batches of at most max_T tokens (the
 * student's prompt + response; in exact mode also the teacher's) and rows response
 * rows, a teacher field of top-k k (0: the full distribution; -1: exact mode) */
typedef struct {
	int r;              /* LoRA rank */
	unsigned targets;   /* enum bk_lora_module bits (gpu/model.h) */
	int optim8;         /* adamw8bit */
	int optim_block;    /* its block (0: 256) */
	int grad_checkpoint;     /* 0, 1, or K >= 2: in segments of K layers */
	int max_T, rows, k;
	int vocab_chunk;    /* 0: 4096 */
} bk_mem_step;

/* bk-teach (gpu/teach.c): forwards of at most max_T own tokens, rows response rows,
 * top-k k (0: full), a shared prefix of P tokens */
typedef struct {
	int max_T, rows, k, P;
	int fwd_only;       /* acts sized for a forward (bk_acts_create_fwd) */
} bk_mem_teach;

/* bk-gen (gpu/gen.c): max_batch sequences decoding, prompts of at most max_prompt
 * tokens (prefix included), max_new new tokens, ntraj samples per prompt, a prefix of
 * P tokens, LoRA rank r (0: none) */
typedef struct {
	int max_batch, max_prompt, max_new, ntraj, P, r;
	size_t kv_memory;   /* --kv-memory (0: the pool bound below) */
	int teacher_k;      /* --teacher-top-k (0: no scoring) */
} bk_mem_gen;

/* The KV blocks (BK_GEN_BLOCK tokens each) the engine may hold for max_batch samples of
 * prompts of max_prompt tokens and max_new new ones with a prefix of P tokens: every
 * running sample its blocks, the entries prefilled ahead of them theirs, the prefix
 * once (gpu/gen.c invariant 6). */
long bk_mem_kv_blocks(int max_batch, int max_prompt, int max_new, int ntraj, int P);
/* bytes of one block of K (or of V): L x BK_GEN_BLOCK x NKV x D x kv_bytes */
size_t bk_mem_kv_block_bytes(const bk_mem_model *m, int kv_bytes);

/* LoRA numbers of all targeted modules (bk_lora.n_flat) */
size_t bk_mem_lora_numbers(const bk_mem_model *m, int r, unsigned targets);

void bk_mem_plan_step(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		      const bk_mem_step *o);
void bk_mem_plan_teach(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		       const bk_mem_teach *o);
void bk_mem_plan_gen(bk_mem_stage *s, const bk_mem_model *m, const bk_mem_dev *d,
		     const bk_mem_gen *o);

/* The activation buffers bk_acts_create_* allocates (gpu/model.c), in bytes: mode 0
 * training, 1 training with gradient checkpointing (in segments of seg layers when
 * seg >= 2), 2 forward only. */
size_t bk_mem_acts_bytes(const bk_mem_model *m, int act_bytes, int max_T, int max_r, int mode,
			 int seg);

/* one line per item and a total, "#   NAME  SIZE  SITE" (sizes in MiB) */
void bk_mem_print(const bk_mem_stage *s, void *file /* FILE * */);

/* ---- a bake's GPU stages on one GPU ---- */

/* the bake's shape (bk-bake's plan of the stages) */
typedef struct {
	int batch, grad_accum;  /* prompts per micro-batch, accumulation steps */
	int ntraj, max_new;     /* trajectories per prompt, their longest */
	int r, optim8, grad_ckpt, can_ckpt; /* bk-step; can_ckpt: it has the flag */
	int can_seg;            /* bk-step has --grad-checkpoint-every */
	int can_q4;             /* the stages have --load-in-4bit: a refusal may suggest it */
	int top_k;              /* bk-teach's top-k (0: full); < 0: exact, no bk-teach */
	int gen_scores;         /* bk-gen scores with top_k (bakeplan.h bk_bake_gen_scores):
				 * no bk-teach */
	unsigned targets;
	int max_t, max_s, P;    /* longest teacher / student prompt, the shared prefix */
	int teach_budget;       /* bk-teach --max-tokens (4096) */
	int gen_batch;          /* bk-gen --max-batch (64) */
	int paired, max_resp;   /* paired data (no bk-gen): its longest response */
	size_t gpu;             /* the GPU's bytes; 0: unknown */
	int shared;             /* the stages map one copy of the weights (gpu/wshare.h):
				 * side by side, the weights count once */
} bk_mem_bake;

typedef struct {
	bk_mem_stage st[3];     /* bk-gen, bk-teach, bk-step (paired: no bk-gen; exact KL
				 * or bk-gen scoring: no bk-teach) */
	int n_st;
	/* the choices (the bake's own values when nothing had to change) */
	int sequential;         /* the GPU stages one after another through files */
	int grad_ckpt, batch, grad_accum, gen_batch;
	size_t peak;            /* side by side: the sum of the stages (the weights once when
				 * shared); else the largest */
	int fits;               /* 1, 0, or -1 without a GPU size */
	char chose[512];        /* what was changed to fit, "" for nothing */
	char refuse[1024];      /* why it cannot fit and what to change (fits == 0) */
} bk_mem_fit;

/* Plans the stages for the bake's shape and, with a GPU size, chooses in this order what
 * makes them fit side by side: gradient checkpointing, checkpoints in segments of about
 * sqrt(L) layers (the same result; grad_ckpt = K), a smaller bk-gen batch (its KV cache;
 * halved down to num_trajectories, one prompt's samples), micro-batches split into
 * accumulation steps (the same steps and loss); failing that the same choices with the
 * stages one after another.  Side by side they must leave 1 GiB of a GPU of 8 GiB or more
 * (what several processes hold beyond their plans); one after another, the largest stage
 * may take the GPU. A bake that cannot fit gets a one-line refusal naming the config
 * fields whose change alone makes it fit, with the value and the peak it gives
 * (load_in_4bit, lora_r, optim, trajectory_length, teacher_top_k), each checked by
 * planning the bake so changed. */
void bk_mem_fit_bake(const bk_mem_model *m, const bk_mem_dev *d, const bk_mem_bake *b,
		     bk_mem_fit *f);
/* the plan of each stage, the pipe, the choices and the last line
 * "fits: yes|no, peak X GiB of Y GiB" */
void bk_mem_fit_print(const bk_mem_fit *f, const bk_mem_bake *b, void *file /* FILE * */);

/* "24GiB", "24G", "24000MiB", "24GB" (10^9), "25769803776": bytes; 0 when not a size */
size_t bk_mem_parse_size(const char *s);

#endif
