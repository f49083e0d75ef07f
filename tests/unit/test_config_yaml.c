/* test_config_yaml.c - the flat YAML bake config: parsing (scalars, lists, nulls, line
 * numbers), errors with their line, overrides, and the mapping of every reference
 * field onto the stages (mapped, noted, ignored or refused; nothing silently). */
#include "common/diag.h"
#include "formats/config_yaml.h"
#include "tests/harness.h"

#include <stdlib.h>
#include <string.h>

static int parse(bk_cfg *c, const char *text, char *err, size_t n)
{
	return bk_cfg_parse(c, text, strlen(text), "t.yaml", err, n);
}

static const bk_cfg_note *note_for(const bk_bake_plan *p, const char *key)
{
	for (size_t i = 0; i < p->n_notes; i++)
		if (!strcmp(p->notes[i].key, key))
			return &p->notes[i];
	return NULL;
}

static void test_parse(void)
{
	char err[256];
	bk_cfg c;
	int rc = parse(&c,
		       "# a comment\n"
		       "model_name_or_path: models/stories260K\n"
		       "learning_rate: 1e-4\n"
		       "target_modules:\n  - q_proj\n  - v_proj\n"
		       "eval_file: null\n"
		       "system_prompt: \"You are Sparky: a dragon.\"\n"
		       "training_prompts: [\"Hi\", 'there']\n"
		       "empty:\n",
		       err, sizeof err);
	CHECK(rc == 0, "parse failed: %s", err);
	CHECK(c.n == 7, "%zu fields", c.n);
	const bk_cfg_field *f = bk_cfg_get(&c, "learning_rate");
	CHECK(f && f->n == 1 && !f->is_list && !strcmp(f->v[0], "1e-4") && f->line == 3,
	      "learning_rate");
	f = bk_cfg_get(&c, "target_modules");
	CHECK(f && f->is_list && f->n == 2 && !strcmp(f->v[1], "v_proj") && f->line == 4,
	      "target_modules");
	f = bk_cfg_get(&c, "eval_file");
	CHECK(f && f->n == 1 && f->v[0] == NULL, "null value");
	f = bk_cfg_get(&c, "empty");
	CHECK(f && f->n == 1 && f->v[0] == NULL, "empty value is null");
	f = bk_cfg_get(&c, "system_prompt");
	CHECK(f && !strcmp(f->v[0], "You are Sparky: a dragon."), "quoted scalar");
	f = bk_cfg_get(&c, "training_prompts");
	CHECK(f && f->is_list && f->n == 2 && !strcmp(f->v[1], "there"), "flow list");
	bk_cfg_set(&c, "learning_rate", "5e-5");
	bk_cfg_set(&c, "seed", "7");
	f = bk_cfg_get(&c, "learning_rate");
	CHECK(f && !strcmp(f->v[0], "5e-5") && f->line == 0, "override replaces");
	CHECK(c.n == 8 && bk_cfg_get(&c, "seed"), "override adds");
	bk_cfg_free(&c);
}

static void test_errors(void)
{
	static const struct {
		const char *text, *want;
	} bad[] = {
		{"a: 1\nb: [1, 2\nc: 3\n", "t.yaml:"},
		{"a: 1\nb:\n  nested: 2\n", "t.yaml:3: a nested mapping"},
		{"a: 1\na: 2\n", "t.yaml:2: duplicate key 'a' (first on line 1)"},
		{"- a\n- b\n", "t.yaml:1: a list where"},
		{"a: 1\n---\nb: 2\n", "t.yaml:2: a second YAML document"},
		{"a: &x 1\nb: *x\n", "t.yaml:2: a YAML alias"},
		{"a: [[1]]\n", "t.yaml:1: a list inside a list"},
		{"a: 1\n  b: 2\n", "t.yaml:2: "},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		char err[256] = "";
		bk_cfg c;
		int rc = parse(&c, bad[i].text, err, sizeof err);
		CHECK(rc == -1, "case %zu accepted", i);
		CHECK(!strncmp(err, bad[i].want, strlen(bad[i].want)), "case %zu: '%s'", i, err);
		CHECK(!strchr(err, '\n'), "case %zu: more than one line", i);
		bk_cfg_free(&c);
	}
}

