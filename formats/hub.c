/* hub.c - see hub.h.  The hub's HTTP protocol as huggingface_hub speaks it
 * (file_download.py, hf_api.py): HEAD {endpoint}/{datasets/}ID/resolve/REV/FILE for the
 * commit and the etag (a relative redirect is followed, an absolute one - the CDN of
 * an LFS file - is not: its X-Linked-Etag / X-Linked-Size / X-Repo-Commit are read from
 * the redirect itself), then GET of the file from where the redirect points, without
 * Authorization when that is another host. */
#include "hub.h"
#include "common/diag.h"
#include "common/files.h"

#include <ctype.h>
#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- SHA-256 and SHA-1 (FIPS 180-4) ---- */

typedef struct {
	uint32_t h[8];
	uint64_t len;
	unsigned char buf[64];
	size_t fill;
	int sha1;
} sha_ctx;

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }
static uint32_t ror(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

static const uint32_t K256[64] = {
	0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
	0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
	0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
	0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
	0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
	0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
	0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
	0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
	0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
	0xc67178f2};

static void sha_init(sha_ctx *c, int sha1)
{
	static const uint32_t i256[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
					 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
	static const uint32_t i1[5] = {0x67452301, 0xefcdab89, 0x98badcfe, 0x10325476,
				       0xc3d2e1f0};
	memset(c, 0, sizeof *c);
	c->sha1 = sha1;
	memcpy(c->h, sha1 ? i1 : i256, sha1 ? sizeof i1 : sizeof i256);
}

static void sha_block(sha_ctx *c, const unsigned char *p)
{
	uint32_t w[80];
	for (int i = 0; i < 16; i++)
		w[i] = (uint32_t)p[4 * i] << 24 | (uint32_t)p[4 * i + 1] << 16 |
		       (uint32_t)p[4 * i + 2] << 8 | p[4 * i + 3];
	if (c->sha1) {
		for (int i = 16; i < 80; i++)
			w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
		uint32_t a = c->h[0], b = c->h[1], cc = c->h[2], d = c->h[3], e = c->h[4];
		for (int i = 0; i < 80; i++) {
			uint32_t f, k;
			if (i < 20)
				f = (b & cc) | (~b & d), k = 0x5a827999;
			else if (i < 40)
				f = b ^ cc ^ d, k = 0x6ed9eba1;
			else if (i < 60)
				f = (b & cc) | (b & d) | (cc & d), k = 0x8f1bbcdc;
			else
				f = b ^ cc ^ d, k = 0xca62c1d6;
			uint32_t t = rol(a, 5) + f + e + k + w[i];
			e = d, d = cc, cc = rol(b, 30), b = a, a = t;
		}
		c->h[0] += a, c->h[1] += b, c->h[2] += cc, c->h[3] += d, c->h[4] += e;
		return;
	}
	for (int i = 16; i < 64; i++) {
		uint32_t s0 = ror(w[i - 15], 7) ^ ror(w[i - 15], 18) ^ (w[i - 15] >> 3);
		uint32_t s1 = ror(w[i - 2], 17) ^ ror(w[i - 2], 19) ^ (w[i - 2] >> 10);
		w[i] = w[i - 16] + s0 + w[i - 7] + s1;
	}
	uint32_t v[8];
	memcpy(v, c->h, sizeof v);
	for (int i = 0; i < 64; i++) {
		uint32_t s1 = ror(v[4], 6) ^ ror(v[4], 11) ^ ror(v[4], 25);
		uint32_t ch = (v[4] & v[5]) ^ (~v[4] & v[6]);
		uint32_t t1 = v[7] + s1 + ch + K256[i] + w[i];
		uint32_t s0 = ror(v[0], 2) ^ ror(v[0], 13) ^ ror(v[0], 22);
		uint32_t mj = (v[0] & v[1]) ^ (v[0] & v[2]) ^ (v[1] & v[2]);
		memmove(v + 1, v, 7 * sizeof *v);
		v[4] += t1;
		v[0] = t1 + s0 + mj;
	}
	for (int i = 0; i < 8; i++)
		c->h[i] += v[i];
}

static void sha_update(sha_ctx *c, const void *data, size_t n)
{
	const unsigned char *p = data;
	c->len += n;
	while (n) {
		size_t k = 64 - c->fill < n ? 64 - c->fill : n;
		memcpy(c->buf + c->fill, p, k);
		c->fill += k, p += k, n -= k;
		if (c->fill == 64) {
			sha_block(c, c->buf);
			c->fill = 0;
		}
	}
}

static void sha_hex(sha_ctx *c, char *out)
{
	uint64_t bits = c->len * 8;
	unsigned char pad = 0x80, zero = 0, lenb[8];
	sha_update(c, &pad, 1);
	while (c->fill != 56)
		sha_update(c, &zero, 1);
	for (int i = 0; i < 8; i++)
		lenb[i] = (unsigned char)(bits >> (56 - 8 * i));
	sha_update(c, lenb, 8);
	int words = c->sha1 ? 5 : 8;
	for (int i = 0; i < words; i++)
		sprintf(out + 8 * i, "%08x", c->h[i]);
}

static int sha_file(const char *path, int sha1, int git_blob, char *out)
{
	FILE *f = fopen(path, "rb");
	if (!f)
		return -1;
	sha_ctx c;
	sha_init(&c, sha1);
	if (git_blob) {
		struct stat st;
		if (fstat(fileno(f), &st)) {
			fclose(f);
			return -1;
		}
		char hdr[40];
		int k = snprintf(hdr, sizeof hdr, "blob %lld", (long long)st.st_size);
		sha_update(&c, hdr, (size_t)k + 1); /* with the NUL */
	}
	static unsigned char buf[1 << 16];
	size_t n;
	while ((n = fread(buf, 1, sizeof buf, f)) > 0)
		sha_update(&c, buf, n);
	int bad = ferror(f);
	fclose(f);
	if (bad)
		return -1;
	sha_hex(&c, out);
	return 0;
}

int bk_sha256_file(const char *path, char out[65]) { return sha_file(path, 0, 0, out); }
int bk_sha1_file(const char *path, int git_blob, char out[41])
{
	return sha_file(path, 1, git_blob, out);
}

/* ---- names, environment ---- */

int bk_hub_is_id(const char *s)
{
	if (!s || !*s || *s == '.' || *s == '-' || strstr(s, "..") || strstr(s, "--"))
		return 0;
	int slashes = 0;
	for (const char *p = s; *p; p++) {
		if (*p == '/') {
			if (++slashes > 1 || p == s || !p[1] || p[1] == '.')
				return 0;
		} else if (!isalnum((unsigned char)*p) && !strchr("-_.", *p)) {
			return 0;
		}
	}
	return strlen(s) <= 96;
}

static const char *env(const char *name)
{
	const char *v = getenv(name);
	return v && *v ? v : NULL;
}

static char *hf_home(void)
{
	if (env("HF_HOME"))
		return xstrdup(env("HF_HOME"));
	if (env("XDG_CACHE_HOME"))
		return xasprintf("%s/huggingface", env("XDG_CACHE_HOME"));
	return xasprintf("%s/.cache/huggingface", env("HOME") ? env("HOME") : "");
}

char *bk_hub_cache_dir(void)
{
	if (env("HF_HUB_CACHE"))
		return xstrdup(env("HF_HUB_CACHE"));
	if (env("HUGGINGFACE_HUB_CACHE")) /* huggingface_hub's older name, still read */
		return xstrdup(env("HUGGINGFACE_HUB_CACHE"));
	char *h = hf_home(), *c = xasprintf("%s/hub", h);
	free(h);
	return c;
}

/* huggingface_hub's and datasets' ENV_VARS_TRUE_VALUES: v.upper() in {1, ON, YES, TRUE} */
static int truthy(const char *v)
{
	if (!v)
		return 0;
	return !strcasecmp(v, "1") || !strcasecmp(v, "true") || !strcasecmp(v, "yes") ||
	       !strcasecmp(v, "on");
}

const char *bk_hub_offline_var(bk_hub_kind kind)
{
	/* datasets (config.py): its own variable, when set and true */
	if (kind == BK_HUB_DATASET && truthy(getenv("HF_DATASETS_OFFLINE")))
		return "HF_DATASETS_OFFLINE";
	/* huggingface_hub (constants.py): HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE, Python's
	 * `or`: an empty HF_HUB_OFFLINE gives way, any other value decides */
	if (env("HF_HUB_OFFLINE"))
		return truthy(env("HF_HUB_OFFLINE")) ? "HF_HUB_OFFLINE" : NULL;
	return truthy(env("TRANSFORMERS_OFFLINE")) ? "TRANSFORMERS_OFFLINE" : NULL;
}

int bk_hub_offline(bk_hub_kind kind) { return bk_hub_offline_var(kind) != NULL; }

/* "HF_HUB_OFFLINE is set (cache only)" (static), or NULL when not offline */
static const char *offline_why(bk_hub_kind kind)
{
	static char buf[80];
	const char *v = bk_hub_offline_var(kind);
	if (!v)
		return NULL;
	snprintf(buf, sizeof buf, "%s is set (cache only)", v);
	return buf;
}

static char *endpoint(void)
{
	char *e = xstrdup(env("HF_ENDPOINT") ? env("HF_ENDPOINT") : "https://huggingface.co");
	size_t n = strlen(e);
	while (n && e[n - 1] == '/')
		e[--n] = 0;
	return e;
}

/* HF_TOKEN, else the token file (HF_TOKEN_PATH, else HF_HOME/token); NULL if none */
static char *token(void)
{
	if (env("HF_TOKEN"))
		return xstrdup(env("HF_TOKEN"));
	char *h = hf_home();
	char *path = env("HF_TOKEN_PATH") ? xstrdup(env("HF_TOKEN_PATH"))
					  : xasprintf("%s/token", h);
	free(h);
	size_t n;
	char *t = bk_try_read_file(path, &n);
	free(path);
	if (!t)
		return NULL;
	char *s = t;
	while (isspace((unsigned char)*s))
		s++;
	size_t k = strlen(s);
	while (k && isspace((unsigned char)s[k - 1]))
		s[--k] = 0;
	char *r = *s ? xstrdup(s) : NULL;
	free(t);
	return r;
}

static const char *kind_word(bk_hub_kind k) { return k == BK_HUB_DATASET ? "dataset" : "model"; }

/* models--Org--Name */
static char *repo_folder_name(bk_hub_kind kind, const char *id)
{
	char *r = xmalloc(strlen(id) * 2 + 16), *o = r + sprintf(r, "%ss--", kind_word(kind));
	for (const char *s = id; *s; s++)
		if (*s == '/')
			*o++ = '-', *o++ = '-';
		else
			*o++ = *s;
	*o = 0;
	return r;
}

/* CACHE/models--Org--Name */
static char *repo_dir(bk_hub_kind kind, const char *id)
{
	char *c = bk_hub_cache_dir(), *f = repo_folder_name(kind, id), *r = bk_path_join(c, f);
	free(c), free(f);
	return r;
}

/* a path inside the repo: relative, no "." or ".." component, no empty one */
static int repo_path_ok(const char *p)
{
	if (!*p || *p == '/')
		return 0;
	for (const char *s = p; *s;) {
		size_t n = strcspn(s, "/");
		if (!n || (n == 1 && s[0] == '.') || (n == 2 && s[0] == '.' && s[1] == '.'))
			return 0;
		s += n;
		if (*s == '/' && !*++s)
			return 0;
	}
	return 1;
}

static int is_commit(const char *s)
{
	if (!s || strlen(s) != 40)
		return 0;
	for (int i = 0; i < 40; i++)
		if (!isxdigit((unsigned char)s[i]) || isupper((unsigned char)s[i]))
			return 0;
	return 1;
}

static int is_hex(const char *s, size_t n)
{
	if (strlen(s) != n)
		return 0;
	for (size_t i = 0; i < n; i++)
		if (!isxdigit((unsigned char)s[i]))
			return 0;
	return 1;
}

/* percent-encoding; keep_slash for a file path */
static char *quote(const char *s, int keep_slash)
{
	char *o = xmalloc(3 * strlen(s) + 1), *p = o;
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;
		if (isalnum(c) || strchr("-_.~", c) || (keep_slash && c == '/'))
			*p++ = (char)c;
		else
			p += sprintf(p, "%%%02X", c);
	}
	*p = 0;
	return o;
}

static void mkdir_parent(const char *path)
{
	char *d = xstrdup(path), *s = strrchr(d, '/');
	if (s) {
		*s = 0;
		bk_mkdir_p(d);
	}
	free(d);
}

static int is_dir(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0 && S_ISDIR(st.st_mode);
}

/* refs/REV -> commit (malloc'd) or NULL */
static char *read_ref(const char *rdir, const char *revision)
{
	if (is_commit(revision))
		return xstrdup(revision);
	char *p = xasprintf("%s/refs/%s", rdir, revision);
	size_t n;
	char *t = bk_try_read_file(p, &n);
	free(p);
	if (!t)
		return NULL;
	while (n && isspace((unsigned char)t[n - 1]))
		t[--n] = 0;
	if (!is_commit(t)) {
		free(t);
		return NULL;
	}
	return t;
}

static void write_ref(const char *rdir, const char *revision, const char *commit)
{
	if (!strcmp(revision, commit))
		return;
	char *p = xasprintf("%s/refs/%s", rdir, revision);
	char *old = read_ref(rdir, revision);
	if (!old || strcmp(old, commit)) {
		mkdir_parent(p);
		bk_write_file_atomic(p, commit, strlen(commit)); /* no newline, as huggingface_hub */
	}
	free(old);
	free(p);
}

/* ---- HTTP ---- */

typedef struct {
	long status;
	char *commit, *etag, *linked_etag, *location, *error_code, *error_message;
	int64_t size, linked_size;
} http_meta;

static void meta_clear(http_meta *m)
{
	free(m->commit), free(m->etag), free(m->linked_etag), free(m->location);
	free(m->error_code), free(m->error_message);
	memset(m, 0, sizeof *m);
	m->size = m->linked_size = -1;
}

static size_t on_header(char *b, size_t sz, size_t nm, void *ud)
{
	http_meta *m = ud;
	size_t n = sz * nm;
	if (n >= 5 && !strncmp(b, "HTTP/", 5)) { /* a new response (after a redirect) */
		meta_clear(m);
		return n;
	}
	const char *colon = memchr(b, ':', n);
	if (!colon)
		return n;
	size_t kl = (size_t)(colon - b);
	const char *v = colon + 1, *e = b + n;
	while (v < e && (*v == ' ' || *v == '\t'))
		v++;
	while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' '))
		e--;
	char *val = xstrndup(v, (size_t)(e - v));
