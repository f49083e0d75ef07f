/* gguf_compare.h - the GGUF tests' comparison of a converted model with the one
 * transformers' GGUF loader wrote (test_gguf.c, test_gguf_gemma3.c): every tensor present
 * with the dtype dt and its shape, every value equal bit for bit (the reference rounded to
 * bf16 when dt is bf16).  Header-only: each test is one translation unit. */
#ifndef BK_GGUF_COMPARE_H
#define BK_GGUF_COMPARE_H

#include <stdio.h>
#include <string.h>

#include "common/diag.h"
#include "formats/safetensors.h"
#include "tests/harness.h"

/* label: the GGUF's name in the summary line */
static void gguf_compare_model(const char *out, const char *ref_path, const char *label,
			       bk_dtype dt)
{
	bk_st *ours = bk_st_open(out);
	bk_st *ref = bk_st_open(ref_path);
	CHECK(bk_st_count(ours) == bk_st_count(ref), "%zu tensors, transformers %zu",
	      bk_st_count(ours), bk_st_count(ref));
	int64_t bad = 0, total = 0;
	for (size_t i = 0; i < bk_st_count(ref); i++) {
		const bk_st_tensor *r = bk_st_at(ref, i), *o = bk_st_find(ours, r->name);
		CHECK(o != NULL, "%s missing", r->name);
		if (!o)
			continue;
		CHECK(o->dtype == dt, "%s: dtype %s", r->name, bk_dtype_name(o->dtype));
		CHECK(o->ndim == r->ndim && !memcmp(o->shape, r->shape, sizeof(int64_t) * r->ndim),
		      "%s: shape differs", r->name);
		size_t n = (size_t)bk_st_numel(r);
		if ((size_t)bk_st_numel(o) != n)
			continue;
		float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
		bk_convert_to_f32(o->dtype, o->data, n, a);
		bk_convert_to_f32(r->dtype, r->data, n, b);
		int64_t bt = 0;
		for (size_t k = 0; k < n; k++) {
			float want = dt == BK_DT_BF16 ? bk_bf16_to_f32(bk_f32_to_bf16(b[k])) : b[k];
			bt += memcmp(&a[k], &want, 4) != 0;
		}
		CHECK(bt == 0, "%s: %lld of %zu values differ", r->name, (long long)bt, n);
		bad += bt;
		total += (int64_t)n;
		free(a);
		free(b);
	}
	printf("%s -> %s (%s): %zu tensors, %lld values, %lld differ from transformers\n",
	       label, out, bk_dtype_name(dt), bk_st_count(ours), (long long)total, (long long)bad);
	bk_st_close(ours);
	bk_st_close(ref);
}

#endif
