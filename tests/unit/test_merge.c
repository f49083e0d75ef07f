/* test_merge.c - bk-merge's folding (formats/merge.c) on models/stories260K:
 * F32 base: untargeted tensors byte-identical, merged ones equal W + (alpha/r) B A to
 * fp32 rounding, files copied, and the merged model's logits (bk_model_logits) equal
 * base + adapter within 1e-5 of the largest logit; BF16 base (a bf16 copy of
 * stories260K written here): merged tensors are BF16 and equal the once-rounded fp32
 * sum (to half a bf16 ulp), and the logits agree within 1e-2 of the largest logit (bf16
 * rounding of W', 2^-9 relative per weight).  Also --dtype f32, and a non-empty output
 * directory refused.
 * As a helper for tests/t0600-merge.sh: `test_merge --write-adapter MODEL DIR [other]`
 * writes a random adapter for MODEL (or, with "other", for a model whose MLP is wider,
 * which bk-merge must refuse) and exits. */
#include "tests/harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/diag.h"
#include "common/files.h"
#include "common/rng.h"
#include "formats/merge.h"
#include "gpu/load.h"

#define MODEL "models/stories260K"
#define TARGETS ((1u << BK_PEFT_Q_PROJ) | (1u << BK_PEFT_V_PROJ) | (1u << BK_PEFT_O_PROJ) | \
		 (1u << BK_PEFT_UP_PROJ) | (1u << BK_PEFT_DOWN_PROJ))

static bk_adapter *random_adapter(const bk_config *c, unsigned targets, uint64_t seed)
{
	bk_adapter *ad = bk_adapter_new(c, 4, 8.0, 0.0, targets, MODEL);
	bk_rng rng;
	bk_rng_seed(&rng, seed);
	for (int l = 0; l < c->n_layers; l++)
		for (int m = 0; m < BK_PEFT_NMOD; m++) {
			if (!(targets & (1u << m)))
				continue;
			float *a = bk_adapter_a(ad, l, m), *b = bk_adapter_b(ad, l, m);
			for (int i = 0; i < ad->r * ad->in[m]; i++)
				a[i] = (float)(bk_rng_uniform(&rng) * 2 - 1) * 0.1f;
			for (int i = 0; i < ad->out[m] * ad->r; i++)
				b[i] = (float)(bk_rng_uniform(&rng) * 2 - 1) * 0.05f;
		}
	return ad;
}

static int same_file(const char *a, const char *b)
{
	size_t na, nb;
	char *x = bk_read_file(a, &na), *y = bk_read_file(b, &nb);
	int same = na == nb && !memcmp(x, y, na);
	free(x), free(y);
	return same;
}

/* logits [T,V] of a fixed 24-token sequence; lora NULL = adapter off */
static float *logits_of(const char *dir, const bk_adapter *ad, int *T_out, int *V_out)
{
	bk_loaded_model lm = bk_model_load(&bk_ops_host, dir);
	const bk_model *m = lm.model;
	int T = 24, V = m->cfg.V, H = m->cfg.H;
	int32_t ids[24], pos[24], cu[2] = {0, T};
	bk_rng rng;
	bk_rng_seed(&rng, 5);
	for (int t = 0; t < T; t++) {
		ids[t] = t ? 3 + (int32_t)bk_rng_below(&rng, (uint64_t)V - 3) : 1;
		pos[t] = t;
	}
	bk_lora *lo = NULL;
	if (ad) {
		lo = bk_lora_create(m, ad->r, (float)ad->alpha, 0.0f, ad->targets);
		bk_lora_from_adapter(m, lo, ad);
	}
	bk_acts *acts = bk_acts_create(m, T, ad ? ad->r : 0);
	float *hid = xmalloc((size_t)T * H * sizeof(float)), *lg = xmalloc((size_t)T * V * sizeof(float));
	bk_batch b = {.T = T, .S = 1, .ids = ids, .pos = pos, .cu_seqlens = cu};
	bk_model_forward(m, lo, &b, NULL, acts, hid);
	bk_model_logits(m, hid, lg, T);
	free(hid);
	bk_acts_free(m, acts);
	if (lo)
		bk_lora_free(m, lo);
	bk_model_unload(&lm);
	*T_out = T;
	*V_out = V;
	return lg;
}