#define HDR(name) (kl == strlen(name) && !strncasecmp(b, name, kl))
	char **slot = NULL;
	if (HDR("x-repo-commit"))
		slot = &m->commit;
	else if (HDR("etag"))
		slot = &m->etag;
	else if (HDR("x-linked-etag"))
		slot = &m->linked_etag;
	else if (HDR("location"))
		slot = &m->location;
	else if (HDR("x-error-code"))
		slot = &m->error_code;
	else if (HDR("x-error-message"))
		slot = &m->error_message;
	else if (HDR("content-length"))
		m->size = strtoll(val, NULL, 10);
	else if (HDR("x-linked-size"))
		m->linked_size = strtoll(val, NULL, 10);
#undef HDR
	if (slot) {
		free(*slot);
		*slot = val;
	} else {
		free(val);
	}
	return n;
}

/* the etag as huggingface_hub names blobs: no W/ prefix, no quotes */
static char *norm_etag(const char *e)
{
	if (!e)
		return NULL;
	if (!strncmp(e, "W/", 2))
		e += 2;
	size_t n = strlen(e);
	if (n >= 2 && e[0] == '"' && e[n - 1] == '"')
		return xstrndup(e + 1, n - 2);
	return xstrdup(e);
}

static void curl_once(void)
{
	static int done;
	if (!done) {
		if (curl_global_init(CURL_GLOBAL_DEFAULT))
			die("libcurl: cannot initialise");
		done = 1;
	}
}

