/* bk-convert - turns a llama.cpp GGUF model (Llama / SmolLM2, Gemma-3) into an HF model
 * directory that every bakery tool reads (formats/gguf_hf.c does the work). */
#include <string.h>
#include <strings.h>

#include "common/diag.h"
#include "common/flags.h"
#include "formats/gguf_hf.h"

static const char usage[] =
	"usage: bk-convert --out DIR [--dtype f32|bf16] [-v] FILE.gguf\n"
	"Writes DIR: config.json, model.safetensors (dequantized; llama.cpp's q/k row\n"
	"permutation or 1 + w norm weights undone), tokenizer.json rebuilt from the GGUF\n"
	"vocabulary and merges (or tokenizer.model from a SentencePiece one),\n"
	"tokenizer_config.json with the chat template, special_tokens_map.json and\n"
	"generation_config.json.  Reads architecture 'llama' with the 'gpt2' tokenizer and\n"
	"the 'smollm' pre-tokenizer, and 'gemma3' with its SentencePiece ('llama') one;\n"
	"tensors F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K, Q6_K.\n"
	"  --out DIR       output model directory (must not exist or be empty)\n"
	"  --dtype D       f32 (default) or bf16\n"
	"  -v, --verbose   report what was written\n";

int main(int argc, char **argv)
{
	const char *out = NULL, *dtype_s = "f32";
	bk_opt opts[] = {
		{"out", 0, BK_OPT_STR, &out, 0, 0},
		{"dtype", 0, BK_OPT_STR, &dtype_s, 0, 0},
		{"verbose", 'v', BK_OPT_FLAG, &bk_verbose, 0, 0},
		{0},
	};
	bk_diag_init(argv[0]);
	int npos = bk_flags_parse(argc, argv, opts, usage);
	if (npos != 1)
		die_usage("one GGUF file expected (%d given)", npos);
	if (!out)
		die_usage("--out is required");
	bk_dtype dt;
	if (!strcasecmp(dtype_s, "f32") || !strcasecmp(dtype_s, "float32"))
		dt = BK_DT_F32;
	else if (!strcasecmp(dtype_s, "bf16") || !strcasecmp(dtype_s, "bfloat16"))
		dt = BK_DT_BF16;
	else
		die_usage("--dtype '%s' is not one of f32, bf16", dtype_s);
	bk_gguf_hf_stats st = bk_gguf_to_hf(argv[0], out, dt);
	note("%s: %d tensors, %zu bytes of weights (%s); tokenizer: %d tokens, %d merges, "
	     "%d added", out, st.tensors, st.bytes, bk_dtype_name(dt), st.vocab, st.merges,
	     st.added);
	return 0;
}
