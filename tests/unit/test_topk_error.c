/* test_topk_error.c - how far the top-k KL (bk-teach's sparse teacher field, gpu/teach.c,
 * then bk_loss_kl_topk) is from the exact KL (bk_loss_kl_exact), on models/stories260K,
 * 20 paired stories, no system prompt (teacher = base model, student = base + a random
 * LoRA with B ~ U(-0.01, 0.01)), at k = 8, 32, 64, 256 and V.  Prints the table.
 * Assertion: the relative error does not grow with k, up to the fp32 rounding floor
 * ROUND (the top-k sets are nested, so each coarsened KL is at most the next one: a
 * finer partition never loses divergence); it is clearly positive for k <= 64 and
 * below ROUND at k = V. */
#include "tests/harness.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "common/diag.h"
#include "common/rng.h"
#include "formats/tokenizer.h"
#include "formats/template.h"
#include "gpu/load.h"
#include "gpu/host/loss.h"
#include "gpu/teach.h"

static const char *const pairs[][2] = {
	{"Once upon a time, there was a little girl named Lily.", "She liked to play in the park with her red ball."},
	{"Tom had a big dog.", "The dog was happy and ran to the tree."},
	{"One day, a cat saw a bird.", "The cat wanted to play, but the bird flew away."},
	{"The sun was shining.", "Sue and her mom went to the beach to play in the sand."},
	{"Ben found a box in the garden.", "Inside the box there was a shiny toy car."},
	{"Mia was sad because it was raining.", "Her dad gave her a hug and they read a book together."},
	{"There was a small frog in the pond.", "The frog jumped on a leaf and said hello to the fish."},
	{"Max wanted to fly like a bird.", "He made wings from paper, but they did not work."},
	{"Anna had a new doll.", "She gave the doll a name and took it everywhere."},
	{"The little boy was hungry.", "His mom made him a big sandwich with cheese."},
	{"A bunny lived in the forest.", "Every day the bunny looked for carrots to eat."},
	{"Sam and Tim went to the park.", "They played on the slide and laughed a lot."},
	{"The old man had a garden.", "He grew flowers and gave them to his friends."},
	{"Lucy saw a big truck.", "The truck was loud and it made her jump."},
	{"A bear found some honey.", "He ate it all and then he took a long nap."},
	{"Kate wanted to bake a cake.", "She mixed flour, eggs and milk with her grandma."},
	{"The bird had a nest in the tree.", "In the nest there were three little eggs."},
	{"Jack lost his hat.", "He looked everywhere and found it under his bed."},
	{"The girl and the boy were friends.", "They shared their toys and never fought."},
	{"It was a cold day in the town.", "The children made a snowman with a carrot nose."},
};
#define NPAIR ((int)(sizeof pairs / sizeof pairs[0]))
#define ROUND 1e-5