static struct curl_slist *auth_headers(const char *tok)
{
	struct curl_slist *h = NULL;
	h = curl_slist_append(h, "Accept-Encoding: identity");
	if (tok) {
		char *a = xasprintf("Authorization: Bearer %s", tok);
		h = curl_slist_append(h, a);
		free(a);
	}
	return h;
}

static CURL *easy(const char *url, struct curl_slist *h, http_meta *m)
{
	curl_once();
	CURL *c = curl_easy_init();
	if (!c)
		die("libcurl: cannot start a transfer");
	curl_easy_setopt(c, CURLOPT_URL, url);
	curl_easy_setopt(c, CURLOPT_HTTPHEADER, h);
	curl_easy_setopt(c, CURLOPT_USERAGENT, "bakery/" "0.1.0" " (hub client; libcurl)");
	curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, on_header);
	curl_easy_setopt(c, CURLOPT_HEADERDATA, m);
	curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT, 10L);
	curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
	curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
	curl_easy_setopt(c, CURLOPT_REDIR_PROTOCOLS_STR, "http,https");
	return c;
}

/* no connection: the cache may still answer */
static int is_network_error(CURLcode rc)
{
	return rc == CURLE_COULDNT_RESOLVE_HOST || rc == CURLE_COULDNT_RESOLVE_PROXY ||
	       rc == CURLE_COULDNT_CONNECT || rc == CURLE_OPERATION_TIMEDOUT ||
	       rc == CURLE_SEND_ERROR || rc == CURLE_RECV_ERROR || rc == CURLE_GOT_NOTHING ||
	       rc == CURLE_SSL_CONNECT_ERROR;
}

static int same_host(const char *a, const char *b)
{
	/* scheme://host[:port]/... */
	const char *pa = strstr(a, "://"), *pb = strstr(b, "://");
	if (!pa || !pb)
		return 0;
	pa += 3, pb += 3;
	size_t la = strcspn(pa, "/?#"), lb = strcspn(pb, "/?#");
	return la == lb && !strncasecmp(pa, pb, la);
}

/* "host[:port]" of a URL, into buf */
static const char *url_host(const char *url, char *buf, size_t len)
{
	const char *p = strstr(url, "://");
	p = p ? p + 3 : url;
	snprintf(buf, len, "%.*s", (int)strcspn(p, "/?#"), p);
	return buf;
}

/* "scheme://host[:port]" + a relative Location */
static char *join_location(const char *base, const char *loc)
{
	if (strstr(loc, "://"))
		return xstrdup(loc);
	const char *p = strstr(base, "://");
	size_t hl = p ? (size_t)(p + 3 - base) + strcspn(p + 3, "/?#") : 0;
	return xasprintf("%.*s%s", (int)hl, base, loc);
}

typedef struct {
	const char *id, *file, *page; /* for messages */
	bk_hub_kind kind;
	int had_token;
} req_ctx;

/* One line for an HTTP error of the hub, as hf_raise_for_status branches on
 * X-Error-Code; dies. */
static _Noreturn void hub_http_die(const req_ctx *q, const http_meta *m, const char *rev)
{
	const char *code = m->error_code ? m->error_code : "";
	const char *msg = m->error_message ? m->error_message : "";
	const char *kw = kind_word(q->kind);
	if (!strcmp(code, "GatedRepo") || (m->status == 403 && !*code))
		die("%s %s is gated (HTTP %ld%s%s): accept its licence at %s while logged in, "
		    "then set HF_TOKEN (or the token file) to a token of that account",
		    kw, q->id, m->status, *msg ? ": " : "", msg, q->page);
	if (!strcmp(code, "RevisionNotFound"))
		die("%s %s has no revision '%s' (HTTP %ld)", kw, q->id, rev, m->status);
	if (!strcmp(code, "EntryNotFound"))
		die("%s %s has no file '%s' at revision '%s' (HTTP %ld)", kw, q->id,
		    q->file ? q->file : "?", rev, m->status);
	if (!strcmp(code, "RepoNotFound") || m->status == 401 || m->status == 404) {
		if (m->status == 401)
			die("%s %s: not found, or private or gated (HTTP 401): %s; check the id, "
			    "or accept its licence at %s and set HF_TOKEN",
			    kw, q->id, q->had_token ? "the token has no access to it" : "no HF_TOKEN given",
			    q->page);
		die("%s %s not found on the hub (HTTP %ld%s%s)", kw, q->id, m->status,
		    *msg ? ": " : "", msg);
	}
	die("%s %s: the hub answered HTTP %ld%s%s", kw, q->id, m->status, *msg ? ": " : "",
	    msg);
}