/* max |a - b| / max |b| */
static double logit_err(const float *a, const float *b, size_t n)
{
	double d = 0, mx = 0;
	for (size_t i = 0; i < n; i++) {
		d = fmax(d, fabs((double)a[i] - b[i]));
		mx = fmax(mx, fabs((double)b[i]));
	}
	return d / mx;
}

/* checks every tensor of out against base (+ adapter), in dtype out_dt (-1: base's) */
static void check_tensors(const char *base_dir, const char *out_dir, const bk_adapter *ad,
			  int out_dt, const char *what)
{
	bk_st *b = bk_st_open(base_dir), *o = bk_st_open(out_dir);
	CHECK(bk_st_count(b) == bk_st_count(o), "%s: %zu tensors, base has %zu", what,
	      bk_st_count(o), bk_st_count(b));
	CHECK(bk_st_meta(o, "format") && !strcmp(bk_st_meta(o, "format"), "pt"),
	      "%s: metadata format is not pt", what);
	float scale = (float)(ad->alpha / ad->r);
	int merged = 0, copied = 0;
	double worst = 0;
	for (size_t i = 0; i < bk_st_count(b); i++) {
		const bk_st_tensor *tb = bk_st_at(b, i), *to = bk_st_find(o, tb->name);
		CHECK(to != NULL, "%s: tensor %s missing", what, tb->name);
		if (!to)
			continue;
		bk_dtype want = out_dt < 0 ? tb->dtype : (bk_dtype)out_dt;
		CHECK(to->dtype == want && to->ndim == tb->ndim &&
			      !memcmp(to->shape, tb->shape, sizeof to->shape),
		      "%s: %s dtype %s shape differs", what, tb->name, bk_dtype_name(to->dtype));
		int layer, m = -1;
		for (int mm = 0; mm < BK_PEFT_NMOD; mm++) {
			char name[128];
			for (layer = 0; layer < ad->n_layers; layer++) {
				snprintf(name, sizeof name, "model.layers.%d.%s.%s.weight", layer,
					 bk_peft_mod_parent[mm], bk_peft_mod_names[mm]);
				if (!strcmp(name, tb->name))
					break;
			}
			if (layer < ad->n_layers) {
				m = mm;
				break;
			}
		}
		size_t n = (size_t)bk_st_numel(tb);
		if (m < 0 || !(ad->targets & (1u << m))) {
			copied++;
			if (want == tb->dtype)
				CHECK(to->nbytes == tb->nbytes && !memcmp(to->data, tb->data, tb->nbytes),
				      "%s: %s is not copied unchanged", what, tb->name);
			continue;
		}
		merged++;
		float *w = xmalloc(n * sizeof(float)), *got = xmalloc(n * sizeof(float));
		bk_convert_to_f32(tb->dtype, tb->data, n, w);
		bk_convert_to_f32(to->dtype, to->data, n, got);
		const float *A = bk_adapter_a(ad, layer, m), *B = bk_adapter_b(ad, layer, m);
		int out = ad->out[m], in = ad->in[m];
		double tensor_worst = 0;
		for (int r = 0; r < out; r++)
			for (int c = 0; c < in; c++) {
				double s = 0, sabs = 0;
				for (int k = 0; k < ad->r; k++) {
					s += (double)B[r * ad->r + k] * A[k * in + c];
					sabs += fabs((double)B[r * ad->r + k] * A[k * in + c]);
				}
				double ref = (double)w[(size_t)r * in + c] + (double)scale * s;
				float g = got[(size_t)r * in + c];
				/* allowed: fp32 rounding of the r-term sum and of W + it (each at most
				 * 2^-24 relative per operation on the magnitudes involved), then
				 * half an ulp of the output dtype (f32: 2^-24, bf16: 2^-8 relative) */
				double half_ulp = want == BK_DT_F32 ? ldexp(1, -24)
						  : want == BK_DT_BF16 ? ldexp(1, -8) : ldexp(1, -11);
				double tol = fabs(ref) * half_ulp +
					     ldexp(1, -24) * (fabs(w[(size_t)r * in + c]) +
							      (ad->r + 2) * scale * sabs) + 1e-30;
				double e = fabs(g - ref) / tol;
				tensor_worst = fmax(tensor_worst, e);
			}
		worst = fmax(worst, tensor_worst);
		free(w), free(got);
	}
	CHECK(merged == ad->n_layers * __builtin_popcount(ad->targets),
	      "%s: %d tensors merged, want %d", what, merged,
	      ad->n_layers * __builtin_popcount(ad->targets));
	CHECK(worst <= 1, "%s: merged weights off by %.3g of the allowed rounding", what, worst);
	printf("%-22s %d merged, %d copied; worst merged weight error %.2f of the rounding bound\n",
	       what, merged, copied, worst);
	bk_st_close(b);
	bk_st_close(o);
}

