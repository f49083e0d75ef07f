/* fuzz_gguf.c - libFuzzer target for the GGUF reader (formats/gguf.c) and the HF files
 * built from it (formats/gguf_hf.c: config, tokenizer_config.json, and tokenizer.json or
 * the SentencePiece tokenizer.model).
 * The input is the file.  A die() (bad data) ends the run through bk_die_hook; a crash,
 * a sanitizer report or a broken promise of gguf.h (abort) is a finding. */
#include "formats/gguf.h"
#include "formats/gguf_hf.h"
#include "tests/fuzz/reclaim.h"

#include <math.h>
#include <string.h>

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
	(void)argc, (void)argv;
	bk_diag_init("fuzz_gguf");
	reclaim_init();
	return 0;
}

/* The promises of gguf.h about a file that opened. */
static void check(const bk_gguf *g, const uint8_t *data, size_t size)
{
	for (size_t i = 0; i < bk_gguf_n_tensors(g); i++) {
		const bk_gguf_tensor *t = bk_gguf_tensor_at(g, i);
		if (t->ndim < 1 || t->ndim > 4 || t->data < data || t->nbytes > size ||
		    t->data + t->nbytes > data + size)
			abort();
		if (!bk_ggml_type_supported(t->type))
			continue;
		int64_t n = bk_gguf_numel(t);
		float *f = malloc((size_t)n * sizeof(float) + 1);
		if (!f)
			continue;
		bk_gguf_dequant(g, t, f);
		free(f);
	}
	for (size_t i = 0; i < bk_gguf_n_kv(g); i++) {
		const bk_gguf_kv *kv = bk_gguf_kv_at(g, i);
		for (uint64_t k = 0; kv->strs && k < kv->n; k++)
			if ((const uint8_t *)kv->strs[k].s < data ||
			    (const uint8_t *)kv->strs[k].s + kv->strs[k].n > data + size)
				abort();
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *buf = malloc(size ? size : 1); /* exactly size bytes: overreads are caught */
	if (!buf)
		return 0;
	memcpy(buf, data, size);
	reclaim_begin();
	if (setjmp(reclaim_jmp) == 0) {
		bk_gguf *g = bk_gguf_open_mem("fuzz.gguf", buf, size);
		check(g, buf, size);
		json_decref(bk_gguf_hf_config(g, BK_DT_F32));
		json_decref(bk_gguf_hf_tokenizer_config(g));
		/* SentencePiece ('llama', Gemma-3) is written as tokenizer.model */
		char *tm = bk_gguf_get_str(g, "tokenizer.ggml.model");
		int spm = tm && !strcmp(tm, "llama");
		free(tm);
		if (spm) {
			size_t n;
			free(bk_gguf_hf_spm(g, &n));
		} else {
			json_decref(bk_gguf_hf_tokenizer(g));
		}
		bk_gguf_close(g);
		reclaim_end(0);
	} else {
		reclaim_end(1);
	}
	free(buf);
	return 0;
}