/* HEAD, following relative redirects only (a renamed repo), as huggingface_hub does;
 * returns the curl code, m filled from the last response */
static CURLcode head(const char *url, const char *tok, http_meta *m)
{
	char *u = xstrdup(url);
	CURLcode rc = CURLE_OK;
	for (int hop = 0; hop < 10; hop++) {
		struct curl_slist *h = auth_headers(tok);
		meta_clear(m);
		CURL *c = easy(u, h, m);
		curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
		curl_easy_setopt(c, CURLOPT_TIMEOUT, 30L);
		rc = curl_easy_perform(c);
		if (rc == CURLE_OK)
			curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &m->status);
		curl_easy_cleanup(c);
		curl_slist_free_all(h);
		if (rc != CURLE_OK || m->status < 300 || m->status >= 400 || !m->location ||
		    strstr(m->location, "://"))
			break;
		char *n = join_location(u, m->location);
		free(u);
		u = n;
	}
	free(u);
	return rc;
}

typedef struct {
	char *v;
	size_t n;
} membuf;

static size_t to_mem(char *p, size_t sz, size_t nm, void *ud)
{
	membuf *b = ud;
	size_t n = sz * nm;
	b->v = xrealloc(b->v, b->n + n + 1);
	memcpy(b->v + b->n, p, n);
	b->n += n;
	b->v[b->n] = 0;
	return n;
}

/* ---- downloading one blob ---- */

typedef struct {
	FILE *f;          /* the partial file, opened at the first byte it may take */
	const char *part; /* its path */
	int append;       /* resumed: bytes go after what it has */
	CURL *c;
	long status;      /* the answer whose body came: only 200 and 206 are written */
	int err;          /* errno of a failed open or write */
	int over;         /* more bytes came than total: the transfer was stopped */
	const char *label;
	int64_t have, total;
	double t0, last;
	int tty, drawn;
} dl_state;