static void write_bf16_copy(const char *src, const char *dst)
{
	bk_mkdir_p(dst);
	bk_st *st = bk_st_open(src);
	bk_st_writer *w = bk_st_writer_new();
	for (size_t i = 0; i < bk_st_count(st); i++) {
		const bk_st_tensor *t = bk_st_at(st, i);
		size_t n = (size_t)bk_st_numel(t);
		float *f = xmalloc(n * sizeof(float));
		bk_convert_to_f32(t->dtype, t->data, n, f);
		bk_st_writer_add_f32(w, t->name, BK_DT_BF16, t->ndim, t->shape, f);
		free(f);
	}
	char *p = bk_path_join(dst, "model.safetensors");
	bk_st_writer_write(w, p);
	free(p);
	bk_st_writer_free(w);
	bk_st_close(st);
	const char *files[] = {"config.json", "tokenizer.model"};
	for (int i = 0; i < 2; i++) {
		char *s = bk_path_join(src, files[i]), *d = bk_path_join(dst, files[i]);
		size_t n;
		char *text = bk_read_file(s, &n);
		bk_write_file_atomic(d, text, n);
		free(text), free(s), free(d);
	}
}

static void test_f32(const char *tmp, const bk_config *c)
{
	char *adir = bk_path_join(tmp, "adapter"), *out = bk_path_join(tmp, "merged");
	bk_adapter *orig = random_adapter(c, TARGETS, 11);
	bk_adapter_save(orig, adir);
	bk_adapter_free(orig);
	bk_adapter *ad = bk_adapter_load(adir, c);
	bk_merge_stats st = bk_merge_model(MODEL, ad, out, BK_MERGE_AUTO);
	CHECK(st.merged == 5 * 5, "merged %d tensors", st.merged);

	const char *same[] = {"config.json", "tokenizer.model", "tokenizer_config.json",
			      "generation_config.json"};
	for (int i = 0; i < 4; i++) {
		char *a = bk_path_join(MODEL, same[i]), *b = bk_path_join(out, same[i]);
		CHECK(bk_file_exists(b) && same_file(a, b), "%s not copied unchanged", same[i]);
		free(a), free(b);
	}
	char *sp = bk_path_join(out, "special_tokens_map.json");
	CHECK(!bk_file_exists(sp), "special_tokens_map.json appeared from nowhere");
	free(sp);
	char *tmpd = xasprintf("%s.tmp.%ld", out, (long)getpid());
	CHECK(!bk_file_exists(tmpd), "temporary directory %s left behind", tmpd);
	free(tmpd);
	check_tensors(MODEL, out, ad, -1, "F32 base, auto");

	int T, V;
	float *base = logits_of(MODEL, NULL, &T, &V), *ref = logits_of(MODEL, ad, &T, &V);
	float *mer = logits_of(out, NULL, &T, &V);
	double e = logit_err(mer, ref, (size_t)T * V), moved = logit_err(base, ref, (size_t)T * V);
	printf("F32: merged vs base+adapter logits %.2e (adapter moves logits by %.2e)\n", e, moved);
	CHECK(e < 1e-5, "F32 merged logits differ from base + adapter by %.3g", e);
	CHECK(moved > 1e-2, "the adapter hardly changes the logits (%.3g): a weak test", moved);
	free(base), free(ref), free(mer);

	/* --dtype bf16 from the F32 base: every tensor BF16, config says bfloat16 */
	char *out16 = bk_path_join(tmp, "merged-bf16");
	bk_merge_model(MODEL, ad, out16, BK_DT_BF16);
	check_tensors(MODEL, out16, ad, BK_DT_BF16, "F32 base, --dtype bf16");
	char *cfgp = bk_path_join(out16, "config.json");
	size_t n;
	char *text = bk_read_file(cfgp, &n);
	CHECK(strstr(text, "\"torch_dtype\": \"bfloat16\"") != NULL, "config.json: %s", text);
	bk_config *c16 = bk_config_load(cfgp);
	CHECK(c16->hidden_size == c->hidden_size, "rewritten config.json reads back");
	bk_config_free(c16);
	free(text), free(cfgp), free(out16);

	bk_adapter_free(ad);
	free(adir), free(out);
}

