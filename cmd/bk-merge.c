/* bk-merge - folds a PEFT LoRA adapter into a model's weights and writes a complete HF
 * model directory (formats/merge.c does the work). */
#include "common/diag.h"
#include "common/files.h"
#include "common/flags.h"
#include "formats/hfconfig.h"
#include "formats/merge.h"
#include "formats/peft.h"
#include "formats/hub.h"

#include <stdlib.h>

static const char usage[] =
	"usage: bk-merge --model DIR --adapter DIR --out DIR [--dtype auto|f32|bf16|f16] [-v]\n"
	"Writes DIR = the base model with W' = W + (lora_alpha / r) B A folded into every\n"
	"projection the adapter targets: model.safetensors, config.json and the tokenizer\n"
	"files.  The sums are taken in fp32 and rounded once to the output dtype.\n"
	"  --model DIR     base HF model directory, or hub id Org/Name\n"
	"  --adapter DIR   PEFT adapter directory (adapter_model.safetensors, adapter_config.json)\n"
	"  --out DIR       output model directory (must not exist or be empty)\n"
	"  --dtype D       auto (each tensor keeps the base dtype; default), f32, bf16 or f16\n"
	"  -v, --verbose   report what was merged\n";

int main(int argc, char **argv)
{
	const char *model = NULL, *adapter = NULL, *out = NULL, *dtype_s = "auto";
	bk_opt opts[] = {
		{"model", 0, BK_OPT_STR, &model, 0, 0},
		{"adapter", 0, BK_OPT_STR, &adapter, 0, 0},
		{"out", 0, BK_OPT_STR, &out, 0, 0},
		{"dtype", 0, BK_OPT_STR, &dtype_s, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	int npos = bk_flags_parse(argc, argv, opts, usage);
	if (npos)
		die_usage("unexpected argument '%s'", argv[0]);
	if (!model || !adapter || !out)
		die_usage("--model, --adapter and --out are required");
	int dtype = bk_merge_dtype_parse(dtype_s);
	if (dtype == -2)
		die_usage("--dtype '%s' is not one of auto, f32, bf16, f16", dtype_s);
	char *model_dir = bk_hub_model_dir(model, NULL);
	model = model_dir;

	bk_config *cfg = bk_config_load(model);
	bk_adapter *ad = bk_adapter_load(adapter, cfg);
	bk_merge_stats st = bk_merge_model(model, ad, out, dtype);
	note("%s: %d tensors (%d merged, r %d, alpha %g), %zu bytes of weights", out, st.tensors,
	     st.merged, ad->r, ad->alpha, st.bytes);
	bk_adapter_free(ad);
	bk_config_free(cfg);
	free(model_dir);
	return 0;
}