static double mono(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static size_t to_file(char *p, size_t sz, size_t nm, void *ud)
{
	dl_state *d = ud;
	size_t n = sz * nm;
	/* only the body of a 200 (from the start) or a 206 (the range asked for) is the
	 * file's bytes: an error page, or a 200 to a Range request, never reaches the
	 * partial file (returning short stops the transfer) */
	curl_easy_getinfo(d->c, CURLINFO_RESPONSE_CODE, &d->status);
	if (d->status != 206 && !(d->status == 200 && !d->append))
		return 0;
	if (!d->f && !(d->f = fopen(d->part, d->append ? "ab" : "wb"))) {
		d->err = errno;
		return 0;
	}
	/* never more than the hub announced: a host that streams on must not fill the
	 * disk */
	if (d->total >= 0 && (int64_t)n > d->total - d->have) {
		d->over = 1;
		return 0;
	}
	if (fwrite(p, 1, n, d->f) != n) {
		d->err = errno ? errno : EIO;
		return 0;
	}
	d->have += (int64_t)n;
	return n;
}

static void mb(int64_t b, char *out)
{
	if (b < 1024)
		sprintf(out, "%lld bytes", (long long)b);
	else if (b >= 1 << 30)
		sprintf(out, "%.2f GB", (double)b / (1 << 30));
	else if (b >= 1 << 20)
		sprintf(out, "%.1f MB", (double)b / (1 << 20));
	else
		sprintf(out, "%.1f kB", (double)b / 1024);
}

static void draw(dl_state *d, int final)
{
	double dt = mono() - d->t0;
	char a[32], t[32], r[32];
	mb(d->have, a);
	mb(d->total > 0 ? d->total : d->have, t);
	mb(dt > 0 ? (int64_t)((double)d->have / dt) : 0, r);
	if (d->tty)
		fprintf(stderr, "\r%s: downloading %s: %s of %s, %s/s   %s", bk_prog, d->label, a,
			t, r, final ? "\n" : "");
	else if (final && d->have >= (1 << 20)) /* a log: one line per file that took time */
		fprintf(stderr, "%s: downloaded %s: %s, %s/s\n", bk_prog, d->label, a, r);
	d->drawn = 1;
}

/* as common/progress.h: BK_PROGRESS=1 forces the redrawn line, 0 turns it off */
static int progress_on(void)
{
	const char *e = getenv("BK_PROGRESS");
	if (e && *e)
		return strcmp(e, "0") != 0;
	return isatty(2);
}

static int on_progress(void *ud, curl_off_t dt, curl_off_t dn, curl_off_t ut, curl_off_t un)
{
	(void)dt, (void)dn, (void)ut, (void)un;
	dl_state *d = ud;
	double now = mono();
	if (d->tty && now - d->last > 0.25) {
		d->last = now;
		draw(d, 0);
	}
	return 0;
}

static _Noreturn void die_write(const char *path, int err)
{
	if (err == ENOSPC || err == EDQUOT)
		die("%s: disk full (%s): free space there, or point HF_HUB_CACHE elsewhere", path,
		    strerror(err));
	die("%s: %s", path, strerror(err));
}

/* GET url into part (resumed from its size), checked against etag and size; then
 * renamed to blob.  Dies with one line on any failure (the partial file is kept for
 * the next run unless its bytes are wrong). */
static void fetch_blob(const char *url, const char *hub_url, const char *tok, const char *part,
		       const char *blob, const char *etag, int64_t size, const char *label,
		       const req_ctx *q, const char *rev)
{
	for (int attempt = 0;; attempt++) {
		struct stat st;
		int64_t have = stat(part, &st) == 0 ? (int64_t)st.st_size : 0;
		if (size >= 0 && have > size)
			have = 0; /* longer than the file: not a prefix of it */
		/* the CDN's URL is signed: Authorization only to the hub's own host */
		struct curl_slist *h = auth_headers(same_host(url, hub_url) ? tok : NULL);
		char range[64];
		if (have) {
			snprintf(range, sizeof range, "Range: bytes=%lld-", (long long)have);
			h = curl_slist_append(h, range);
		}
		http_meta m;
		memset(&m, 0, sizeof m);
		meta_clear(&m);
		CURL *c = easy(url, h, &m);
		dl_state d = {.part = part, .append = have > 0, .c = c, .label = label,
			      .have = have, .total = size, .t0 = mono(), .tty = progress_on()};
		curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L);
		curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
		curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_file);
		curl_easy_setopt(c, CURLOPT_WRITEDATA, &d);
		curl_easy_setopt(c, CURLOPT_NOPROGRESS, 0L);
		curl_easy_setopt(c, CURLOPT_XFERINFOFUNCTION, on_progress);
		curl_easy_setopt(c, CURLOPT_XFERINFODATA, &d);
		if (size >= 0) /* a Content-Length over what is left stops it at once */
			curl_easy_setopt(c, CURLOPT_MAXFILESIZE_LARGE, (curl_off_t)(size - have));
		curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1L);
		curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, 60L);
		/* the status is known before the body: a 200 to a Range request restarts */
		CURLcode rc = curl_easy_perform(c);
		long status = 0;
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
		char *eff = NULL;
		if (!curl_easy_getinfo(c, CURLINFO_EFFECTIVE_URL, &eff) && eff)
			eff = xstrndup(eff, strcspn(eff, "?#")); /* not the signature */
		else
			eff = xstrndup(url, strcspn(url, "?#"));
		curl_easy_cleanup(c);
		curl_slist_free_all(h);
		/* a 200/206 answer with no body: the (empty) file is still made */
		if (!d.f && !d.err && rc == CURLE_OK && (status == 206 || (status == 200 && !have)) &&
		    !(d.f = fopen(part, have ? "ab" : "wb")))
			d.err = errno;
		if (d.f && fflush(d.f) && !d.err)
			d.err = errno;
		if (d.f && fclose(d.f) && !d.err)
			d.err = errno;
		if (d.err)
			die_write(part, d.err);
		int bad_status = status && status != 206 && !(status == 200 && !have);
		/* a server that ignored Range answers 200 (nothing of it written); 416: a stale
		 * partial file.  Either way: once more from the start */
		int over = d.over || rc == CURLE_FILESIZE_EXCEEDED;
		if (attempt == 0 && ((have && status == 200) || status == 416)) {
			free(eff);
			if (truncate(part, 0))
				die_write(part, errno);
			meta_clear(&m);
			continue;
		}
		if (bad_status) {
			/* the partial file is as it was: an error page is no part of the file */
			if (d.drawn && d.tty)
				fputc('\n', stderr);
			m.status = status;
			if (same_host(eff, hub_url) && (m.error_code || status == 401 ||
							 status == 403 || status == 404))
				hub_http_die(q, &m, rev); /* gated, private, gone: the hub's words */
			meta_clear(&m);
			char kept[64] = "";
			if (have)
				snprintf(kept, sizeof kept, "; the partial file keeps its %lld bytes",
					 (long long)have);
			die("%s: the download host answered HTTP %ld for %s%s (run again; the hub "
			    "signs a new URL each time)", label, status, eff, kept);
		}
		if (rc != CURLE_OK && !over) {
			if (d.drawn && d.tty)
				fputc('\n', stderr);
			meta_clear(&m);
			die("%s: download failed after %lld bytes: %s (the partial file %s is resumed "
			    "by the next run)",
			    label, (long long)d.have, curl_easy_strerror(rc), part);
		}
		free(eff);
		if (over) {
			if (d.drawn && d.tty)
				fputc('\n', stderr);
			meta_clear(&m);
			unlink(part);
			char host[256];
			die("%s: the download host %s sent more than the %lld bytes the hub announced: "
			    "stopped, the partial file removed (run again; a host that keeps doing so "
			    "is not serving this file)",
			    label, url_host(url, host, sizeof host), (long long)size);
		}
		meta_clear(&m);
		draw(&d, 1);
		break;
	}
	struct stat st;
	if (stat(part, &st))
		die_write(part, errno);
	if (size >= 0 && (int64_t)st.st_size != size) {
		unlink(part);
		die("%s: %lld bytes downloaded, the hub said %lld; removed, run again", label,
		    (long long)st.st_size, (long long)size);
	}
	char sum[65];
	const char *kind = NULL;
	int bad = 0;
	if (is_hex(etag, 64)) {
		kind = "sha256";
		if (bk_sha256_file(part, sum))
			die("%s: %s", part, strerror(errno));
		bad = strcasecmp(sum, etag) != 0;
	} else if (is_hex(etag, 40)) {
		kind = "git sha1";
		if (bk_sha1_file(part, 1, sum))
			die("%s: %s", part, strerror(errno));
		bad = strcasecmp(sum, etag) != 0;
	}
	if (bad) {
		unlink(part);
		die("%s: the downloaded bytes have %s %s, the hub's etag says %s: refused (removed; "
		    "run again)",
		    label, kind, sum, etag);
	}
	if (rename(part, blob))
		die_write(blob, errno);
}

/* ---- one file ---- */

static char *page_url(bk_hub_kind kind, const char *id)
{
	char *e = endpoint(), *p = xasprintf("%s/%s%s", e, kind == BK_HUB_DATASET ? "datasets/" : "", id);
	free(e);
	return p;
}

/* snapshots/COMMIT/FILE -> relative link to blobs/ETAG */
static void link_snapshot(const char *rdir, const char *commit, const char *file,
			  const char *etag)
{
	char *ptr = xasprintf("%s/snapshots/%s/%s", rdir, commit, file);
	mkdir_parent(ptr);
	size_t depth = 2;
	for (const char *s = file; *s; s++)
		depth += *s == '/';
	char *target = xmalloc(3 * depth + strlen(etag) + 8), *t = target;
	for (size_t i = 0; i < depth; i++)
		t += sprintf(t, "../");
	sprintf(t, "blobs/%s", etag);
	char *tmp = xasprintf("%s.tmp%ld", ptr, (long)getpid());
	unlink(tmp);
	if (symlink(target, tmp) || rename(tmp, ptr))
		die_write(ptr, errno);
	free(tmp);
	free(target);
	free(ptr);
}

static int exists(const char *p)
{
	struct stat st;
	return stat(p, &st) == 0;
}

/* the cache's answer: snapshot path, or NULL (*known_missing set from .no_exist) */
static char *from_cache(const char *rdir, const char *commit, const char *file,
			int *known_missing)
{
	*known_missing = 0;
	if (!commit)
		return NULL;
	char *p = xasprintf("%s/snapshots/%s/%s", rdir, commit, file);
	if (exists(p))
		return p;
	free(p);
	char *ne = xasprintf("%s/.no_exist/%s/%s", rdir, commit, file);
	*known_missing = exists(ne);
	free(ne);
	return NULL;
}