static void test_bf16(const char *tmp, const bk_config *c)
{
	char *bdir = bk_path_join(tmp, "bf16"), *adir = bk_path_join(tmp, "adapter"),
	     *out = bk_path_join(tmp, "merged-from-bf16"), *out32 = bk_path_join(tmp, "merged-f32");
	write_bf16_copy(MODEL, bdir);
	bk_adapter *ad = bk_adapter_load(adir, c);
	bk_merge_model(bdir, ad, out, BK_MERGE_AUTO);
	check_tensors(bdir, out, ad, -1, "BF16 base, auto");
	int T, V;
	float *ref = logits_of(bdir, ad, &T, &V), *mer = logits_of(out, NULL, &T, &V);
	double e = logit_err(mer, ref, (size_t)T * V);
	printf("BF16: merged vs base+adapter logits %.2e (bound 1e-2)\n", e);
	CHECK(e < 1e-2, "BF16 merged logits differ from base + adapter by %.3g", e);
	free(mer);
	/* the same merge kept in f32 is exact again */
	bk_merge_model(bdir, ad, out32, BK_DT_F32);
	check_tensors(bdir, out32, ad, BK_DT_F32, "BF16 base, --dtype f32");
	mer = logits_of(out32, NULL, &T, &V);
	e = logit_err(mer, ref, (size_t)T * V);
	printf("BF16 base merged to f32: logits %.2e\n", e);
	CHECK(e < 1e-5, "f32 merge of a bf16 base differs by %.3g", e);
	free(ref), free(mer);
	bk_adapter_free(ad);
	free(bdir), free(adir), free(out), free(out32);
}

/* an adapter written by PEFT (all seven modules) on a model with an untied LM head */
static void test_peft_adapter(const char *tmp)
{
	const char *model = "tests/golden/peft/tiny-model";
	char *out = bk_path_join(tmp, "merged-tiny");
	bk_config *c = bk_config_load(model);
	bk_adapter *ad = bk_adapter_load("tests/golden/peft/adapter-peft", c);
	bk_merge_stats st = bk_merge_model(model, ad, out, BK_MERGE_AUTO);
	CHECK(st.merged == c->n_layers * 7, "tiny-model: %d tensors merged", st.merged);
	check_tensors(model, out, ad, -1, "PEFT adapter, untied");
	int T, V;
	float *ref = logits_of(model, ad, &T, &V), *mer = logits_of(out, NULL, &T, &V);
	double e = logit_err(mer, ref, (size_t)T * V);
	printf("PEFT adapter on tiny-model: merged vs base+adapter logits %.2e\n", e);
	CHECK(e < 1e-5, "tiny-model merged logits differ by %.3g", e);
	free(ref), free(mer), free(out);
	bk_adapter_free(ad);
	bk_config_free(c);
}

static int write_adapter_main(const char *model, const char *dir, int other)
{
	bk_config *c = bk_config_load(model);
	if (other)
		c->intermediate_size += 8; /* another model: a wider MLP */
	bk_adapter *ad = random_adapter(c, other ? BK_PEFT_ALL : TARGETS, 3);
	bk_adapter_save(ad, dir);
	bk_adapter_free(ad);
	bk_config_free(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 4 && !strcmp(argv[1], "--write-adapter"))
		return write_adapter_main(argv[2], argv[3], argc > 4 && !strcmp(argv[4], "other"));
	char tmpl[] = "/tmp/bk-test-merge.XXXXXX";
	char *tmp = mkdtemp(tmpl);
	if (!tmp)
		die("mkdtemp failed");
	bk_config *c = bk_config_load(MODEL);
	test_f32(tmp, c);
	test_bf16(tmp, c);
	test_peft_adapter(tmp);
	bk_config_free(c);
	char *cmd = xasprintf("rm -rf '%s'", tmp);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", tmp);
	free(cmd);
	return bk_test_done("test_merge");
}