int main(void)
{
	const char *dir = "models/stories260K";
	bk_loaded_model lm = bk_model_load(&bk_ops_host, dir);
	const bk_model *m = lm.model;
	const bk_ops *ops = m->ops;
	int V = m->cfg.V, H = m->cfg.H;
	float *owned;
	const float *head = bk_teach_lm_head(m, dir, &owned);

	/* tokenize: raw template, no system prompt: teacher and student prompts are equal */
	bk_tok *spm = bk_tok_open("models/stories260K/tokenizer.model");
	bk_ids prompt[NPAIR], resp[NPAIR];
	bk_teach_seq sq[NPAIR];
	int N = 0, T = 0;
	for (int i = 0; i < NPAIR; i++) {
		prompt[i] = (bk_ids){0};
		resp[i] = (bk_ids){0};
		bk_template_prompt(BK_TMPL_RAW, spm, NULL, pairs[i][0], &prompt[i]);
		bk_template_response(BK_TMPL_RAW, spm, pairs[i][1], &resp[i]);
		sq[i] = (bk_teach_seq){prompt[i].v, (int)prompt[i].n, resp[i].v, (int)resp[i].n};
		N += sq[i].n;
		T += sq[i].a + sq[i].n - 1;
	}

	/* student: base + LoRA (r 8, alpha 16, all modules), A as PEFT inits it, B random */
	bk_lora *lo = bk_lora_create(m, 8, 16.0f, 0.0f, BK_LORA_ALL);
	bk_lora_init_peft(m, lo, 1);
	bk_rng rng;
	bk_rng_seed(&rng, 2);
	for (int l = 0; l < lo->L; l++)
		for (int mod = 0; mod < BK_LORA_NMOD; mod++) {
			int in, out;
			bk_model_module_dims(&m->cfg, mod, &in, &out);
			size_t nb = (size_t)out * lo->r;
			float *b = xmalloc(nb * sizeof(float));
			for (size_t j = 0; j < nb; j++)
				b[j] = (float)(bk_rng_uniform(&rng) * 2 - 1) * 0.01f;
			ops->upload(lo->B[l][mod], b, nb * sizeof(float));
			free(b);
		}

	/* student and teacher hidden rows, every sequence in one packed forward each */
	int32_t *ids = xmalloc((size_t)T * sizeof(int32_t)), *pos = xmalloc((size_t)T * sizeof(int32_t));
	int32_t cu[NPAIR + 1], *sample = xmalloc((size_t)N * sizeof(int32_t));
	cu[0] = 0;
	for (int i = 0, t = 0, r = 0; i < NPAIR; i++) {
		for (int j = 0; j < sq[i].a + sq[i].n - 1; j++, t++) {
			ids[t] = j < sq[i].a ? sq[i].prompt[j] : sq[i].resp[j - sq[i].a];
			pos[t] = j;
		}
		cu[i + 1] = t;
		for (int j = 0; j < sq[i].n; j++)
			sample[r++] = i;
	}
	bk_acts *acts = bk_acts_create(m, T, lo->r);
	float *hid = ops->alloc((size_t)T * H * sizeof(float));
	float *srows = xmalloc((size_t)N * H * sizeof(float)), *trows = xmalloc((size_t)N * H * sizeof(float));
	bk_batch b = {.T = T, .S = NPAIR, .ids = ids, .pos = pos, .cu_seqlens = cu};
	for (int side = 0; side < 2; side++) {
		bk_model_forward(m, side ? NULL : lo, &b, NULL, acts, hid);
		for (int i = 0, r = 0; i < NPAIR; i++) {
			ops->download((side ? trows : srows) + (size_t)r * H,
				      hid + (size_t)(cu[i + 1] - sq[i].n) * H,
				      (size_t)sq[i].n * H * sizeof(float));
			r += sq[i].n;
		}
	}
	double exact = bk_loss_kl_exact(srows, head, trows, NULL, sample, N, NPAIR, H, V, 256, 1.0f, 0.0f,
					NULL, NULL);
	printf("stories260K, %d pairs, %d response rows, student = base + LoRA (r 8, B ~ U(-0.01, 0.01))\n",
	       NPAIR, N);
	printf("exact KL %.6f\n", exact);
	printf("%6s %12s %12s %14s\n", "k", "top-k KL", "rel. error", "mean rest");
	CHECK(exact > 1e-4, "student and teacher differ (exact KL %g)", exact);

	int ks[] = {8, 32, 64, 256, 0 /* = V */};
	double prev = INFINITY;
	int32_t *kid = xmalloc((size_t)N * V * sizeof(int32_t));
	float *klp = xmalloc((size_t)N * V * sizeof(float)), *krest = xmalloc((size_t)N * sizeof(float));
	bk_teacher out[NPAIR];
	memset(out, 0, sizeof out);
	for (size_t ki = 0; ki < sizeof ks / sizeof ks[0]; ki++) {
		int k = ks[ki] ? ks[ki] : V;
		bk_teach *tc = bk_teach_create(m, head, 4096, k, 1.0f, 8192);
		bk_teach_prefix_from(tc, sq, NPAIR);
		bk_teach_run(tc, sq, NPAIR, out);
		bk_teach_free(tc);
		double mean_rest = 0;
		for (int i = 0, r = 0; i < NPAIR; i++) {
			memcpy(kid + (size_t)r * k, out[i].ids, (size_t)out[i].n * k * sizeof(int32_t));
			memcpy(klp + (size_t)r * k, out[i].logp, (size_t)out[i].n * k * sizeof(float));
			memcpy(krest + r, out[i].rest, (size_t)out[i].n * sizeof(float));
			r += out[i].n;
		}
		for (int r = 0; r < N; r++)
			mean_rest += krest[r] / N;
		double lk = bk_loss_kl_topk(srows, head, kid, klp, krest, sample, N, NPAIR, H, V, k, 256,
					    1.0f, 0.0f, NULL, NULL);
		double err = fabs(lk - exact) / exact;
		printf("%6d %12.6f %12.3e %14.3e\n", k, lk, err, mean_rest);
		/* ROUND: the fp32 rounding floor of the comparison (the error at k = V) */
		CHECK(err <= prev + ROUND, "k %d: relative error %.3g above the %.3g of a smaller k",
		      k, err, prev);
		if (k <= 64)
			CHECK(lk < exact && err > 100 * ROUND,
			      "k %d: top-k KL %.8f is not clearly below the exact %.8f", k, lk, exact);
		if (k == V)
			CHECK(err < ROUND, "k = V: relative error %.3g", err);
		prev = err;
	}
	for (int i = 0; i < NPAIR; i++) {
		bk_teacher_free(&out[i]);
		free(prompt[i].v), free(resp[i].v);
	}
	free(kid), free(klp), free(krest), free(ids), free(pos), free(sample), free(srows), free(trows);
	ops->free(hid);
	bk_acts_free(m, acts);
	bk_lora_free(m, lo);
	bk_tok_free(spm);
	free(owned);
	bk_model_unload(&lm);
	return bk_test_done("test_topk_error");
}
