/* test_hubdata.c - hub datasets (formats/hubdata.c): the split syntax against what the
 * `datasets` library makes of each spec (tests/golden/hubdata/splits.json, written by
 * tests/ref/make_split_spec_golden.py), the files of a split in the hub's layouts, and
 * the rows of a split read from a directory laid out as a hub repo (the golden parquet
 * files of test_parquet plus JSON Lines), with their one-line errors. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/hubdata.h"
#include "tests/harness.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void check_specs(void)
{
	json_error_t err;
	json_t *root = json_load_file("tests/golden/hubdata/splits.json", 0, &err);
	if (!root)
		BUG("splits.json: %s", err.text);
	json_t *cases = json_object_get(root, "cases");
	size_t i, nok = 0, nerr = 0;
	json_t *c;
	json_array_foreach(cases, i, c) {
		const char *spec = json_string_value(json_object_get(c, "spec"));
		int64_t n = json_integer_value(json_object_get(c, "n"));
		json_t *parts = json_object_get(c, "parts");
		char msg[512];
		bk_split_spec sp;
		int rc = bk_split_parse(spec, &sp, msg, sizeof msg), parsed = !rc;
		int64_t from[16], to[16];
		for (size_t k = 0; !rc && k < sp.n && k < 16; k++)
			rc = bk_split_bounds(&sp.v[k], n, &from[k], &to[k], msg, sizeof msg);
		if (!parts) {
			CHECK(rc, "'%s' over %lld rows: datasets refuses it, we accept it", spec,
			      (long long)n);
			nerr++;
		} else {
			CHECK(!rc, "'%s' over %lld rows: refused (%s), datasets accepts it", spec,
			      (long long)n, msg);
			if (!rc) {
				CHECK(sp.n == json_array_size(parts), "'%s': %zu parts", spec, sp.n);
				for (size_t k = 0; k < sp.n && k < json_array_size(parts); k++) {
					json_t *p = json_array_get(parts, k);
					const char *name = json_string_value(json_array_get(p, 0));
					int64_t f = json_integer_value(json_array_get(p, 1));
					int64_t t = json_integer_value(json_array_get(p, 2));
					CHECK(!strcmp(sp.v[k].split, name) && from[k] == f && to[k] == t,
					      "'%s' over %lld rows, part %zu: %s [%lld, %lld), datasets "
					      "%s [%lld, %lld)", spec, (long long)n, k, sp.v[k].split,
					      (long long)from[k], (long long)to[k], name, (long long)f,
					      (long long)t);
				}
			}
			nok++;
		}
		if (parsed)
			bk_split_free(&sp);
	}
	CHECK(nok > 200 && nerr > 50, "%zu accepted and %zu refused cases", nok, nerr);
	json_decref(root);
}

/* the files of split among paths, joined by ' ' ("" for none) */
static char *files_of(const char *const *paths, size_t n, const char *split, char **names)
{
	size_t k;
	char **f = bk_split_files(paths, n, split, &k, names);
	char *s = xstrdup("");
	for (size_t i = 0; i < k; i++) {
		char *t = xasprintf("%s%s%s", s, i ? " " : "", f[i]);
		free(s);
		s = t;
		free(f[i]);
	}
	free(f);
	return s;
}

/* the same through bk_split_files_card: rc, and the files joined by ' ' */
static int card_files_of(const char *readme, const char *config, const char *const *paths,
			 size_t n, const char *split, char **got, char **names, char *err,
			 size_t errlen)
{
	size_t k;
	char **f;
	int rc = bk_split_files_card(readme, strlen(readme), config, paths, n, split, &f, &k,
				     names, err, errlen);
	char *s = xstrdup("");
	for (size_t i = 0; i < k; i++) {
		char *t = xasprintf("%s%s%s", s, i ? " " : "", f[i]);
		free(s);
		s = t;
		free(f[i]);
	}
	free(f);
	*got = s;
	return rc;
}

/* every layout of tests/golden/hubdata/split_files.json: the files of each split
 * (and of train/validation/test/nosuch) and the splits found, as datasets has them;
 * with a README (its `configs:`), through bk_split_files_card, and datasets' refusals
 * refused in one line naming README.md */
