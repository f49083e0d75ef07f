/* test_hub.c - formats/hub.c: SHA-256 / git blob SHA-1 against published vectors, repo
 * ids, the cache root from the environment, and the dataset side of the API
 * (bk_hub_list, bk_hub_file with optional files and .no_exist, bk_hub_snapshot with
 * patterns, offline) against tests/hubserver.py on 127.0.0.1. */
#include "common/diag.h"
#include "common/files.h"
#include "formats/hub.h"
#include "tests/harness.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static char tmp[256];

static char *write_tmp(const char *name, const void *data, size_t n)
{
	char *p = xasprintf("%s/%s", tmp, name);
	bk_write_file_atomic(p, data, n);
	return p;
}

static void test_sha(void)
{
	char h[65];
	char *p = write_tmp("abc", "abc", 3);
	CHECK(!bk_sha256_file(p, h) &&
		      !strcmp(h, "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
	      "sha256(abc) %s", h);
	CHECK(!bk_sha1_file(p, 0, h) && !strcmp(h, "a9993e364706816aba3e25717850c26c9cd0d89d"),
	      "sha1(abc) %s", h);
	free(p);
	p = write_tmp("empty", "", 0);
	CHECK(!bk_sha256_file(p, h) &&
		      !strcmp(h, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"),
	      "sha256('') %s", h);
	free(p);
	/* git hash-object of "hello\n" */
	p = write_tmp("hello", "hello\n", 6);
	CHECK(!bk_sha1_file(p, 1, h) && !strcmp(h, "ce013625030ba8dba906f756967f9e9ca394464a"),
	      "git blob sha1(hello) %s", h);
	free(p);
	/* FIPS 180-2: a million 'a' (blocks cross the read buffer) */
	char *m = xmalloc(1000000);
	memset(m, 'a', 1000000);
	p = write_tmp("million", m, 1000000);
	CHECK(!bk_sha256_file(p, h) &&
		      !strcmp(h, "cdc76e5c9914fb9281a1c7e284d73e67f1809a48a497200e046d39ccc7112cd0"),
	      "sha256(a x 1e6) %s", h);
	CHECK(!bk_sha1_file(p, 0, h) && !strcmp(h, "34aa973cd4c4daa4f61eeb2bdbad27316534016f"),
	      "sha1(a x 1e6) %s", h);
	free(p);
	free(m);
	CHECK(bk_sha256_file("/nonexistent/x", h) == -1, "unreadable");
}

static void test_ids(void)
{
	static const char *const good[] = {"Qwen/Qwen3-0.6B", "gpt2", "NbAiLab/borealis-1b-instruct-preview",
					   "HuggingFaceH4/ultrachat_200k", "a.b/c_d", NULL};
	static const char *const bad[] = {"", "/abs/path", "./x", "../x", "a/b/c", "a//b", "a/",
					  "/a", "a/../b", "~/x", "a b/c", "org/.hidden", "a--b/c",
					  "-x/y", NULL};
	for (int i = 0; good[i]; i++)
		CHECK(bk_hub_is_id(good[i]), "'%s' is an id", good[i]);
	for (int i = 0; bad[i]; i++)
		CHECK(!bk_hub_is_id(bad[i]), "'%s' is not an id", bad[i]);
}

static void test_cache_dir(void)
{
	unsetenv("HUGGINGFACE_HUB_CACHE");
	setenv("HOME", "/h", 1);
	unsetenv("HF_HUB_CACHE"), unsetenv("HF_HOME"), unsetenv("XDG_CACHE_HOME");
	char *c = bk_hub_cache_dir();
	CHECK(!strcmp(c, "/h/.cache/huggingface/hub"), "%s", c);
	free(c);
	setenv("XDG_CACHE_HOME", "/x", 1);
	c = bk_hub_cache_dir();
	CHECK(!strcmp(c, "/x/huggingface/hub"), "%s", c);
	free(c);
	setenv("HF_HOME", "/hf", 1);
	c = bk_hub_cache_dir();
	CHECK(!strcmp(c, "/hf/hub"), "%s", c);
	free(c);
	setenv("HF_HUB_CACHE", "/cache", 1);
	c = bk_hub_cache_dir();
	CHECK(!strcmp(c, "/cache"), "%s", c);
	free(c);
	/* huggingface_hub: HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE (Python's `or`: an empty
	 * HF_HUB_OFFLINE gives way); datasets: HF_DATASETS_OFFLINE as well */
	static const struct {
		const char *hub, *tf, *ds, *model_var, *dataset_var;
	} off[] = {
		{"true", NULL, NULL, "HF_HUB_OFFLINE", "HF_HUB_OFFLINE"},
		{"ON", NULL, NULL, "HF_HUB_OFFLINE", "HF_HUB_OFFLINE"},
		{"0", NULL, NULL, NULL, NULL},
		{"2", NULL, NULL, NULL, NULL},
		{NULL, "1", NULL, "TRANSFORMERS_OFFLINE", "TRANSFORMERS_OFFLINE"},
		{"", "yes", NULL, "TRANSFORMERS_OFFLINE", "TRANSFORMERS_OFFLINE"},
		{"0", "1", NULL, NULL, NULL},
		{NULL, NULL, "1", NULL, "HF_DATASETS_OFFLINE"},
		{NULL, NULL, "TRUE", NULL, "HF_DATASETS_OFFLINE"},
		{NULL, NULL, "0", NULL, NULL},
		{"1", NULL, "0", "HF_HUB_OFFLINE", "HF_HUB_OFFLINE"},
		{NULL, "1", "1", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"},
		{NULL, NULL, NULL, NULL, NULL},
	};
	for (size_t i = 0; i < sizeof off / sizeof *off; i++) {
		const char *names[] = {"HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE"};
		const char *vals[] = {off[i].hub, off[i].tf, off[i].ds};
		for (int k = 0; k < 3; k++)
			if (vals[k])
				setenv(names[k], vals[k], 1);
			else
				unsetenv(names[k]);
		const char *m = bk_hub_offline_var(BK_HUB_MODEL), *d = bk_hub_offline_var(BK_HUB_DATASET);
		CHECK((!m && !off[i].model_var) || (m && off[i].model_var && !strcmp(m, off[i].model_var)),
		      "offline case %zu: models: %s", i, m ? m : "online");
		CHECK((!d && !off[i].dataset_var) ||
			      (d && off[i].dataset_var && !strcmp(d, off[i].dataset_var)),
		      "offline case %zu: datasets: %s", i, d ? d : "online");
		CHECK(bk_hub_offline(BK_HUB_MODEL) == (m != NULL), "offline case %zu", i);
	}
}

/* ---- against the loopback hub ---- */

static pid_t server;

static int start_server(const char *root)
{
	char *pf = xasprintf("%s/port", tmp);
	server = fork();
	if (!server) {
		execlp("python3", "python3", "tests/hubserver.py", "--root", root, "--port-file", pf,
		       (char *)NULL);
		_exit(127);
	}
	int port = 0;
	for (int i = 0; i < 100 && !port; i++) {
		FILE *f = fopen(pf, "r");
		if (f) {
			if (fscanf(f, "%d", &port) != 1)
				port = 0;
			fclose(f);
		}
		if (!port)
			usleep(100000);
	}
	free(pf);
	return port;
}

static void missing_required(void *arg)
{
	(void)arg;
	bk_hub_file(BK_HUB_DATASET, "org/data", NULL, "no-such.json", 0);
}

static void escaping_path(void *arg)
{
	bk_hub_file(BK_HUB_DATASET, "org/data", NULL, arg, 0);
}

static void list_offline(void *arg)
{
	bk_hub_listing l;
	(void)arg;
	bk_hub_list(BK_HUB_DATASET, "org/data", NULL, &l);
}

static void test_dataset_api(void)
{
	char *root = xasprintf("%s/root", tmp), *repo = xasprintf("%s/datasets/org/data/data", root);
	bk_mkdir_p(repo);
	char *a = xasprintf("%s/train.jsonl", repo), *b = xasprintf("%s/test.jsonl", repo),
	     *q = xasprintf("%s/train-00000-of-00001.parquet", repo),
	     *rd = xasprintf("%s/datasets/org/data/README.md", root);
	bk_write_file_atomic(a, "{\"x\": 1}\n", 9);
	bk_write_file_atomic(b, "{\"x\": 2}\n", 9);
	bk_write_file_atomic(q, "PAR1 not really PAR1", 20);
	bk_write_file_atomic(rd, "# data\n", 7);
	int port = start_server(root);
	CHECK(port > 0, "hub server started");
	if (port <= 0)
		goto out;
	char *ep = xasprintf("http://127.0.0.1:%d", port), *cache = xasprintf("%s/cache", tmp);
	setenv("HF_ENDPOINT", ep, 1);
	setenv("NO_PROXY", "127.0.0.1", 1), setenv("no_proxy", "127.0.0.1", 1);
	setenv("HF_HUB_CACHE", cache, 1);
	unsetenv("HF_TOKEN"), unsetenv("HF_HUB_OFFLINE");
	setenv("HF_HOME", tmp, 1);

	bk_hub_listing l;
	bk_hub_list(BK_HUB_DATASET, "org/data", NULL, &l);
	CHECK(l.n == 4 && strlen(l.commit) == 40, "%zu files", l.n);
	int seen = 0;
	for (size_t i = 0; i < l.n; i++)
		if (!strcmp(l.v[i].path, "data/train-00000-of-00001.parquet"))
			seen = l.v[i].size == 20;
	CHECK(seen, "the parquet file and its size are listed");
	char *ref = xasprintf("%s/datasets--org--data/refs/main", cache);
	size_t n;
	char *r = bk_read_file(ref, &n);
	CHECK(n == 40 && !memcmp(r, l.commit, 40), "refs/main");
	free(r);

	char *snap = bk_hub_snapshot(BK_HUB_DATASET, "org/data", NULL,
				     (const char *const[]){"data/*.parquet", "*/train*.jsonl", NULL});
	char *sq = xasprintf("%s/data/train-00000-of-00001.parquet", snap),
	     *sa = xasprintf("%s/data/train.jsonl", snap), *sb = xasprintf("%s/data/test.jsonl", snap);
	char buf[64];
	ssize_t k = readlink(sq, buf, sizeof buf - 1);
	buf[k > 0 ? k : 0] = 0;
	CHECK(!strncmp(buf, "../../../blobs/", 15), "nested link %s", buf);
	CHECK(bk_file_exists(sq) && bk_file_exists(sa) && !bk_file_exists(sb), "patterns");

	char *f = bk_hub_file(BK_HUB_DATASET, "org/data", NULL, "dataset_infos.json", 1);
	char *ne = xasprintf("%s/datasets--org--data/.no_exist/%s/dataset_infos.json", cache, l.commit);
	CHECK(!f && bk_file_exists(ne), "optional missing file: NULL and .no_exist");
	bk_expect_die("a required missing file", missing_required, NULL,
		      "dataset org/data has no file 'no-such.json'", "404");
	static const char *const escapes[] = {"../x", "data/../../x", "/etc/passwd", "a//b", "./a",
					      "data/", "", NULL};
	for (int i = 0; escapes[i]; i++)
		bk_expect_die(escapes[i], escaping_path, (void *)escapes[i],
			      "is not a file path inside the repo", NULL);

	/* offline: the cache answers, .no_exist included */
	setenv("HF_HUB_OFFLINE", "1", 1);
	f = bk_hub_file(BK_HUB_DATASET, "org/data", NULL, "dataset_infos.json", 1);
	CHECK(!f, ".no_exist read offline");
	f = bk_hub_file(BK_HUB_DATASET, "org/data", NULL, "data/train.jsonl", 0);
	CHECK(f && !strcmp(f, sa), "offline file %s", f ? f : "(null)");
	free(f);
	char *s2 = bk_hub_snapshot(BK_HUB_DATASET, "org/data", "main", NULL);
	CHECK(!strcmp(s2, snap), "offline snapshot");
	free(s2);
	bk_expect_die("listing offline", list_offline, NULL, "cannot list its files",
		      "HF_HUB_OFFLINE");
	unsetenv("HF_HUB_OFFLINE");

	free(ne), free(sq), free(sa), free(sb), free(snap), free(ref), free(ep), free(cache);
	bk_hub_listing_free(&l);
out:
	if (server > 0) {
		kill(server, SIGTERM);
		waitpid(server, NULL, 0);
	}
	free(a), free(b), free(q), free(rd), free(root), free(repo);
}

int main(void)
{
	bk_diag_init("test_hub");
	snprintf(tmp, sizeof tmp, "%s/bk-hub-test.XXXXXX", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp");
	if (!mkdtemp(tmp))
		die("mkdtemp: %s", tmp);
	test_sha();
	test_ids();
	test_cache_dir();
	test_dataset_api();
	char *cmd = xasprintf("rm -rf '%s'", tmp);
	if (system(cmd))
		fprintf(stderr, "could not remove %s\n", tmp);
	free(cmd);
	return bk_test_done("test_hub");
}