/* every field the reference documents, in one config */
static const char every_field[] =
	"model_name_or_path: models/stories260K\n"
	"system_prompt: You are Sparky the dragon.\n"
	"training_prompts:\n  - Once upon a time\n  - The sky was blue\n"
	"num_trajectories: 3\n"
	"trajectory_length: 24\n"
	"sampling_temperature: 0.7\n"
	"top_p: 0.95\n"
	"temperature: 2.0\n"
	"learning_rate: 1e-4\n"
	"num_train_epochs: 2\n"
	"per_device_train_batch_size: 4\n"
	"gradient_accumulation_steps: 2\n"
	"lr_scheduler_type: cosine\n"
	"warmup_ratio: 0.1\n"
	"warmup_steps: 0\n"
	"max_grad_norm: 0.5\n"
	"weight_decay: 0.01\n"
	"lora_r: 8\n"
	"lora_alpha: 16\n"
	"lora_dropout: 0.0\n"
	"target_modules: [q_proj, v_proj]\n"
	"seed: 7\n"
	"logging_steps: 5\n"
	"save_strategy: steps\n"
	"save_steps: 10\n"
	"output_dir: out/x\n"
	"eval_file: pipelines/demo/qa.json\n"
	"held_out_file: null\n"
	"max_seq_length: 256\n"
	"optim: adamw_bnb_8bit\n"
	"gradient_checkpointing: true\n"
	"use_flash_attention: true\n"
	"bf16: true\n"
	"fp16: false\n"
	"report_to: none\n"
	"learning_rat: 3\n";

static void test_mapping(void)
{
	char err[256];
	bk_cfg c;
	CHECK(parse(&c, every_field, err, sizeof err) == 0, "%s", err);
	bk_bake_caps none = {0, 0, 0, 0, 0}, all = {1, 1, 1, 1, 1};
	bk_bake_plan p;
	bk_bake_plan_make(&p, &c, &none);
	CHECK(!strcmp(p.model, "models/stories260K"), "model");
	CHECK(p.prompts.n == 2 && !strcmp(p.prompts.v[1], "The sky was blue"), "prompts");
	CHECK(p.num_trajectories == 3 && p.trajectory_length == 24, "trajectories");
	CHECK(p.sampling_temperature == 0.7 && p.top_p == 0.95 && p.temperature == 2.0,
	      "temperatures");
	CHECK(p.gen_top_k == 50 && p.top_k == -1, "top_k %ld (HF generate's 50), teacher_top_k %ld (exact)",
	      p.gen_top_k, p.top_k);
	CHECK(p.lr == 1e-4 && p.epochs == 2 && p.batch_size == 4 && p.grad_accum == 2, "training");
	CHECK(!strcmp(p.schedule, "cosine") && p.warmup_steps == 0.1 && p.max_grad_norm == 0.5 &&
		      p.weight_decay == 0.01, "schedule");
	CHECK(p.lora_r == 8 && p.lora_alpha == 16 && p.lora_dropout == 0, "lora");
	CHECK(!strcmp(p.target_modules, "q_proj,v_proj"), "targets '%s'", p.target_modules);
	CHECK(p.seed == 7 && p.logging_steps == 5 && p.save_steps == 10 &&
		      !strcmp(p.save_strategy, "steps"), "saving");
	CHECK(!strcmp(p.output_dir, "out/x") && p.eval_file && !p.held_out_file, "outputs");
	CHECK(p.max_seq_length == 256, "max_seq_length");
	/* without the bk-step features: ignored with a reason, not refused */
	const bk_cfg_note *n = note_for(&p, "optim");
	CHECK(n && n->kind == BK_CFG_IGNORED && strstr(n->text, "8-bit") && n->line == 32, "optim");
	n = note_for(&p, "gradient_checkpointing");
	CHECK(n && n->kind == BK_CFG_IGNORED && strstr(n->text, "--grad-checkpoint"), "gc");
	CHECK(!p.optim_8bit && !p.grad_checkpoint, "features off");
	n = note_for(&p, "use_flash_attention");
	CHECK(n && n->kind == BK_CFG_NOTE && strstr(n->text, "no effect"), "flash attention");
	CHECK(note_for(&p, "bf16") && !note_for(&p, "report_to"),
	      "bf16 (not its default) noted, report_to (its default, none) silent");
	/* the typo is unknown, and the only refusal */
	n = note_for(&p, "learning_rat");
	CHECK(n && n->kind == BK_CFG_UNKNOWN && n->line == 38, "unknown field");
	CHECK(p.n_refused == 1, "%d refused", p.n_refused);
	bk_bake_plan_free(&p);

	bk_bake_plan_make(&p, &c, &all);
	CHECK(p.optim_8bit && p.grad_checkpoint, "features on");
	CHECK(!note_for(&p, "optim") && !note_for(&p, "gradient_checkpointing"), "no notes");
	bk_bake_plan_free(&p);

	/* overrides win */
	bk_cfg_set(&c, "learning_rate", "5e-5");
	bk_cfg_set(&c, "target_modules", "all-linear");
	bk_cfg_set(&c, "num_train_epochs", "1.0");
	bk_bake_plan_make(&p, &c, &all);
	CHECK(p.lr == 5e-5 && !strcmp(p.target_modules, "all-linear") && p.epochs == 1,
	      "overrides");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);
}