static void check_files(void)
{
	json_error_t err;
	json_t *root = json_load_file("tests/golden/hubdata/split_files.json", 0, &err);
	if (!root)
		BUG("split_files.json: %s", err.text);
	size_t ci, ncase = 0, ncard = 0, nrefused = 0;
	json_t *c;
	json_array_foreach(json_object_get(root, "cases"), ci, c) {
		json_t *jp = json_object_get(c, "paths"), *splits = json_object_get(c, "splits");
		size_t n = json_array_size(jp);
		const char **paths = xcalloc(n + 1, sizeof *paths);
		for (size_t i = 0; i < n; i++)
			paths[i] = json_string_value(json_array_get(jp, i));
		const char *readme = json_string_value(json_object_get(c, "readme"));
		const char *config = json_string_value(json_object_get(c, "config"));
		const char *gerr = json_string_value(json_object_get(c, "error"));
		char emsg[512];
		if (readme)
			ncard++;
		if (gerr) {
			char *got, *gn;
			emsg[0] = 0;
			int rc = card_files_of(readme, config, paths, n, "train", &got, &gn, emsg,
					       sizeof emsg);
			CHECK(rc == -1 && !strncmp(emsg, "README.md: ", 11) && !strchr(emsg, '\n'),
			      "layout %zu: datasets refuses it (%s), we give rc %d, files '%s' (%s)",
			      ci, gerr, rc, got, emsg);
			nrefused++;
			free(got);
			free(gn);
			free(paths);
			ncase++;
			continue;
		}
		char *names = xstrdup("");
		const char *k;
		json_t *v;
		json_object_foreach(splits, k, v) {
			char *t = xasprintf("%s%s%s", names, *names ? ", " : "", k);
			free(names);
			names = t;
		}
		const char *extra[] = {"train", "validation", "test", "nosuch"};
		for (size_t e = 0; e < json_object_size(splits) + 4; e++) {
			const char *split = NULL;
			if (e < json_object_size(splits)) {
				size_t i = 0;
				json_object_foreach(splits, k, v)
					if (i++ == e)
						split = k;
			} else {
				split = extra[e - json_object_size(splits)];
			}
			char *want = xstrdup("");
			size_t i;
			json_array_foreach(json_object_get(splits, split), i, v) {
				char *t = xasprintf("%s%s%s", want, i ? " " : "", json_string_value(v));
				free(want);
				want = t;
			}
			char *got_names, *got;
			int listed = json_object_get(splits, split) != NULL;
			if (readme) {
				emsg[0] = 0;
				int rc = card_files_of(readme, config, paths, n, split, &got, &got_names,
						       emsg, sizeof emsg);
				/* a split the config's data_files does not list is refused */
				CHECK(rc == 0 || (!listed && !strncmp(emsg, "README.md: ", 11)),
				      "layout %zu, split %s: rc %d (%s)", ci, split, rc, emsg);
				if (rc) {
					free(got_names);
					got_names = xstrdup(names);
				}
			} else {
				got = files_of(paths, n, split, &got_names);
			}
			CHECK(!strcmp(got, want), "layout %zu, split %s: files '%s', datasets '%s'", ci,
			      split, got, want);
			CHECK(!strcmp(got_names ? got_names : "", names),
			      "layout %zu, split %s: splits '%s', datasets '%s'", ci, split,
			      got_names ? got_names : "", names);
			free(got);
			free(got_names);
			free(want);
		}
		free(names);
		free(paths);
		ncase++;
	}
	CHECK(ncase >= 45 && ncard >= 30 && nrefused >= 14,
	      "%zu layouts, %zu with a README, %zu refused", ncase, ncard, nrefused);
	json_decref(root);
}

static char tmp[64];

static void put(const char *rel, const char *src, const char *text)
{
	char *p = bk_path_join(tmp, rel);
	char *dir = xstrdup(p);
	*strrchr(dir, '/') = 0;
	bk_mkdir_p(dir);
	if (src) {
		size_t len;
		char *buf = bk_read_file(src, &len);
		bk_write_file_atomic(p, buf, len);
		free(buf);
	} else {
		bk_write_file_atomic(p, text, strlen(text));
	}
	free(dir);
	free(p);
}

static void load(bk_dataset *ds, const char *spec)
{
	memset(ds, 0, sizeof *ds);
	bk_dataset_load_dir(ds, "repo", tmp, spec);
}

typedef struct {
	const char *spec;
} load_ctx;

static void do_load(void *arg)
{
	bk_dataset ds;
	load(&ds, ((load_ctx *)arg)->spec);
}