static char *file_offline(bk_hub_kind kind, const char *id, const char *rev, const char *file,
			  int optional, const char *why)
{
	char *rdir = repo_dir(kind, id), *commit = read_ref(rdir, rev);
	int missing;
	char *p = from_cache(rdir, commit, file, &missing);
	if (!p && !(missing && optional)) {
		if (!commit)
			die("%s %s (revision '%s') is not in the cache %s, and %s", kind_word(kind),
			    id, rev, rdir, why);
		die("%s %s: '%s' of revision '%s' is not in the cache %s, and %s",
		    kind_word(kind), id, file, rev, rdir, why);
	}
	free(commit);
	free(rdir);
	return p;
}

/* bk_hub_file, with the size the repo's listing gives the file (-1: none) */
static char *hub_file(bk_hub_kind kind, const char *id, const char *revision, const char *file,
		      int optional, int64_t listed_size)
{
	const char *rev = revision ? revision : "main";
	if (!bk_hub_is_id(id))
		die("'%s' is not a hub repo id (Org/Name)", id);
	if (!repo_path_ok(file))
		die("%s %s: '%s' is not a file path inside the repo", kind_word(kind), id, file);
	char *rdir = repo_dir(kind, id);
	if (is_commit(rev)) { /* a commit: the cache answers without a request */
		int missing;
		char *p = from_cache(rdir, rev, file, &missing);
		if (p || (missing && optional)) {
			free(rdir);
			return p;
		}
	}
	if (bk_hub_offline(kind)) {
		free(rdir);
		return file_offline(kind, id, rev, file, optional, offline_why(kind));
	}
	char *ep = endpoint(), *qrev = quote(rev, 0), *qfile = quote(file, 1);
	char *url = xasprintf("%s/%s%s/resolve/%s/%s", ep, kind == BK_HUB_DATASET ? "datasets/" : "",
			      id, qrev, qfile);
	char *tok = token(), *page = page_url(kind, id);
	req_ctx q = {.id = id, .file = file, .page = page, .kind = kind, .had_token = tok != NULL};
	http_meta m;
	memset(&m, 0, sizeof m);
	meta_clear(&m);
	CURLcode rc = head(url, tok, &m);
	char *result = NULL;
	if (rc != CURLE_OK) {
		char *why = xasprintf("the hub %s cannot be reached (%s)", ep, curl_easy_strerror(rc));
		if (!is_network_error(rc))
			die("%s: %s", url, curl_easy_strerror(rc));
		result = file_offline(kind, id, rev, file, optional, why);
		free(why);
		goto out;
	}
	if (m.status == 404 && m.error_code && !strcmp(m.error_code, "EntryNotFound") && optional) {
		if (m.commit && is_commit(m.commit)) {
			write_ref(rdir, rev, m.commit);
			char *ne = xasprintf("%s/.no_exist/%s/%s", rdir, m.commit, file);
			mkdir_parent(ne);
			int fd = open(ne, O_WRONLY | O_CREAT, 0644);
			if (fd >= 0)
				close(fd);
			free(ne);
		}
		goto out;
	}
	if (m.status >= 400 || m.status < 200)
		hub_http_die(&q, &m, rev);
	char *etag = norm_etag(m.linked_etag ? m.linked_etag : m.etag);
	int64_t size = m.linked_size >= 0 ? m.linked_size : m.size;
	if (!m.commit || !is_commit(m.commit) || !etag || !*etag || strchr(etag, '/') ||
	    !strcmp(etag, ".") || !strcmp(etag, ".."))
		die("%s: the hub's answer has no %s: is HF_ENDPOINT (%s) a hub?", url,
		    !m.commit || !is_commit(m.commit) ? "X-Repo-Commit" : "usable ETag", ep);
	write_ref(rdir, rev, m.commit);
	int missing;
	result = from_cache(rdir, m.commit, file, &missing);
	if (result) {
		free(etag);
		goto out;
	}
	char *blob = xasprintf("%s/blobs/%s", rdir, etag);
	if (!exists(blob)) {
		/* one process per blob: the others wait, then find it in place */
		char *c = bk_hub_cache_dir(), *fold = repo_folder_name(kind, id);
		char *lock = xasprintf("%s/.locks/%s/%s.lock", c, fold, etag);
		mkdir_parent(lock);
		int lfd = open(lock, O_RDWR | O_CREAT, 0644);
		if (lfd < 0)
			die_write(lock, errno);
		if (flock(lfd, LOCK_EX | LOCK_NB)) {
			fprintf(stderr, "%s: waiting for another download of %s (lock %s)\n", bk_prog,
				file, lock);
			if (flock(lfd, LOCK_EX))
				die("%s: %s", lock, strerror(errno));
		}
		if (!exists(blob)) {
			char *bdir = xasprintf("%s/blobs", rdir), *part = xasprintf("%s.incomplete", blob);
			char *label = xasprintf("%s %s", id, file);
			bk_mkdir_p(bdir);
			/* an LFS file: the redirect's Location is the CDN's signed URL */
			/* the cap: the listing's size when it has one (an answer that announces
			 * more is refused before a byte comes), else what HEAD announced */
			if (listed_size >= 0 && size > listed_size)
				die("%s: the hub announces %lld bytes, over the %lld its file listing "
				    "gives: refused before downloading", label, (long long)size,
				    (long long)listed_size);
			if (listed_size >= 0)
				size = listed_size;
			char *get = m.status >= 300 && m.status < 400 && m.location
					    ? join_location(url, m.location)
					    : xstrdup(url);
			fetch_blob(get, url, tok, part, blob, etag, size, label, &q, rev);
			free(get), free(label), free(part), free(bdir);
		}
		close(lfd);
		free(lock), free(fold), free(c);
	}
	link_snapshot(rdir, m.commit, file, etag);
	result = xasprintf("%s/snapshots/%s/%s", rdir, m.commit, file);
	free(blob);
	free(etag);
out:
	meta_clear(&m);
	free(page), free(tok), free(url), free(qfile), free(qrev), free(ep), free(rdir);
	return result;
}

char *bk_hub_file(bk_hub_kind kind, const char *id, const char *revision, const char *file,
		  int optional)
{
	return hub_file(kind, id, revision, file, optional, -1);
}

char *bk_hub_file_listed(bk_hub_kind kind, const char *id, const char *revision,
			 const char *file, int optional, const bk_hub_listing *l)
{
	int64_t size = -1;
	for (size_t i = 0; l && i < l->n; i++)
		if (!strcmp(l->v[i].path, file))
			size = l->v[i].size;
	return hub_file(kind, id, revision, file, optional, size);
}

/* ---- a repo's listing, snapshots ---- */

/* REPO/.bakery-listing/COMMIT.json: the files of a commit as the hub listed them
 * ({"sha", "siblings": [{"rfilename", "size"}]}), so that a read offline knows what a
 * whole snapshot holds.  A commit's files never change: written once. */
