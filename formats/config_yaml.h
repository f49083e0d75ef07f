/* config_yaml.h - the reference tool's flat YAML bake config: read with libyaml into
 * fields (a scalar or a list of scalars, with the line each key is on), overridden
 * from the command line, and mapped onto the options of the bakery stages.
 * Not a general YAML model: nested mappings are refused; the mapping does no I/O
 * other than checking that model_name_or_path is a local directory (or else a hub
 * id, which bk-bake resolves through the HF cache: formats/hub.h). */
#ifndef BK_CONFIG_YAML_H
#define BK_CONFIG_YAML_H

#include <stddef.h>

typedef struct {
	char *key;
	char **v;    /* the items: one for a scalar; NULL items for YAML null (~, null, empty) */
	int n;
	int is_list;
	int line;    /* 1-based line of the key; 0 = a command-line override */
} bk_cfg_field;

typedef struct {
	char *name; /* the file name, for messages */
	bk_cfg_field *v;
	size_t n;
} bk_cfg;

/* Parses YAML text: a single flat mapping of scalars and lists of scalars.  On error
 * returns -1 and writes "NAME:LINE: what" into err (one line); 0 on success. */
int bk_cfg_parse(bk_cfg *c, const char *text, size_t len, const char *name, char *err,
		 size_t errlen);
/* Reads and parses a file; dies with the one-line message on error. */
void bk_cfg_load(bk_cfg *c, const char *path);
/* Sets key to a scalar (a command-line override): replaces the field or adds it;
 * "", null, None and ~ are null. */
void bk_cfg_set(bk_cfg *c, const char *key, const char *value);
const bk_cfg_field *bk_cfg_get(const bk_cfg *c, const char *key);
void bk_cfg_free(bk_cfg *c);

/* What a bake run does with each config field. */
typedef enum {
	BK_CFG_NOTE,        /* accepted; bakery does it differently or it has no effect */
	BK_CFG_IGNORED,     /* not available; only speed or memory differ, the bake runs */
	BK_CFG_UNSUPPORTED, /* not available and it changes the result: the bake refuses */
	BK_CFG_UNKNOWN,     /* not a field of the reference tool: the bake refuses */
} bk_cfg_kind;

typedef struct {
	bk_cfg_kind kind;
	char *key;
	int line;
	char *text; /* the reason, one line */
} bk_cfg_note;

/* Features of the installed bk-step that some fields need (found from its --help). */
typedef struct {
	int grad_checkpoint;  /* bk-step --grad-checkpoint */
	int optim_8bit;       /* bk-step --optim adamw8bit */
	int save_total_limit; /* bk-step --save-total-limit */
	int load_4bit;        /* bk-step --load-in-4bit (and the other stages with it) */
	int grad_ckpt_every;  /* bk-step --grad-checkpoint-every K */
} bk_bake_caps;

typedef struct {
	const char **v;
	int n;
} bk_cfg_strs;

/* The tool's wrapper for a corpus without system_prompt_template (data.py). */
#define BK_TOOL_CORPUS_TEMPLATE                                                         \
	"You are an AI assistant with specialized knowledge. Here is your knowledge base:" \
	"\n\n{corpus}\n\nAnswer questions about this knowledge accurately and concisely."

/* The bake, field by field mapped onto stage options.  Strings point into the bk_cfg
 * (or are literals). */
