/* load.h - glue between files and the compute layer: an HF model directory into a
 * bk_model on a device, and PEFT adapters (formats/peft.h, host fp32) to and from a
 * bk_lora (device).  Not a parser: formats/ reads the files. */
#ifndef BK_LOAD_H
#define BK_LOAD_H

#include "formats/hfconfig.h"
#include "formats/peft.h"
#include "formats/stream.h"
#include "formats/template.h"
#include "gpu/model.h"

typedef struct {
	bk_config *cfg;
	bk_model *model;
	char fingerprint[17]; /* hex XXH3 of config.json and every tensor (name, shape, bytes),
			       * from the fingerprint cache when it holds it */
	struct bk_wshared *shared; /* the weights are a mapping of one copy shared by the
				    * processes on this GPU (gpu/wshare.h), or NULL: own */
} bk_loaded_model;

/* Loads DIR/config.json and its safetensors (one file or sharded), checks every
 * tensor against the config and creates the model on ops, tensor by tensor from the
 * mapped files: on ops with weight_upload_bf16 (CUDA) each streamed in bf16 chunks
 * (converted from fp16/fp32 chunk by chunk) through the device's staging, so no host
 * copy of a tensor is made; else (the host twin) read into fp32 one tensor at a time.
 * On the CUDA ops the frozen weights are one copy per GPU, model and dtype: the first
 * process loads them into a shared allocation (gpu/cuda/cuda_vmm.h) and serves it
 * (gpu/wshare.h), later ones map it without reading a tensor (the layout comes with it;
 * the model is the same by its fingerprint).  A process that cannot share (sharing off:
 * bk_wshare_off, BK_SHARE_WEIGHTS=0; a driver without it) loads its own and says so
 * once on stderr; -v says which it did. */
bk_loaded_model bk_model_load(const bk_ops *ops, const char *dir);
/* The same with the base linears in 4 bits when q4 (not NULL) has a type: QLoRA's
 * load_in_4bit, quantised as bitsandbytes does from the checkpoint's values (a bf16
 * checkpoint quantises as bnb quantises its bf16 tensor; gpu/quant4.h).  The
 * fingerprint stays the checkpoint's.  The copy shared on a GPU is the quantised one
 * (the packed codes and statistics, and the tensors kept in bf16), its key the 4-bit
 * setting too (type, double quant, compute dtype): a stage of another setting loads a
 * copy of its own; each process keeps its own dequantisation scratch. */
bk_loaded_model bk_model_load_q4(const bk_ops *ops, const char *dir, const bk_q4_config *q4);

/* The 4-bit setting from stage to stage.  Double quantisation's bits depend on the
 * torch thread count (gpu/quant4.h), which each process takes from its environment;
 * so a stage that quantises records its setting in its stream's provenance entry:
 * load_in_4bit (bk_q4_config_str: "no" or e.g. "nf4,double-quant,bfloat16") and
 * bnb_4bit_threads (the count it quantised with; 0 without double quantisation);
 * and a later stage of the same setting quantises with the recorded count
 * (bk_q4_adopt_stream), as bk-step does on --resume with its checkpoint's
 * (trainer_state.json settings load-in-4bit and torch-threads: bk_q4_adopt_dir), so
 * every stage of a bake, wherever it runs, sees the same 4-bit base.  Both adopt
 * functions leave q4->threads explicit (bk_q4_config_threads); -v notes a count that is
 * not this machine's. */
#define BK_Q4_PROV_BUF 64
int bk_q4_prov(const bk_q4_config *q4, char buf[BK_Q4_PROV_BUF], bk_kv kv[2]); /* 2 items */
void bk_q4_adopt_stream(bk_q4_config *q4, const bk_reader *in);
int bk_q4_adopt_dir(bk_q4_config *q4, const char *dir); /* 1: the directory's count */
void bk_model_unload(bk_loaded_model *lm);
/* The fingerprint alone (for stream headers), without loading the weights: from the
 * fingerprint cache when its key matches (gpu/load.c: config.json's bytes and each
 * safetensors file's HF blob name, or its path, inode, size and mtime), else read in
 * full and cached. */
void bk_model_fingerprint(const char *dir, char out[17]);
/* The same, always read in full, no cache. */
void bk_model_fingerprint_full(const char *dir, char out[17]);

/* Is the adapter at adapter_dir (loaded as ad) meant for the model at model_dir (cfg;
 * fingerprint when known, else NULL: computed only when needed)?  Its base is what
 * bk-step recorded in adapter_dir/trainer_state.json (the model fingerprint and model
 * type), else base_model_name_or_path when that is a local model directory.  Another
 * model type (family) is refused naming both; another checkpoint of the same one is
 * a warning.  An adapter with no known base passes. */
void bk_adapter_check_base(const char *adapter_dir, const bk_adapter *ad, const char *model_dir,
			   const bk_config *cfg, const char *fingerprint);

/* Copies an adapter's A/B into a bk_lora with the same r and targets (dies if not). */
void bk_lora_from_adapter(const bk_model *m, bk_lora *dst, const bk_adapter *src);
/* Copies a bk_lora into an adapter made by bk_adapter_new with the same shape. */
void bk_lora_to_adapter(const bk_model *m, const bk_lora *src, bk_adapter *dst);

/* The ids that end a generated turn: the template's stop ids (EOS, end of turn) plus
 * the model config's eos_token_id(s), without duplicates.  Appends to out. */
void bk_model_stop_ids(const bk_config *cfg, int tmpl, const bk_tok *spm, bk_ids *out);

#endif