static void test_refusals(void)
{
	char err[256];
	bk_cfg c;
	CHECK(parse(&c,
		    "model_name_or_path: ./not/a/dir\n"
		    "system_prompt: x\n"
		    "training_prompts: [a]\n"
		    "lr_scheduler_type: polynomial\n"
		    "optim: sgd\n"
		    "target_modules: [q_proj, lm_head]\n"
		    "num_train_epochs: 1.5\n"
		    "load_in_4bit: true\n"
		    "bnb_4bit_quant_type: int4\n"
		    "adam_beta2: 0.98\n"
		    "neftune_noise_alpha: 5\n"
		    "bias: all\n",
		    err, sizeof err) == 0, "%s", err);
	bk_bake_caps caps = {1, 1, 1, 1, 1};
	bk_bake_plan p;
	bk_bake_plan_make(&p, &c, &caps);
	const bk_cfg_note *n = note_for(&p, "model_name_or_path");
	CHECK(n && n->kind == BK_CFG_UNSUPPORTED &&
		      strstr(n->text, "neither a directory nor a hub id") && n->line == 1,
	      "not a directory, not a hub id");
	/* a hub id is mapped as it is: bk-bake resolves it through the HF cache */
	bk_cfg h;
	CHECK(parse(&h, "model_name_or_path: meta-llama/Llama-2-7b-chat-hf\nrevision: v1\n", err,
		    sizeof err) == 0, "%s", err);
	bk_bake_plan hp;
	bk_bake_plan_make(&hp, &h, &caps);
	CHECK(!note_for(&hp, "model_name_or_path") && !strcmp(hp.model, "meta-llama/Llama-2-7b-chat-hf") &&
		      hp.revision && !strcmp(hp.revision, "v1"),
	      "hub id mapped");
	bk_bake_plan_free(&hp);
	bk_cfg_free(&h);
	static const char *const keys[] = {"lr_scheduler_type", "optim", "target_modules",
					   "bnb_4bit_quant_type", "adam_beta2", "neftune_noise_alpha",
					   "bias", NULL};
	for (int i = 0; keys[i]; i++) {
		n = note_for(&p, keys[i]);
		CHECK(n && n->kind == BK_CFG_UNSUPPORTED, "%s refused", keys[i]);
	}
	CHECK(p.n_refused == 8, "%d refused", p.n_refused);
	CHECK(p.epochs == 1.5 && !note_for(&p, "num_train_epochs"), "fractional epochs, as HF");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);

	/* nothing to bake: model, system prompt and data are named as missing */
	CHECK(parse(&c, "seed: 1\n", err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(note_for(&p, "model_name_or_path") && note_for(&p, "system_prompt") &&
		      note_for(&p, "training_prompts") && p.n_refused == 3, "missing fields");
	CHECK(p.seed == 1 && p.lr == 5e-5 && p.num_trajectories == 4 && p.epochs == 3,
	      "defaults");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);
}