static char *listing_path(const char *rdir, const char *commit)
{
	return xasprintf("%s/.bakery-listing/%s.json", rdir, commit);
}

static void write_listing(const char *rdir, const bk_hub_listing *l)
{
	char *p = listing_path(rdir, l->commit);
	if (!exists(p)) {
		json_t *sib = json_array(), *j = json_object();
		for (size_t i = 0; i < l->n; i++) {
			json_t *e = json_object();
			json_object_set_new(e, "rfilename", json_string(l->v[i].path));
			if (l->v[i].size >= 0)
				json_object_set_new(e, "size", json_integer(l->v[i].size));
			json_array_append_new(sib, e);
		}
		json_object_set_new(j, "sha", json_string(l->commit));
		json_object_set_new(j, "siblings", sib);
		char *text = json_dumps(j, JSON_COMPACT);
		if (!text)
			die("%s: cannot encode the listing", p);
		mkdir_parent(p);
		bk_write_file_atomic(p, text, strlen(text));
		free(text);
		json_decref(j);
	}
	free(p);
}

int bk_hub_listing_cached(bk_hub_kind kind, const char *id, const char *revision,
			  bk_hub_listing *out)
{
	memset(out, 0, sizeof *out);
	char *rdir = repo_dir(kind, id);
	out->commit = read_ref(rdir, revision ? revision : "main");
	char *p = out->commit ? listing_path(rdir, out->commit) : NULL;
	free(rdir);
	size_t len;
	char *text = p ? bk_try_read_file(p, &len) : NULL;
	if (!text) {
		free(p);
		return -1;
	}
	json_error_t err;
	json_t *j = json_loadb(text, len, 0, &err);
	json_t *sha = j ? json_object_get(j, "sha") : NULL;
	json_t *sib = j ? json_object_get(j, "siblings") : NULL;
	if (!json_is_string(sha) || strcmp(json_string_value(sha), out->commit) ||
	    !json_is_array(sib))
		die("%s: not a listing bakery wrote (%s); remove it and read the %s online once", p,
		    j ? "no 'sha' of its commit or no 'siblings'" : err.text, kind_word(kind));
	out->v = xcalloc(json_array_size(sib) + 1, sizeof *out->v);
	size_t i;
	json_t *e;
	json_array_foreach(sib, i, e) {
		json_t *name = json_object_get(e, "rfilename"), *size = json_object_get(e, "size");
		if (!json_is_string(name) || !repo_path_ok(json_string_value(name)))
			die("%s: entry %zu is not a path inside the repo", p, i);
		out->v[out->n].path = xstrdup(json_string_value(name));
		out->v[out->n].size = json_is_integer(size) ? (int64_t)json_integer_value(size) : -1;
		out->n++;
	}
	json_decref(j);
	free(text);
	free(p);
	return 0;
}

char *bk_hub_snapshot_dir(bk_hub_kind kind, const char *id, const char *commit)
{
	char *rdir = repo_dir(kind, id), *s = xasprintf("%s/snapshots/%s", rdir, commit);
	free(rdir);
	return s;
}

/* 0, or -1 when the hub cannot be reached (why set); dies on hub errors */
static int list_try(bk_hub_kind kind, const char *id, const char *rev, bk_hub_listing *out,
		    char **why)
{
	memset(out, 0, sizeof *out);
	char *ep = endpoint(), *qrev = quote(rev, 0);
	char *url = xasprintf("%s/api/%ss/%s/revision/%s?blobs=true", ep, kind_word(kind), id, qrev);
	char *tok = token(), *page = page_url(kind, id);
	req_ctx q = {.id = id, .page = page, .kind = kind, .had_token = tok != NULL};
	struct curl_slist *h = auth_headers(tok);
	http_meta m;
	memset(&m, 0, sizeof m);
	meta_clear(&m);
	membuf body = {0};
	CURL *c = easy(url, h, &m);
	curl_easy_setopt(c, CURLOPT_FOLLOWLOCATION, 1L); /* requests follows them on GET */
	curl_easy_setopt(c, CURLOPT_MAXREDIRS, 10L);
	curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, to_mem);
	curl_easy_setopt(c, CURLOPT_WRITEDATA, &body);
	curl_easy_setopt(c, CURLOPT_TIMEOUT, 60L);
	CURLcode rc = curl_easy_perform(c);
	if (rc == CURLE_OK)
		curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &m.status);
	curl_easy_cleanup(c);
	curl_slist_free_all(h);
	int ret = 0;
	if (rc != CURLE_OK) {
		if (!is_network_error(rc))
			die("%s: %s", url, curl_easy_strerror(rc));
		*why = xasprintf("the hub %s cannot be reached (%s)", ep, curl_easy_strerror(rc));
		ret = -1;
		goto out;
	}
	if (m.status != 200)
		hub_http_die(&q, &m, rev);
	json_error_t err;
	json_t *j = json_loadb(body.v ? body.v : "", body.n, 0, &err);
	json_t *sha = j ? json_object_get(j, "sha") : NULL;
	json_t *sib = j ? json_object_get(j, "siblings") : NULL;
	if (!json_is_string(sha) || !is_commit(json_string_value(sha)) || !json_is_array(sib))
		die("%s: not a hub repo listing (%s)", url,
		    !j ? err.text : "no 40-hex 'sha' and 'siblings' array");
	out->commit = xstrdup(json_string_value(sha));
	out->v = xcalloc(json_array_size(sib) + 1, sizeof *out->v);
	size_t i;
	json_t *e;
	json_array_foreach(sib, i, e) {
		json_t *name = json_object_get(e, "rfilename"), *size = json_object_get(e, "size");
		if (!json_is_string(name))
			die("%s: sibling %zu has no 'rfilename'", url, i);
		const char *n = json_string_value(name);
		if (!repo_path_ok(n))
			die("%s: sibling '%s' is not a path inside the repo", url, n);
		out->v[out->n].path = xstrdup(n);
		out->v[out->n].size = json_is_integer(size) ? (int64_t)json_integer_value(size) : -1;
		out->n++;
	}
	json_decref(j);
	char *rdir = repo_dir(kind, id);
	write_ref(rdir, rev, out->commit);
	write_listing(rdir, out);
	free(rdir);
out:
	free(body.v);
	meta_clear(&m);
	free(page), free(tok), free(url), free(qrev), free(ep);
	return ret;
}

void bk_hub_list(bk_hub_kind kind, const char *id, const char *revision, bk_hub_listing *out)
{
	const char *rev = revision ? revision : "main";
	if (!bk_hub_is_id(id))
		die("'%s' is not a hub repo id (Org/Name)", id);
	if (bk_hub_offline(kind))
		die("%s %s: cannot list its files: %s", kind_word(kind), id, offline_why(kind));
	char *why = NULL;
	if (list_try(kind, id, rev, out, &why))
		die("%s %s: cannot list its files: %s", kind_word(kind), id, why);
}