static void check_load(void)
{
	snprintf(tmp, sizeof tmp, "/tmp/bk-hubdata-%d", (int)getpid());
	const char *G = "tests/golden/parquet/";
	char *u = xasprintf("%sultrachat.parquet", G), *p = xasprintf("%spairs.parquet", G);
	/* two shards of the 11-row ultrachat file, one of the 40-row pairs */
	put("data/train_sft-00000-of-00002.parquet", u, NULL);
	put("data/train_sft-00001-of-00002.parquet", u, NULL);
	put("data/test_sft-00000-of-00001.parquet", p, NULL);
	put("README.md", NULL, "---\n---\n");
	bk_dataset ds;
	/* rows 0-2 of ultrachat: row 1 has two user/assistant pairs */
	load(&ds, "train_sft[:3]");
	CHECK(ds.n == 4 && ds.paired, "train_sft[:3]: %zu samples", ds.n);
	if (ds.n == 4) {
		CHECK(!strncmp(ds.v[0].prompt, "question 0: how do I boil", 25), "%s", ds.v[0].prompt);
		CHECK(!strcmp(ds.v[2].prompt, "and then?") && !strcmp(ds.v[2].response, "peel it."),
		      "%s / %s", ds.v[2].prompt, ds.v[2].response);
	}
	bk_dataset_free(&ds);
	/* the last two rows: rows 9, 10 of the second shard (row 10: two pairs) */
	load(&ds, "train_sft[-2:]");
	CHECK(ds.n == 3 && !strncmp(ds.v[0].prompt, "question 9:", 11) &&
		      !strncmp(ds.v[1].prompt, "question 10:", 12),
	      "train_sft[-2:]: %zu samples", ds.n);
	bk_dataset_free(&ds);
	/* across the shard boundary (rows 10, 11 = file 1 row 10, file 2 row 0) */
	load(&ds, "train_sft[10:12]");
	CHECK(ds.n == 3 && !strncmp(ds.v[0].prompt, "question 10:", 12) &&
		      !strncmp(ds.v[2].prompt, "question 0:", 11),
	      "train_sft[10:12]: %zu samples", ds.n);
	bk_dataset_free(&ds);
	/* percent of 40 pairs rows, plus a second part */
	load(&ds, "test_sft[:10%] + test_sft[-1:]");
	CHECK(ds.n == 5 && !strcmp(ds.v[0].prompt, "prompt number 0 ") &&
		      !strcmp(ds.v[4].prompt, "prompt number 39 xxxx"),
	      "test_sft[:10%%]+test_sft[-1:]: %zu samples", ds.n);
	bk_dataset_free(&ds);
	/* errors: one line naming the repo and the split */
	load_ctx c = {"train"};
	bk_expect_die("unknown split", do_load, &c,
		      "repo: no data files for split 'train' (its splits: ", "test_sft, train_sft");
	c.spec = "train_sft[:150%]";
	bk_expect_die("bad spec", do_load, &c, "repo: split 'train_sft[:150%]': percent", NULL);
	c.spec = "train_sft[5:5]";
	bk_expect_die("empty", do_load, &c, "repo: split 'train_sft[5:5]': no samples", NULL);
	c.spec = "train_sft[:5%](pct1_dropremainder)";
	bk_expect_die("pct1", do_load, &c, "fewer than 100 rows (22)", NULL);

	/* a cache that holds only the first of two shards (an earlier [:3] fetched it) */
	char *s1 = bk_path_join(tmp, "data/train_sft-00001-of-00002.parquet");
	CHECK(unlink(s1) == 0, "%s", s1);
	free(s1);
	load(&ds, "train_sft[:3]");
	CHECK(ds.n == 4, "train_sft[:3] from shard 0 alone: %zu samples", ds.n);
	bk_dataset_free(&ds);
	c.spec = "train_sft[-2:]";
	bk_expect_die("missing shard", do_load, &c,
		      "repo: split 'train_sft' has 2 shards, 1 of them here", NULL);
	c.spec = "train_sft[8:12]";
	bk_expect_die("missing shard, slice", do_load, &c,
		      "repo: split 'train_sft' has 2 shards, 1 of them here, and rows up to 12", NULL);

	/* a repo laid out by split directories, JSON Lines and parquet mixed */
	char *cmd = xasprintf("rm -rf %s", tmp);
	CHECK(system(cmd) == 0, "%s", cmd);
	put("train/a.jsonl", NULL,
	    "{\"prompt\": \"j1\", \"response\": \"r1\"}\n\n{\"prompt\": \"j2\", \"response\": \"r2\"}\n");
	put("train/b.parquet", p, NULL);
	put("test/x.json", NULL, "[{\"question\": \"q\"}]");
	load(&ds, "train[1:4]");
	CHECK(ds.n == 3 && !strcmp(ds.v[0].prompt, "j2") &&
		      !strcmp(ds.v[1].prompt, "prompt number 0 ") &&
		      !strcmp(ds.v[2].prompt, "prompt number 1 x"),
	      "train[1:4]: %zu samples", ds.n);
	bk_dataset_free(&ds);
	load(&ds, "test");
	CHECK(ds.n == 1 && !strcmp(ds.v[0].prompt, "q") && !ds.v[0].response, "test: %zu", ds.n);
	bk_dataset_free(&ds);
	/* the columns the tool reads: no row system, no system messages, no user_message */
	put("valid/v.jsonl", NULL,
	    "{\"messages\": [{\"role\": \"system\", \"content\": \"S\"}, {\"role\": \"user\", "
	    "\"content\": \"u\"}, {\"role\": \"assistant\", \"content\": \"a\"}], \"system\": \"X\"}\n"
	    "{\"prompt\": \"p\", \"system\": \"Y\", \"user_message\": \"um\"}\n");
	/* "valid" is one of datasets' names of the validation split; with a messages
	 * column every row is a chat row (the tool's _load_hf): row 2 has none, skipped */
	load(&ds, "validation");
	CHECK(ds.n == 1 && ds.skipped == 1 && !strcmp(ds.v[0].prompt, "u") && !ds.v[0].system,
	      "validation: %zu samples, %zu skipped, system '%s'", ds.n, ds.skipped,
	      ds.n ? (ds.v[0].system ? ds.v[0].system : "") : "");
	bk_dataset_free(&ds);
	put("valid/v.jsonl", NULL, "{\"user_message\": \"um\"}\n");
	c.spec = "validation";
	bk_expect_die("user_message", do_load, &c,
		      "repo: valid/v.jsonl: no messages and no prompt column (tried prompt, input, "
		      "question, text, instruction); its columns: user_message", NULL);
	/* the columns are chosen once, by presence (the tool's _load_hf): a null or empty
	 * prompt skips the row, another column is not looked at */
	put("valid/v.jsonl", NULL,
	    "{\"prompt\": \"P1\", \"question\": \"Q1\", \"response\": \"R1\"}\n"
	    "{\"prompt\": null, \"question\": \"Q2\", \"response\": \"R2\"}\n"
	    "{\"prompt\": \"\", \"question\": \"Q3\", \"response\": \"R3\"}\n"
	    "{\"question\": \"Q4\", \"response\": \"R4\"}\n"
	    "{\"prompt\": \"P6\", \"question\": null, \"response\": \"   \"}\n");
	load(&ds, "validation");
	CHECK(ds.n == 2 && ds.skipped == 3 && !strcmp(ds.v[0].prompt, "P1") &&
		      !strcmp(ds.v[1].prompt, "P6") && !strcmp(ds.v[1].response, "   "),
	      "columns once: %zu samples, %zu skipped", ds.n, ds.skipped);
	bk_dataset_free(&ds);
	put("valid/v.jsonl", NULL,
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"A\"},{\"role\":\"assistant\",\"content\":\"B\"}]}\n"
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"D\"},{\"role\":\"user\",\"content\":\"\"},"
	    "{\"role\":\"assistant\",\"content\":\"E\"}]}\n"
	    "{\"messages\":[{\"role\":\"user\",\"content\":\"F\"},{\"role\":\"assistant\",\"content\":\" \\u3000\\n\"}]}\n");
	load(&ds, "validation");
	/* A/B; D..E: the nearest user turn is empty; F's answer is white space (a
	 * prompt-only sample of F, dropped by bk-tokenize in a paired dataset) */
	CHECK(ds.n == 2 && ds.skipped == 1 && !strcmp(ds.v[0].prompt, "A") &&
		      !strcmp(ds.v[0].response, "B") && !strcmp(ds.v[1].prompt, "F") &&
		      !ds.v[1].response,
	      "messages: %zu samples, %zu skipped", ds.n, ds.skipped);
	bk_dataset_free(&ds);
	/* a format datasets reads and bakery does not: refused, naming it */
	put("valid/w.csv", NULL, "prompt\nx\n");
	bk_expect_die("csv", do_load, &c,
		      "repo: split 'validation': valid/w.csv is a data file datasets reads, in a "
		      "format bakery does not", NULL);
	/* a bad row names the file and the row */
	put("train/a.jsonl", NULL, "{\"prompt\": \"j1\"}\n{\"prompt\": 3}\n");
	c.spec = "train[:2]";
	bk_expect_die("bad row", do_load, &c, "repo: train/a.jsonl: row 2: key 'prompt' is not a string",
		      NULL);
	CHECK(system(cmd) == 0, "%s", cmd);
	free(cmd);
	free(u);
	free(p);
}

int main(int argc, char **argv)
{
	(void)argc;
	bk_diag_init(argv[0]);
	check_specs();
	check_files();
	check_load();
	return bk_test_done("test_hubdata");
}