/* load_in_4bit and the bnb_4bit_* fields: mapped onto the stages' 4-bit flags */
static void test_qlora(void)
{
	char err[256];
	bk_cfg c;
	bk_bake_caps caps = {1, 1, 1, 1, 1};
	bk_bake_plan p;
	const char *base = "model_name_or_path: models/stories260K\nsystem_prompt: x\n"
			   "training_prompts: [a]\n";
	char *t = xasprintf("%sload_in_4bit: true\n", base);
	CHECK(parse(&c, t, err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && p.q4_type && !strcmp(p.q4_type, "nf4") && p.q4_double_quant &&
		      !strcmp(p.q4_dtype, "bfloat16"),
	      "load_in_4bit with the tool's defaults: nf4, double quant, torch_dtype bfloat16");
	bk_bake_plan_free(&p), bk_cfg_free(&c), free(t);

	t = xasprintf("%sload_in_4bit: true\nbnb_4bit_quant_type: fp4\n"
		      "bnb_4bit_use_double_quant: false\ntorch_dtype: float32\n", base);
	CHECK(parse(&c, t, err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && !strcmp(p.q4_type, "fp4") && !p.q4_double_quant &&
		      !strcmp(p.q4_dtype, "float32"),
	      "fp4, no double quant, compute dtype from torch_dtype");
	bk_bake_plan_free(&p), bk_cfg_free(&c), free(t);

	t = xasprintf("%sload_in_4bit: true\ntorch_dtype: float32\n"
		      "bnb_4bit_compute_dtype: bfloat16\n", base);
	CHECK(parse(&c, t, err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && !strcmp(p.q4_dtype, "bfloat16"),
	      "bnb_4bit_compute_dtype overrides torch_dtype");
	bk_bake_plan_free(&p), bk_cfg_free(&c), free(t);

	t = xasprintf("%sbnb_4bit_quant_type: fp4\nbnb_4bit_compute_dtype: float32\n", base);
	CHECK(parse(&c, t, err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	const bk_cfg_note *n = note_for(&p, "bnb_4bit_compute_dtype");
	CHECK(p.n_refused == 0 && !p.q4_type && n && n->kind == BK_CFG_NOTE,
	      "without load_in_4bit the bnb fields have no effect");
	bk_bake_plan_free(&p), bk_cfg_free(&c), free(t);

	bk_bake_caps old = {1, 1, 1, 0, 1};
	t = xasprintf("%sload_in_4bit: true\n", base);
	CHECK(parse(&c, t, err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &old);
	n = note_for(&p, "load_in_4bit");
	CHECK(p.n_refused == 1 && !p.q4_type && n && n->kind == BK_CFG_UNSUPPORTED,
	      "a bk-step without --load-in-4bit refuses it");
	bk_bake_plan_free(&p), bk_cfg_free(&c), free(t);
}

/* the tool's own field names and HF fields it documents; its defaults (item 4) */
static void test_tool_fields(void)
{
	char err[256];
	bk_cfg c;
	CHECK(parse(&c,
		    "model_name_or_path: models/stories260K\n"
		    "system_prompt: Be brief.\n"
		    "system_prompt_file: tests/data/bake/tiny.yaml\n"
		    "training_prompts: [a, b]\n"
		    "r: 16\n"
		    "heldout_file: pipelines/examples/data/sparky-qa.json\n"
		    "attn_implementation: sdpa\n"
		    "dataset_split: train_sft[:10]\n"
		    "use_unsloth: true\n"
		    "auto_install_optional_deps: true\n"
		    "bias: none\n"
		    "bnb_4bit_quant_type: nf4\n"
		    "max_steps: 7\n"
		    "adam_beta1: 0.9\n"
		    "adam_epsilon: 1e-8\n"
		    "logging_first_step: true\n"
		    "overwrite_output_dir: true\n"
		    "resume_from_checkpoint: true\n"
		    "per_device_eval_batch_size: 4\n"
		    "disable_tqdm: true\n"
		    "do_train: true\n"
		    "full_determinism: false\n"
		    "data_seed: 9\n"
		    "use_cpu: true\n"
		    "torch_compile: false\n"
		    "label_smoothing_factor: 0.1\n"
		    "warmup_steps: 0.25\n"
		    "save_total_limit: 2\n"
		    "num_train_epochs: 0.5\n",
		    err, sizeof err) == 0, "%s", err);
	bk_bake_caps caps = {1, 1, 1, 1, 1};
	bk_bake_plan p;
	bk_bake_plan_make(&p, &c, &caps);
	for (size_t i = 0; i < p.n_notes; i++)
		CHECK(p.notes[i].kind <= BK_CFG_IGNORED, "%s refused: %s", p.notes[i].key,
		      p.notes[i].text);
	CHECK(p.n_refused == 0, "%d refused", p.n_refused);
	CHECK(p.lora_r == 16, "r -> lora_r");
	CHECK(p.held_out_file && strstr(p.held_out_file, "sparky"), "heldout_file");
	CHECK(p.lora_dropout == 0, "use_unsloth: dropout 0");
	CHECK(p.max_steps == 7 && p.epochs == 0.5, "max_steps, fractional epochs");
	CHECK(p.overwrite && p.resume && !strcmp(p.resume, "true"), "overwrite, resume");
	CHECK(p.data_seed == 9 && p.seed == 42, "data_seed");
	CHECK(!strcmp(p.device, "cpu"), "use_cpu");
	CHECK(p.warmup_steps == 0.25 && bk_bake_steps(p.warmup_steps, 10) == 3, "warmup ratio");
	CHECK(p.save_total_limit == 2, "save_total_limit");
	CHECK(p.system && !p.system_file, "system_prompt wins over the file");
	const bk_cfg_note *n = note_for(&p, "system_prompt_file");
	CHECK(n && n->kind == BK_CFG_NOTE && strstr(n->text, "not used"), "the file is named");
	CHECK(note_for(&p, "attn_implementation") && note_for(&p, "label_smoothing_factor") &&
		      note_for(&p, "logging_first_step"), "no-effect fields noted");
	CHECK(!note_for(&p, "bias") && !note_for(&p, "adam_beta1") && !note_for(&p, "full_determinism"),
	      "defaults are silent");
	bk_bake_plan_free(&p);
	/* without bk-step's --save-total-limit: ignored, not refused */
	bk_bake_caps old = {1, 1, 0, 1, 1};
	bk_bake_plan_make(&p, &c, &old);
	n = note_for(&p, "save_total_limit");
	CHECK(n && n->kind == BK_CFG_IGNORED && !p.save_total_limit, "old bk-step");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);

	/* a corpus without a template: the tool's papers format and wrapper */
	CHECK(parse(&c,
		    "model_name_or_path: models/stories260K\n"
		    "corpus_file: pipelines/examples/data/papers.json\n"
		    "training_prompts: [a]\n",
		    err, sizeof err) == 0, "%s", err);
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && !strcmp(p.corpus_format, "papers") &&
		      !strcmp(p.system_template_text, BK_TOOL_CORPUS_TEMPLATE), "corpus defaults");
	bk_bake_plan_free(&p);
	bk_cfg_set(&c, "system_prompt_template", "{{Known}}: {corpus}");
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && !strcmp(p.system_template_text, "{Known}: {corpus}"),
	      "str.format braces: '%s'", p.system_template_text);
	bk_bake_plan_free(&p);
	bk_cfg_set(&c, "top_k", "0"); /* bk-gen --top-k: HF's top_k, 0 = off */
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0 && p.gen_top_k == 0 && !note_for(&p, "top_k"), "top_k 0: %ld",
	      p.gen_top_k);
	bk_bake_plan_free(&p);
	bk_cfg_set(&c, "system_prompt_template", "{name}: {corpus}");
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 1 && note_for(&p, "system_prompt_template"), "another field");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);
}

