/* test_rope_scaling.c - scaled RoPE (yarn, linear, dynamic) end to end on the host twin:
 * tiny random models whose config.json scales RoPE, against HF's fp32 log_softmax of one
 * 48-token sequence (tests/golden/rope/scaling, from tests/ref/make_rope_scaling_fixture.py):
 * max |logp - HF| < 2e-5.  Yarn's attention factor (HF multiplies cos and sin by it) is
 * folded into the attention scale as its square (formats/hfconfig.c
 * bk_config_attn_scale); its frequencies are checked value by value in test_hfconfig. */
#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "formats/hfconfig.h"
#include "gpu/load.h"
#include "gpu/model.h"
#include "tests/harness.h"
#include "tests/unit/hf_logp.h"

#define DIR "tests/golden/rope/scaling"

static void check_case(const char *name, bk_rope_type want_type)
{
	char path[256];
	snprintf(path, sizeof path, DIR "/%s/case.json", name);
	json_error_t err;
	json_t *doc = json_load_file(path, 0, &err);
	if (!doc)
		die("%s: line %d: %s", path, err.line, err.text);
	json_t *fmt = json_object_get(doc, "format");
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "bakery-rope-scaling") ||
	    json_integer_value(json_object_get(doc, "version")) != 1)
		die("%s: not bakery-rope-scaling version 1; regenerate with python3 "
		    "tests/ref/make_rope_scaling_fixture.py",
		    path);
	json_t *jids = json_object_get(doc, "ids"), *jlogp = json_object_get(doc, "logp");
	int T = (int)json_array_size(jids), V = (int)json_integer_value(json_object_get(doc, "vocab_size"));
	if (T < 2 || V < 2 || (int)json_array_size(jlogp) != T)
		die("%s: ids / logp / vocab_size do not agree", path);
	double hf_af = json_number_value(json_object_get(doc, "attention_scaling"));

	snprintf(path, sizeof path, DIR "/%s/model", name);
	bk_loaded_model lm = bk_model_load(&bk_ops_host, path);
	bk_model *m = lm.model;
	CHECK(lm.cfg->rope_type == want_type, "%s: rope type %d, want %d", name,
	      (int)lm.cfg->rope_type, (int)want_type);
	CHECK(fabs(lm.cfg->rope_attention_factor - hf_af) <= 1e-15 * hf_af,
	      "%s: attention factor %.17g, HF's attention_scaling %.17g", name,
	      lm.cfg->rope_attention_factor, hf_af);
	CHECK(m->cfg.V == V && T <= bk_config_max_seq(lm.cfg), "%s: V %d, %d positions", name,
	      m->cfg.V, bk_config_max_seq(lm.cfg));

	double worst = hf_logp_worst(m, jids, jlogp, name);
	printf("%s: max |logp - HF fp32 log_softmax| = %.3g over %d x %d (bound 2e-5)\n", name,
	       worst, T, V);
	CHECK(worst < 2e-5, "%s: log-probs %.3g from HF's (bound 2e-5)", name, worst);

	bk_model_unload(&lm);
	json_decref(doc);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	check_case("qwen2-yarn", BK_ROPE_YARN);
	check_case("llama-yarn-af", BK_ROPE_YARN);
	check_case("llama-linear", BK_ROPE_LINEAR);
	check_case("llama-dynamic", BK_ROPE_DYNAMIC);
	return bk_test_done("test_rope_scaling");
}