int bk_hub_list_try(bk_hub_kind kind, const char *id, const char *revision,
		    bk_hub_listing *out, char **why)
{
	const char *rev = revision ? revision : "main";
	if (!bk_hub_is_id(id))
		die("'%s' is not a hub repo id (Org/Name)", id);
	memset(out, 0, sizeof *out);
	*why = NULL;
	if (bk_hub_offline(kind)) {
		*why = xstrdup(offline_why(kind));
		return -1;
	}
	return list_try(kind, id, rev, out, why);
}

void bk_hub_listing_free(bk_hub_listing *l)
{
	for (size_t i = 0; i < l->n; i++)
		free(l->v[i].path);
	free(l->v);
	free(l->commit);
	memset(l, 0, sizeof *l);
}

static char *snapshot_offline(bk_hub_kind kind, const char *id, const char *rev, const char *why)
{
	char *rdir = repo_dir(kind, id), *commit = read_ref(rdir, rev);
	char *snap = commit ? xasprintf("%s/snapshots/%s", rdir, commit) : NULL;
	if (!snap || !is_dir(snap))
		die("%s %s (revision '%s') is not in the cache %s, and %s", kind_word(kind), id, rev,
		    rdir, why);
	if (!bk_hub_offline(kind)) /* as huggingface_hub: the cached copy, said so */
		warn("%s; %s %s: the cached snapshot %s", why, kind_word(kind), id, commit);
	free(commit);
	free(rdir);
	return snap;
}

static int matches(const char *path, const char *const *patterns)
{
	if (!patterns)
		return 1;
	for (int i = 0; patterns[i]; i++)
		if (!fnmatch(patterns[i], path, 0))
			return 1;
	return 0;
}

char *bk_hub_snapshot(bk_hub_kind kind, const char *id, const char *revision,
		      const char *const *patterns)
{
	const char *rev = revision ? revision : "main";
	if (!bk_hub_is_id(id))
		die("'%s' is not a hub repo id (Org/Name)", id);
	if (bk_hub_offline(kind))
		return snapshot_offline(kind, id, rev, offline_why(kind));
	bk_hub_listing l;
	char *why = NULL;
	if (list_try(kind, id, rev, &l, &why)) {
		char *s = snapshot_offline(kind, id, rev, why);
		free(why);
		return s;
	}
	for (size_t i = 0; i < l.n; i++)
		if (matches(l.v[i].path, patterns))
			free(hub_file(kind, id, l.commit, l.v[i].path, 0, l.v[i].size));
	char *rdir = repo_dir(kind, id), *snap = xasprintf("%s/snapshots/%s", rdir, l.commit);
	bk_mkdir_p(snap);
	free(rdir);
	bk_hub_listing_free(&l);
	return snap;
}

/* ---- --model ---- */

/* what bakery reads of a model besides the weights (the weights: the index and its
 * shards, else model.safetensors) */
static const char *const model_files[] = {
	"config.json",		  "generation_config.json", "tokenizer.json",
	"tokenizer.model",	  "tokenizer_config.json",  "special_tokens_map.json",
	"added_tokens.json",	  "chat_template.jinja",    NULL};

static int listed(const bk_hub_listing *l, const char *path)
{
	for (size_t i = 0; i < l->n; i++)
		if (!strcmp(l->v[i].path, path))
			return 1;
	return 0;
}

char *bk_hub_model_dir(const char *arg, const char *revision)
{
	if (is_dir(arg))
		return xstrdup(arg);
	if (!bk_hub_is_id(arg) || exists(arg) || *arg == '/')
		die("'%s' is not a model directory (nor a hub id Org/Name)", arg);
	const char *rev = revision ? revision : "main";
	char *snap = NULL;
	bk_hub_listing l;
	char *why = NULL;
	if (bk_hub_offline(BK_HUB_MODEL) || list_try(BK_HUB_MODEL, arg, rev, &l, &why)) {
		snap = snapshot_offline(BK_HUB_MODEL, arg, rev, why ? why : offline_why(BK_HUB_MODEL));
		free(why);
	} else {
		if (!listed(&l, "config.json"))
			die("model %s has no config.json at revision '%s': not a transformers model",
			    arg, rev);
		const char *idx = "model.safetensors.index.json";
		if (!listed(&l, idx) && !listed(&l, "model.safetensors"))
			die("model %s has no model.safetensors (nor its index) at revision '%s': bakery "
			    "reads safetensors only (.bin and .pth are never downloaded)",
			    arg, rev);
		for (int i = 0; model_files[i]; i++)
			if (listed(&l, model_files[i]))
				free(bk_hub_file_listed(BK_HUB_MODEL, arg, l.commit, model_files[i], 0, &l));
		if (listed(&l, idx)) {
			char *ip = bk_hub_file_listed(BK_HUB_MODEL, arg, l.commit, idx, 0, &l);
			json_error_t err;
			json_t *j = json_load_file(ip, 0, &err);
			json_t *wm = j ? json_object_get(j, "weight_map") : NULL;
			if (!json_is_object(wm))
				die("%s: no 'weight_map' object (%s)", ip, j ? "" : err.text);
			/* each shard once, in the index's order */
			BK_VEC(const char *) shards = {0};
			const char *k;
			json_t *v;
			json_object_foreach(wm, k, v) {
				if (!json_is_string(v))
					die("%s: weight_map['%s'] is not a file name", ip, k);
				const char *s = json_string_value(v);
				int seen = 0;
				for (size_t i = 0; i < shards.n && !seen; i++)
					seen = !strcmp(shards.v[i], s);
				if (!seen)
					bk_vec_push(&shards, s);
			}
			for (size_t i = 0; i < shards.n; i++) {
				if (!listed(&l, shards.v[i]))
					die("%s names shard '%s', which model %s does not have", ip,
					    shards.v[i], arg);
				free(bk_hub_file_listed(BK_HUB_MODEL, arg, l.commit, shards.v[i], 0, &l));
			}
			free(shards.v);
			json_decref(j);
			free(ip);
		} else {
			free(bk_hub_file_listed(BK_HUB_MODEL, arg, l.commit, "model.safetensors", 0, &l));
		}
		char *rdir = repo_dir(BK_HUB_MODEL, arg);
		snap = xasprintf("%s/snapshots/%s", rdir, l.commit);
		free(rdir);
		bk_hub_listing_free(&l);
	}
	char *cj = bk_path_join(snap, "config.json");
	if (!exists(cj))
		die("model %s: the cached snapshot %s has no config.json", arg, snap);
	free(cj);
	return snap;
}