/* warmup as transformers 5.3 (the tool's pinned version) reads it: a given
 * warmup_ratio (deprecated) replaces warmup_steps; 1 or more is int() steps; one note
 * says that later 5.x drop warmup_ratio silently */
static void test_warmup(void)
{
	static const struct {
		const char *yaml;  /* warmup lines */
		double steps;      /* p.warmup_steps */
		const char *note;  /* the key of the one warmup note, or NULL */
		const char *says;  /* in its text */
	} cases[] = {
		{"warmup_ratio: 0.1\n", 0.1, "warmup_ratio", "transformers 5.15"},
		{"warmup_ratio: 0.1\nwarmup_steps: 0\n", 0.1, "warmup_ratio", "5.3"},
		{"warmup_steps: 10\nwarmup_ratio: 0\n", 0, "warmup_ratio", "replaces warmup_steps 10"},
		{"warmup_steps: 10\nwarmup_ratio: null\n", 10, NULL, NULL},
		{"warmup_steps: 0.25\n", 0.25, NULL, NULL},
		{"warmup_steps: 2.5\n", 2, "warmup_steps", "int()"},
		{"warmup_ratio: 1\n", 1, "warmup_ratio", "5.3"},
		{"warmup_ratio: 3.7\n", 3, "warmup_ratio", "3 steps"},
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		char text[512], err[256];
		snprintf(text, sizeof text,
			 "model_name_or_path: models/stories260K\nsystem_prompt: x\n"
			 "training_prompts: [a]\n%s", cases[i].yaml);
		bk_cfg c;
		CHECK(parse(&c, text, err, sizeof err) == 0, "case %zu: %s", i, err);
		bk_bake_caps caps = {1, 1, 1, 1, 1};
		bk_bake_plan p;
		bk_bake_plan_make(&p, &c, &caps);
		CHECK(p.n_refused == 0, "case %zu: %d refused", i, p.n_refused);
		CHECK(p.warmup_steps == cases[i].steps, "case %zu: warmup_steps %g, want %g", i,
		      p.warmup_steps, cases[i].steps);
		int notes = 0;
		for (size_t k = 0; k < p.n_notes; k++)
			notes += !strncmp(p.notes[k].key, "warmup", 6);
		CHECK(notes == (cases[i].note != NULL), "case %zu: %d warmup notes", i, notes);
		if (cases[i].note) {
			const bk_cfg_note *n = note_for(&p, cases[i].note);
			CHECK(n && n->kind == BK_CFG_NOTE && strstr(n->text, cases[i].says),
			      "case %zu: note '%s'", i, n ? n->text : "(none)");
		}
		bk_bake_plan_free(&p);
		bk_cfg_free(&c);
	}
	/* fields transformers 5.3 lacks, whose silent drop the user did not ask for: the
	 * request is honoured and a note says what the tool does */
	char err[256];
	bk_cfg c;
	CHECK(parse(&c,
		    "model_name_or_path: models/stories260K\nsystem_prompt: x\n"
		    "training_prompts: [a]\nresume_from_checkpoint: true\n"
		    "overwrite_output_dir: true\nno_cuda: true\ngroup_by_length: true\n",
		    err, sizeof err) == 0, "%s", err);
	bk_bake_caps caps = {1, 1, 1, 1, 1};
	bk_bake_plan p;
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.n_refused == 0, "%d refused", p.n_refused);
	CHECK(p.resume && p.overwrite && !strcmp(p.device, "cpu"), "honoured");
	CHECK(p.retokenize == 1, "trajectories as the tool trains them, by default");
	static const char *const keys[] = {"resume_from_checkpoint", "overwrite_output_dir",
					   "no_cuda", "group_by_length", NULL};
	for (int i = 0; keys[i]; i++) {
		const bk_cfg_note *n = note_for(&p, keys[i]);
		CHECK(n && n->kind == BK_CFG_NOTE, "%s: a note", keys[i]);
	}
	bk_bake_plan_free(&p);
	bk_cfg_set(&c, "retokenize_trajectories", "false");
	bk_cfg_set(&c, "teacher_top_k", "64");
	bk_bake_plan_make(&p, &c, &caps);
	CHECK(p.retokenize == 0 && p.n_refused == 0, "retokenize_trajectories: false");
	CHECK(p.top_k == 64, "teacher_top_k 64: bk-teach");
	bk_bake_plan_free(&p);
	bk_cfg_free(&c);
}

/* every known field has an origin, a handling and a reason; no key twice */
static void test_known(void)
{
	size_t n;
	const bk_cfg_known *k = bk_cfg_fields(&n);
	CHECK(n > 150, "%zu fields", n);
	for (size_t i = 0; i < n; i++) {
		CHECK(k[i].origin && *k[i].text, "%s", k[i].key);
		CHECK(!strcmp(k[i].how, "mapped") || !strcmp(k[i].how, "note") ||
			      !strcmp(k[i].how, "ignored") || !strcmp(k[i].how, "refused"),
		      "%s: %s", k[i].key, k[i].how);
		for (size_t j = 0; j < i; j++)
			CHECK(strcmp(k[i].key, k[j].key), "%s twice", k[i].key);
	}
}

int main(void)
{
	test_tool_fields();
	test_known();
	test_parse();
	test_errors();
	test_mapping();
	test_refusals();
	test_qlora();
	test_warmup();
	return bk_test_done("test_config_yaml");
}
