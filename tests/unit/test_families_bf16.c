/* test_families_bf16.c - a bf16 checkpoint of a Gemma family model on the host twin
 * against HF's log_softmax of the same bf16 weights computed in fp32 (the reference of
 * issue 13's acceptance check, tests/ref/check_families.py): max |logp - HF| < 2e-4.
 * The fixture (tests/golden/families/gemma2-bf16, from check_families.py --write-fixture)
 * has hidden 40, whose sqrt(40) = 6.3246 is 6.3125 in bf16: an embedding scale rounded
 * to the checkpoint's dtype (as it was) is 0.2% off HF's fp32 run, 0.02 in the
 * log-probs.  Also checks the scale itself, and the fp32 twin of the same model. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "formats/hfconfig.h"
#include "gpu/load.h"
#include "gpu/model.h"
#include "tests/harness.h"
#include "tests/unit/hf_logp.h"

#define FIX "tests/golden/families/gemma2-bf16"

int main(void)
{
	json_error_t err;
	json_t *doc = json_load_file(FIX "/case.json", 0, &err);
	if (!doc)
		die("%s/case.json: line %d: %s", FIX, err.line, err.text);
	json_t *fmt = json_object_get(doc, "format"), *ver = json_object_get(doc, "version");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "bakery-families-bf16") ||
	    json_integer_value(ver) != 1)
		die("%s/case.json: not bakery-families-bf16 version 1; regenerate with "
		    "python3 tests/ref/check_families.py --write-fixture",
		    FIX);
	json_t *jids = json_object_get(doc, "ids"), *jlogp = json_object_get(doc, "logp");
	int T = (int)json_array_size(jids), V = (int)json_integer_value(json_object_get(doc, "vocab_size"));
	if (T < 2 || V < 2 || (int)json_array_size(jlogp) != T)
		die("%s/case.json: ids / logp / vocab_size do not agree", FIX);

	bk_loaded_model lm = bk_model_load(&bk_ops_host, FIX "/model");
	bk_model *m = lm.model;
	CHECK(m->cfg.V == V && m->cfg.H == 40, "fixture model: V %d H %d", m->cfg.V, m->cfg.H);
	/* the scale of HF's fp32 computation, not sqrt(40) rounded to bf16 (6.3125) */
	CHECK(m->cfg.embed_scale == (float)sqrt(40.0), "embed scale %.9g, want sqrt(40) = %.9g",
	      m->cfg.embed_scale, (float)sqrt(40.0));
	CHECK(m->cfg.window != NULL, "Gemma-2 has a sliding window on layer 0");

	double worst = hf_logp_worst(m, jids, jlogp, "gemma2-bf16");
	printf("gemma2-bf16: max |logp - HF fp32 log_softmax| = %.3g over %d x %d (bound 2e-4)\n",
	       worst, T, V);
	CHECK(worst < 2e-4, "bf16 Gemma-2 log-probs %.3g from HF's (bound 2e-4)", worst);

	bk_model_unload(&lm);
	json_decref(doc);
	return bk_test_done("test_families_bf16");
}