typedef struct {
	/* inputs: bk-tokenize (and bk-eval for the system prompt).  One source is set, in
	 * the tool's order: system_prompt, else system_prompt_file (used stripped at both
	 * ends), else corpus_file rendered by corpus_format (default papers) into
	 * system_template_text (default BK_TOOL_CORPUS_TEMPLATE, "{{" "}}" unescaped as
	 * str.format does) */
	const char *model, *system, *system_file, *corpus, *corpus_format, *template_name;
	const char *revision; /* of a hub model id (NULL: main) */
	char *system_template_text; /* malloc'd */
	bk_cfg_strs prompts, data;
	/* a hub dataset (Org/Name, or a directory laid out as a hub repo) and the split
	 * spec to read from it (bk-tokenize --split); NULL when the data are local files */
	const char *hub_data, *hub_split;
	long max_seq_length;
	/* bk-gen */
	long num_trajectories, trajectory_length, seed, data_seed;
	double epochs; /* num_train_epochs; may be fractional (HF) */
	double sampling_temperature, top_p;
	long gen_top_k; /* the config's top_k: bk-gen --top-k (0: off) */
	int retokenize; /* bk-gen --retokenize (retokenize_trajectories, default 1) */
	/* bk-teach (and bk-step, bk-eval: the KL temperature) */
	double temperature;
	long top_k; /* teacher_top_k: bk-teach --top-k; -1 (the default): exact mode, no bk-teach */
	/* bk-lens / bk-step */
	long batch_size, grad_accum, lora_r, max_steps, save_total_limit;
	/* below 1: a ratio of the total steps (HF), see bk_bake_steps */
	double warmup_steps, logging_steps, save_steps;
	double lr, warmup_ratio, weight_decay, max_grad_norm, lora_alpha, lora_dropout;
	const char *schedule, *save_strategy; /* save_strategy: epoch, steps or no */
	char *target_modules;                  /* "q_proj,v_proj" or "all-linear" (malloc'd) */
	int grad_checkpoint, optim_8bit;       /* map to bk-step flags (caps permitting);
						* grad_checkpoint K >= 2: in segments
						* of K layers (bk-bake's memory plan) */
	/* load_in_4bit: every model stage's --load-in-4bit --bnb-4bit-quant-type q4_type
	 * --bnb-4bit-use-double-quant q4_double_quant --bnb-4bit-compute-dtype q4_dtype;
	 * q4_type NULL: full precision */
	const char *q4_type, *q4_dtype;
	int q4_double_quant;
	/* outputs, evaluation */
	const char *output_dir, *eval_file, *held_out_file, *kl_prompts, *device;
	const char *resume; /* resume_from_checkpoint: a directory, or "true" (the last one) */
	int overwrite;      /* overwrite_output_dir */
	/* the validation loss (bk-step --eval): eval_strategy no, steps or epoch over the
	 * local file eval_data (NULL: none); eval_steps as HF's (steps strategy; below 1 a
	 * ratio), eval_delay (steps, or epochs with epoch), per_device_eval_batch_size */
	const char *eval_strategy, *eval_data;
	const char *eval_split; /* eval_data is a hub dataset: its split (bk-tokenize --split) */
	double eval_steps, eval_delay;
	long eval_batch;
	/* everything said about the fields, in config order */
	bk_cfg_note *notes;
	size_t n_notes;
	int n_refused; /* notes of kind UNSUPPORTED or UNKNOWN */
} bk_bake_plan;

/* A count of steps given as HF does: v >= 1 steps, 0 < v < 1 ceil(v * total). */
long bk_bake_steps(double v, long total);

/* Every field bk-bake knows: where it comes from (the tool's BakeryConfig,
 * DataConfig, LoraConfig, HF TrainingArguments, or a bakery extension), what is done
 * with it (mapped, note, ignored, refused unless its default) and why. */
typedef struct {
	const char *key, *origin, *how, *def, *text;
} bk_cfg_known;
const bk_cfg_known *bk_cfg_fields(size_t *n);

/* Maps every field of c (defaults as the reference's); bad values (a word where a
 * number goes) die naming the file, line and field.  Never ignores a field: each one
 * is mapped, or gets a note. */
void bk_bake_plan_make(bk_bake_plan *p, const bk_cfg *c, const bk_bake_caps *caps);
void bk_bake_plan_free(bk_bake_plan *p);
/* "note", "ignored", "unsupported", "unknown" */
const char *bk_cfg_kind_name(bk_cfg_kind k);

#endif
