/* parquet.c - the focused Parquet reader of parquet.h: the Thrift compact footer, the
 * schema tree, column chunks page by page, and record assembly from levels into
 * jansson values.  Bounds are checked against the buffer everywhere: the input is
 * untrusted (tests/fuzz/fuzz_parquet.c).
 *
 * Record assembly (Dremel), one leaf column at a time: each (repetition, definition,
 * value) triple walks the leaf's schema path from the row object down, creating
 * objects and arrays on demand ("get or create"), so the leaves of one struct (role,
 * content) fill the same objects.  A repeated node keeps the index of its current
 * element: a repetition level below the node's starts a new list, equal appends an
 * element, above stays in the current element.  A definition level below a node's
 * makes it null (optional) or an empty list (repeated) and ends the walk.
 * Invariants: every slot is written once with a value (only "null" may be written
 * again, as each leaf of a null struct writes it); an array index is at most the
 * array's size; a leaf yields exactly the row group's number of rows. */
#include "formats/parquet.h"
#include "common/diag.h"
#include "common/files.h"

#include <math.h>
#include <snappy-c.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>
#include <zstd.h>

enum { T_BOOLEAN, T_INT32, T_INT64, T_INT96, T_FLOAT, T_DOUBLE, T_BYTE_ARRAY, T_FLBA };
enum { R_REQUIRED, R_OPTIONAL, R_REPEATED };
enum { C_UNCOMPRESSED, C_SNAPPY, C_GZIP, C_LZO, C_BROTLI, C_LZ4, C_ZSTD, C_LZ4_RAW };
enum { E_PLAIN = 0, E_PLAIN_DICT = 2, E_RLE = 3, E_BIT_PACKED = 4, E_RLE_DICT = 8 };
enum { P_DATA = 0, P_INDEX = 1, P_DICT = 2, P_DATA_V2 = 3 };
/* converted_type and logicalType (union field id) values that matter here */
enum { CT_UTF8 = 0, CT_MAP = 1, CT_MAP_KV = 2, CT_LIST = 3, CT_ENUM = 4, CT_DECIMAL = 5,
       CT_UINT_32 = 13, CT_UINT_64 = 14, CT_JSON = 19 };
enum { LT_STRING = 1, LT_MAP = 2, LT_LIST = 3, LT_ENUM = 4, LT_DECIMAL = 5, LT_JSON = 12 };

#define MAX_DEPTH 32     /* schema nesting we accept (real files: under 8) */
#define MAX_PAGE (1u << 30) /* an uncompressed page larger than 1 GiB is refused */

/* node kinds for assembly */
enum { K_LEAF, K_OBJECT, K_PASS /* LIST wrapper, 3-level repeated group: value goes down */ };

typedef struct {
	char *name;
	int type; /* physical type; -1 for a group */
	int rep;
	int nchild;
	int conv, logical; /* -1 / 0 when absent */
	int parent;
	int kind;
} pq_node;

typedef struct {
	int path[MAX_DEPTH]; /* node indices from the top-level column down to the leaf */
	int depth;
	int def[MAX_DEPTH], rep[MAX_DEPTH]; /* cumulative levels at each node */
	int max_def, max_rep;
	int top; /* index into the top-level column list */
	char *dotted; /* "messages.list.element.role" for messages */
} pq_leaf;

typedef struct {
	int type, codec;
	int64_t num_values, data_off, dict_off, size;
} pq_chunk;

typedef struct {
	int64_t num_rows;
	pq_chunk *chunks; /* one per leaf */
	size_t nchunks;
} pq_group;

struct bk_parquet {
	char *name;
	const uint8_t *buf;
	size_t len;
	bk_map map; /* when opened from a path */
	pq_node *nodes;
	size_t nnodes;
	pq_leaf *leaves;
	size_t nleaves;
	int *tops; /* node index of each top-level column */
	size_t ntops;
	int64_t num_rows;
	pq_group *groups;
	size_t ngroups;
};

/* ---- Thrift compact protocol ---- */

enum { TT_STOP, TT_TRUE, TT_FALSE, TT_I8, TT_I16, TT_I32, TT_I64, TT_DOUBLE, TT_BINARY,
       TT_LIST, TT_SET, TT_MAP, TT_STRUCT };

typedef struct {
	const uint8_t *p, *end;
	const char *name;
	int depth;
} tc;

static _Noreturn void corrupt(const char *name, const char *what)
{
	die("%s: corrupt parquet file (%s)", name, what);
}

static uint64_t tc_uvar(tc *t)
{
	uint64_t v = 0;
	for (int shift = 0; shift < 64; shift += 7) {
		if (t->p >= t->end)
			corrupt(t->name, "metadata ends inside a number");
		uint8_t b = *t->p++;
		v |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80))
			return v;
	}
	corrupt(t->name, "metadata number too long");
}

static int64_t tc_zz(tc *t)
{
	uint64_t v = tc_uvar(t);
	return (int64_t)(v >> 1) ^ -(int64_t)(v & 1);
}

static int32_t tc_i32(tc *t, int type)
{
	if (type != TT_I32 && type != TT_I16 && type != TT_I8)
		corrupt(t->name, "metadata field is not an integer");
	if (type == TT_I8) {
		if (t->p >= t->end)
			corrupt(t->name, "metadata ends inside a number");
		return (int8_t)*t->p++;
	}
	int64_t v = tc_zz(t);
	if (v < INT32_MIN || v > INT32_MAX)
		corrupt(t->name, "metadata integer out of range");
	return (int32_t)v;
}

static int64_t tc_i64(tc *t, int type)
{
	if (type != TT_I64)
		return tc_i32(t, type);
	return tc_zz(t);
}

static void tc_bin(tc *t, int type, const uint8_t **s, size_t *n)
{
	if (type != TT_BINARY)
		corrupt(t->name, "metadata field is not a string");
	uint64_t len = tc_uvar(t);
	if (len > (uint64_t)(t->end - t->p))
		corrupt(t->name, "metadata string past the end");
	*s = t->p;
	*n = (size_t)len;
	t->p += len;
}

static char *tc_str(tc *t, int type)
{
	const uint8_t *s;
	size_t n;
	tc_bin(t, type, &s, &n);
	return xstrndup((const char *)s, n);
}

/* The next field of a struct: 0 at its end; *last carries the previous field id. */
static int tc_field(tc *t, int *last, int *id, int *type)
{
	if (t->p >= t->end)
		corrupt(t->name, "metadata ends inside a struct");
	uint8_t b = *t->p++;
	*type = b & 0x0f;
	if (*type == TT_STOP)
		return 0;
	int delta = b >> 4;
	*id = delta ? *last + delta : tc_i32(t, TT_I16);
	*last = *id;
	if (*type > TT_STRUCT)
		corrupt(t->name, "bad metadata field type");
	return 1;
}

static size_t tc_list(tc *t, int type, int *etype)
{
	if (type != TT_LIST && type != TT_SET)
		corrupt(t->name, "metadata field is not a list");
	if (t->p >= t->end)
		corrupt(t->name, "metadata ends inside a list");
	uint8_t b = *t->p++;
	*etype = b & 0x0f;
	uint64_t n = b >> 4;
	if (n == 15)
		n = tc_uvar(t);
	if (n > (uint64_t)(t->end - t->p)) /* every element takes at least one byte */
		corrupt(t->name, "metadata list longer than the footer");
	return (size_t)n;
}

static void tc_skip(tc *t, int type);

static void tc_skip_struct(tc *t)
{
	if (++t->depth > 64)
		corrupt(t->name, "metadata nested too deeply");
	int last = 0, id, type;
	while (tc_field(t, &last, &id, &type))
		tc_skip(t, type);
	t->depth--;
}

static void tc_skip(tc *t, int type)
{
	const uint8_t *s;
	size_t n;
	switch (type) {
	case TT_TRUE:
	case TT_FALSE: break; /* in a struct: no payload */
	case TT_I8:
		if (t->p >= t->end)
			corrupt(t->name, "metadata ends inside a number");
		t->p++;
		break;
	case TT_I16:
	case TT_I32:
	case TT_I64: tc_uvar(t); break;
	case TT_DOUBLE:
		if (t->end - t->p < 8)
			corrupt(t->name, "metadata ends inside a number");
		t->p += 8;
		break;
	case TT_BINARY: tc_bin(t, type, &s, &n); break;
	case TT_LIST:
	case TT_SET: {
		int et;
		size_t k = tc_list(t, type, &et);
		if (++t->depth > 64)
			corrupt(t->name, "metadata nested too deeply");
		for (size_t i = 0; i < k; i++) {
			if (et == TT_TRUE || et == TT_FALSE) { /* list booleans: one byte */
				if (t->p >= t->end)
					corrupt(t->name, "metadata ends inside a list");
				t->p++;
			} else {
				tc_skip(t, et);
			}
		}
		t->depth--;
		break;
	}
	case TT_MAP: {
		uint64_t k = tc_uvar(t);
		if (k > (uint64_t)(t->end - t->p))
			corrupt(t->name, "metadata map longer than the footer");
		if (!k)
			break;
		if (t->p >= t->end)
			corrupt(t->name, "metadata ends inside a map");
		uint8_t kv = *t->p++;
		if (++t->depth > 64)
			corrupt(t->name, "metadata nested too deeply");
		for (uint64_t i = 0; i < k; i++) {
			tc_skip(t, kv >> 4);
			tc_skip(t, kv & 0x0f);
		}
		t->depth--;
		break;
	}
	case TT_STRUCT: tc_skip_struct(t); break;
	default: corrupt(t->name, "bad metadata field type");
	}
}

static int tc_bool(tc *t, int type)
{
	if (type == TT_TRUE)
		return 1;
	if (type == TT_FALSE)
		return 0;
	corrupt(t->name, "metadata field is not a boolean");
}

/* ---- footer ---- */

static void read_logical(tc *t, int type, pq_node *nd)
{
	if (type != TT_STRUCT)
		corrupt(t->name, "logicalType is not a struct");
	int last = 0, id, ft;
	while (tc_field(t, &last, &id, &ft)) {
		nd->logical = id;
		tc_skip(t, ft);
	}
}

static void read_schema_element(tc *t, pq_node *nd)
{
	memset(nd, 0, sizeof *nd);
	nd->type = -1;
	nd->conv = -1;
	int last = 0, id, type;
	while (tc_field(t, &last, &id, &type)) {
		switch (id) {
		case 1: nd->type = tc_i32(t, type); break;
		case 3: nd->rep = tc_i32(t, type); break;
		case 4:
			free(nd->name);
			nd->name = tc_str(t, type);
			break;
		case 5: nd->nchild = tc_i32(t, type); break;
		case 6: nd->conv = tc_i32(t, type); break;
		case 10: read_logical(t, type, nd); break;
		default: tc_skip(t, type);
		}
	}
	if (!nd->name)
		nd->name = xstrdup("");
	json_t *u = json_string(nd->name); /* names become JSON keys: UTF-8 only */
	if (!u)
		corrupt(t->name, "a column name is not UTF-8");
	json_decref(u);
	if (nd->rep < R_REQUIRED || nd->rep > R_REPEATED)
		corrupt(t->name, "bad repetition type");
	if (nd->nchild < 0)
		corrupt(t->name, "negative number of children");
}

static void read_column_meta(tc *t, pq_chunk *c)
{
	int last = 0, id, type;
	while (tc_field(t, &last, &id, &type)) {
		switch (id) {
		case 1: c->type = tc_i32(t, type); break;
		case 4: c->codec = tc_i32(t, type); break;
		case 5: c->num_values = tc_i64(t, type); break;
		case 7: c->size = tc_i64(t, type); break;
		case 9: c->data_off = tc_i64(t, type); break;
		case 11: c->dict_off = tc_i64(t, type); break;
		default: tc_skip(t, type);
		}
	}
}

static void read_column_chunk(tc *t, pq_chunk *c, int *external)
{
	int last = 0, id, type, have_meta = 0;
	while (tc_field(t, &last, &id, &type)) {
		if (id == 1 && type == TT_BINARY) {
			const uint8_t *s;
			size_t n;
			tc_bin(t, type, &s, &n);
			*external |= n > 0;
		} else if (id == 3 && type == TT_STRUCT) {
			read_column_meta(t, c);
			have_meta = 1;
		} else {
			tc_skip(t, type);
		}
	}
	if (!have_meta)
		corrupt(t->name, "column chunk without metadata");
}

static void read_row_group(tc *t, pq_group *g, int *external)
{
	int last = 0, id, type;
	g->num_rows = -1;
	while (tc_field(t, &last, &id, &type)) {
		if (id == 1) {
			int et;
			size_t n = tc_list(t, type, &et);
			if (et != TT_STRUCT)
				corrupt(t->name, "column chunks are not structs");
			free(g->chunks);
			g->chunks = xcalloc(n ? n : 1, sizeof *g->chunks);
			g->nchunks = n;
			for (size_t i = 0; i < n; i++)
				read_column_chunk(t, &g->chunks[i], external);
		} else if (id == 3) {
			g->num_rows = tc_i64(t, type);
		} else {
			tc_skip(t, type);
		}
	}
	if (g->num_rows < 0)
		corrupt(t->name, "row group without a row count");
}

/* Builds the tree below node *i (already read); fills kinds and leaves. */
static void build_leaves(bk_parquet *pq, int idx, int *path, int depth, int top)
{
	pq_node *nd = &pq->nodes[idx];
	if (depth > MAX_DEPTH)
		corrupt(pq->name, "schema nested too deeply");
	path[depth - 1] = idx;
	if (nd->type >= 0 && nd->nchild == 0) {
		nd->kind = K_LEAF;
		pq_leaf *l = &pq->leaves[pq->nleaves++];
		memset(l, 0, sizeof *l);
		l->depth = depth;
		l->top = top;
		size_t dl = 0;
		for (int i = 0; i < depth; i++) {
			pq_node *p = &pq->nodes[path[i]];
			l->path[i] = path[i];
			l->max_def += p->rep != R_REQUIRED;
			l->max_rep += p->rep == R_REPEATED;
			l->def[i] = l->max_def;
			l->rep[i] = l->max_rep;
			dl += strlen(p->name) + 1;
		}
		l->dotted = xmalloc(dl);
		l->dotted[0] = 0;
		for (int i = 0; i < depth; i++) {
			if (i)
				strcat(l->dotted, ".");
			strcat(l->dotted, pq->nodes[path[i]].name);
		}
		return;
	}
	if (nd->type >= 0 || nd->nchild == 0)
		corrupt(pq->name, "schema node is neither a column nor a group");
	/* children are the next nodes in depth-first order: find each one's index */
	int c = idx + 1;
	for (int k = 0; k < nd->nchild; k++) {
		if ((size_t)c >= pq->nnodes)
			corrupt(pq->name, "schema shorter than its children counts");
		build_leaves(pq, c, path, depth + 1, top);
		/* skip c's subtree: its nodes are contiguous */
		int end = c + 1, pending = pq->nodes[c].nchild;
		while (pending > 0) {
			if ((size_t)end >= pq->nnodes)
				corrupt(pq->name, "schema shorter than its children counts");
			pending += pq->nodes[end].nchild - 1;
			end++;
		}
		c = end;
	}
}

/* Marks LIST wrappers and the 3-level repeated group under one as pass-through (their
 * value is the array / the element), other groups as objects.  Returns the index of
 * the node after idx's subtree (the tree was checked to be consistent). */
static int classify(bk_parquet *pq, int idx)
{
	pq_node *nd = &pq->nodes[idx];
	if (nd->nchild == 0)
		return idx + 1;
	if (nd->kind != K_PASS)
		nd->kind = K_OBJECT;
	int first = idx + 1;
	int is_list = nd->conv == CT_LIST || nd->logical == LT_LIST;
	if (is_list && nd->nchild == 1 && pq->nodes[first].rep == R_REPEATED) {
		pq_node *r = &pq->nodes[first];
		nd->kind = K_PASS;
		/* 3-level unless the legacy 2-level names or shapes (parquet's
		 * LogicalTypes.md backward-compatibility rules) */
		size_t rl = strlen(r->name);
		int legacy = !strcmp(r->name, "array") ||
			     (rl > 6 && !strcmp(r->name + rl - 6, "_tuple"));
		if (r->nchild == 1 && !legacy)
			r->kind = K_PASS;
	}
	int c = first;
	for (int k = 0; k < nd->nchild; k++)
		c = classify(pq, c);
	return c;
}

static uint32_t le32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t le64(const uint8_t *p) { return le32(p) | (uint64_t)le32(p + 4) << 32; }

static void free_meta(bk_parquet *pq)
{
	for (size_t i = 0; i < pq->nnodes; i++)
		free(pq->nodes[i].name);
	free(pq->nodes);
	for (size_t i = 0; i < pq->nleaves; i++)
		free(pq->leaves[i].dotted);
	free(pq->leaves);
	free(pq->tops);
	for (size_t i = 0; i < pq->ngroups; i++)
		free(pq->groups[i].chunks);
	free(pq->groups);
}

bk_parquet *bk_parquet_open_mem(const char *name, const void *vbuf, size_t len)
{
	const uint8_t *buf = vbuf;
	bk_parquet *pq = xcalloc(1, sizeof *pq);
	pq->name = xstrdup(name);
	pq->buf = buf;
	pq->len = len;
	if (len < 12 || memcmp(buf, "PAR1", 4))
		die("%s: not a parquet file (no PAR1 magic)", name);
	if (!memcmp(buf + len - 4, "PARE", 4))
		die("%s: encrypted parquet files are not supported", name);
	if (memcmp(buf + len - 4, "PAR1", 4))
		corrupt(name, "no PAR1 magic at the end: truncated?");
	uint32_t flen = le32(buf + len - 8);
	if (flen > len - 12)
		corrupt(name, "footer length past the start of the file");
	tc t = {buf + len - 8 - flen, buf + len - 8, pq->name, 0};
	int last = 0, id, type, external = 0, have_schema = 0;
	pq->num_rows = -1;
	while (tc_field(&t, &last, &id, &type)) {
		if (id == 2) {
			int et;
			size_t n = tc_list(&t, type, &et);
			if (et != TT_STRUCT || n == 0)
				corrupt(name, "schema is not a list of elements");
			for (size_t i = 0; i < pq->nnodes; i++)
				free(pq->nodes[i].name);
			free(pq->nodes);
			pq->nodes = xcalloc(n, sizeof *pq->nodes);
			pq->nnodes = 0;
			for (size_t i = 0; i < n; i++) {
				read_schema_element(&t, &pq->nodes[i]);
				pq->nnodes++;
			}
			have_schema = 1;
		} else if (id == 3) {
			pq->num_rows = tc_i64(&t, type);
		} else if (id == 4) {
			int et;
			size_t n = tc_list(&t, type, &et);
			if (et != TT_STRUCT)
				corrupt(name, "row groups are not structs");
			for (size_t i = 0; i < pq->ngroups; i++)
				free(pq->groups[i].chunks);
			free(pq->groups);
			pq->groups = xcalloc(n ? n : 1, sizeof *pq->groups);
			pq->ngroups = 0;
			for (size_t i = 0; i < n; i++) {
				read_row_group(&t, &pq->groups[i], &external);
				pq->ngroups++;
			}
		} else {
			tc_skip(&t, type);
		}
	}
	if (!have_schema)
		corrupt(name, "no schema");
	if (pq->num_rows < 0)
		corrupt(name, "no row count");
	if (external)
		die("%s: column chunks in other files are not supported", name);
	/* the schema tree: node 0 is the root; its children are the top-level columns */
	pq_node *root = &pq->nodes[0];
	if (root->type >= 0 && root->nchild == 0)
		corrupt(name, "schema root is a column");
	/* the number of nodes in the tree must be exactly nnodes */
	{
		size_t end = 1;
		int64_t pending = root->nchild;
		while (pending > 0) {
			if (end >= pq->nnodes)
				corrupt(name, "schema shorter than its children counts");
			pending += pq->nodes[end].nchild - 1;
			end++;
		}
		if (end != pq->nnodes)
			corrupt(name, "schema longer than its children counts");
	}
	pq->leaves = xcalloc(pq->nnodes, sizeof *pq->leaves);
	pq->tops = xcalloc(root->nchild ? root->nchild : 1, sizeof *pq->tops);
	int c = 1;
	for (int k = 0; k < root->nchild; k++) {
		int path[MAX_DEPTH + 1];
		pq->tops[pq->ntops++] = c;
		build_leaves(pq, c, path, 1, k); /* checks the depth first */
		c = classify(pq, c);
	}
	int64_t total = 0;
	for (size_t g = 0; g < pq->ngroups; g++) {
		pq_group *gr = &pq->groups[g];
		if (gr->nchunks != pq->nleaves)
			corrupt(name, "row group's column count differs from the schema's");
		if (gr->num_rows > INT64_MAX - total)
			corrupt(name, "row counts overflow");
		total += gr->num_rows;
	}
	if (total != pq->num_rows)
		corrupt(name, "row groups' rows do not add up to the file's");
	return pq;
}

bk_parquet *bk_parquet_open(const char *path)
{
	bk_map m = bk_map_file(path);
	bk_parquet *pq = bk_parquet_open_mem(path, m.data, m.len);
	pq->map = m;
	return pq;
}

void bk_parquet_close(bk_parquet *pq)
{
	if (!pq)
		return;
	free_meta(pq);
	if (pq->map.data)
		bk_unmap(&pq->map);
	free(pq->name);
	free(pq);
}

int64_t bk_parquet_num_rows(const bk_parquet *pq) { return pq->num_rows; }
size_t bk_parquet_num_row_groups(const bk_parquet *pq) { return pq->ngroups; }
int64_t bk_parquet_row_group_rows(const bk_parquet *pq, size_t g)
{
	BUG_ON(g >= pq->ngroups);
	return pq->groups[g].num_rows;
}
size_t bk_parquet_num_columns(const bk_parquet *pq) { return pq->ntops; }
const char *bk_parquet_column(const bk_parquet *pq, size_t i)
{
	BUG_ON(i >= pq->ntops);
	return pq->nodes[pq->tops[i]].name;
}

/* ---- pages ---- */

typedef struct {
	int type;
	int32_t usize, csize;
	int32_t num_values, encoding, def_enc, rep_enc; /* v1 and v2 */
	int32_t def_len, rep_len;                       /* v2 */
	int v2_compressed;
	int32_t dict_values;
} pq_page;

static void read_page_header(tc *t, pq_page *h)
{
	memset(h, 0, sizeof *h);
	h->type = -1;
	h->v2_compressed = 1;
	int last = 0, id, type;
	while (tc_field(t, &last, &id, &type)) {
		switch (id) {
		case 1: h->type = tc_i32(t, type); break;
		case 2: h->usize = tc_i32(t, type); break;
		case 3: h->csize = tc_i32(t, type); break;
		case 5:
		case 7:
		case 8: {
			if (type != TT_STRUCT)
				corrupt(t->name, "page header part is not a struct");
			int l2 = 0, id2, t2;
			while (tc_field(t, &l2, &id2, &t2)) {
				if (id == 5) { /* DataPageHeader */
					switch (id2) {
					case 1: h->num_values = tc_i32(t, t2); break;
					case 2: h->encoding = tc_i32(t, t2); break;
					case 3: h->def_enc = tc_i32(t, t2); break;
					case 4: h->rep_enc = tc_i32(t, t2); break;
					default: tc_skip(t, t2);
					}
				} else if (id == 7) { /* DictionaryPageHeader */
					switch (id2) {
					case 1: h->dict_values = tc_i32(t, t2); break;
					case 2: h->encoding = tc_i32(t, t2); break;
					default: tc_skip(t, t2);
					}
				} else { /* DataPageHeaderV2 */
					switch (id2) {
					case 1: h->num_values = tc_i32(t, t2); break;
					case 4: h->encoding = tc_i32(t, t2); break;
					case 5: h->def_len = tc_i32(t, t2); break;
					case 6: h->rep_len = tc_i32(t, t2); break;
					case 7: h->v2_compressed = tc_bool(t, t2); break;
					default: tc_skip(t, t2);
					}
				}
			}
			break;
		}
		default: tc_skip(t, type);
		}
	}
	if (h->usize < 0 || h->csize < 0 || (uint32_t)h->usize > MAX_PAGE)
		corrupt(t->name, "bad page size");
	if (h->num_values < 0 || h->dict_values < 0 || h->def_len < 0 || h->rep_len < 0)
		corrupt(t->name, "negative count in a page header");
}

/* What a column read needs in messages and state. */
typedef struct {
	bk_parquet *pq;
	const pq_leaf *leaf;
	const pq_node *ln; /* the leaf node */
	int ptype, codec;
	size_t g;
	json_t **dict;
	size_t ndict;
	int have_dict;
	uint8_t *scratch; /* decompressed page */
	size_t scap;
	/* assembly */
	json_t *rows;
	int64_t row; /* current row in the group, -1 before the first */
	int64_t first, stop; /* rows kept: [first, stop) */
	size_t idx[MAX_DEPTH];
	/* the page's levels and indices, held here (in the caller's frame) while a
	 * die() may happen, so LeakSanitizer finds them at exit */
	uint32_t *rep, *def, *ids;
} pq_col;

static _Noreturn void col_die(const pq_col *c, const char *fmt, ...)
	__attribute__((format(printf, 2, 3)));
static void col_die(const pq_col *c, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof msg, fmt, ap);
	va_end(ap);
	die("%s: column '%s': %s", c->pq->name, c->leaf->dotted, msg);
}

static _Noreturn void col_corrupt(const pq_col *c, const char *what)
{
	die("%s: corrupt parquet file (column '%s', row group %zu: %s)", c->pq->name,
	    c->leaf->dotted, c->g, what);
}

static const char *codec_name(int codec)
{
	static const char *const names[] = {"UNCOMPRESSED", "SNAPPY", "GZIP", "LZO",
					    "BROTLI",       "LZ4",    "ZSTD", "LZ4_RAW"};
	return codec >= 0 && codec < 8 ? names[codec] : "unknown";
}

static const char *encoding_name(int e)
{
	static const char *const names[] = {
		"PLAIN", "GROUP_VAR_INT", "PLAIN_DICTIONARY", "RLE", "BIT_PACKED",
		"DELTA_BINARY_PACKED", "DELTA_LENGTH_BYTE_ARRAY", "DELTA_BYTE_ARRAY",
		"RLE_DICTIONARY", "BYTE_STREAM_SPLIT"};
	return e >= 0 && e < 10 ? names[e] : "unknown";
}

/* Decompresses src into c->scratch, which must get exactly usize bytes. */
static const uint8_t *decompress(pq_col *c, const uint8_t *src, size_t n, size_t usize)
{
	if (c->codec == C_UNCOMPRESSED) {
		if (n != usize)
			col_corrupt(c, "uncompressed page size differs from its header");
		return src;
	}
	if (usize + 1 > c->scap) {
		free(c->scratch);
		c->scap = usize + 1;
		c->scratch = xmalloc(c->scap);
	}
	switch (c->codec) {
	case C_SNAPPY: {
		size_t out = 0;
		if (snappy_uncompressed_length((const char *)src, n, &out) != SNAPPY_OK ||
		    out != usize)
			col_corrupt(c, "bad snappy page");
		out = usize;
		if (snappy_uncompress((const char *)src, n, (char *)c->scratch, &out) !=
			    SNAPPY_OK ||
		    out != usize)
			col_corrupt(c, "bad snappy page");
		break;
	}
	case C_ZSTD: {
		size_t r = ZSTD_decompress(c->scratch, usize, src, n);
		if (ZSTD_isError(r) || r != usize)
			col_corrupt(c, "bad zstd page");
		break;
	}
	case C_GZIP: {
		z_stream z;
		memset(&z, 0, sizeof z);
		if (inflateInit2(&z, 15 + 32) != Z_OK) /* gzip or zlib header */
			die("%s: zlib cannot start", c->pq->name);
		z.next_in = (Bytef *)src;
		z.avail_in = (uInt)n;
		z.next_out = c->scratch;
		z.avail_out = (uInt)usize + 1;
		int rc = inflate(&z, Z_FINISH);
		size_t got = z.total_out;
		inflateEnd(&z);
		if (rc != Z_STREAM_END || got != usize)
			col_corrupt(c, "bad gzip page");
		break;
	}
	default: BUG("codec %d not checked", c->codec);
	}
	return c->scratch;
}

/* RLE / bit-packed hybrid: count values of width bw from [p, end) into out. */
static void rle_decode(const pq_col *c, const uint8_t *p, const uint8_t *end, int bw,
		       uint32_t *out, size_t count)
{
	size_t got = 0;
	if (bw < 0 || bw > 32)
		col_corrupt(c, "bit width over 32");
	while (got < count) {
		tc t = {p, end, c->pq->name, 0};
		if (p >= end)
			col_corrupt(c, "levels or indices end early");
		uint64_t h = tc_uvar(&t);
		p = t.p;
		if (h & 1) { /* bit-packed: (h >> 1) groups of 8 */
			uint64_t nv = (h >> 1) * 8;
			size_t avail_bits = (size_t)(end - p) * 8;
			uint64_t nbytes = ((h >> 1) * (uint64_t)bw);
			for (uint64_t i = 0; i < nv && got < count; i++) {
				uint64_t bit = i * (uint64_t)bw;
				if (bit + (uint64_t)bw > avail_bits)
					col_corrupt(c, "bit-packed run past the end");
				uint32_t v = 0;
				for (int b = 0; b < bw; b++) {
					uint64_t at = bit + (uint64_t)b;
					v |= (uint32_t)((p[at >> 3] >> (at & 7)) & 1) << b;
				}
				out[got++] = v;
			}
			p = nbytes > (uint64_t)(end - p) ? end : p + nbytes;
		} else { /* run of one value */
			uint64_t run = h >> 1;
			int nb = (bw + 7) / 8;
			if (end - p < nb)
				col_corrupt(c, "rle run past the end");
			uint32_t v = 0;
			for (int b = 0; b < nb; b++)
				v |= (uint32_t)p[b] << (8 * b);
			p += nb;
			if (bw < 32 && (v >> bw))
				col_corrupt(c, "rle value wider than its bit width");
			for (uint64_t i = 0; i < run && got < count; i++)
				out[got++] = v;
		}
	}
}

static int bit_width(int max)
{
	int w = 0;
	while ((1 << w) <= max)
		w++;
	return w;
}

/* One value of the leaf's physical type, PLAIN at *p (advanced). */
static json_t *plain_value(pq_col *c, const uint8_t **pp, const uint8_t *end, size_t bitpos)
{
	const uint8_t *p = *pp;
	json_t *v = NULL;
	switch (c->ptype) {
	case T_BOOLEAN:
		if ((size_t)(end - p) * 8 <= bitpos)
			col_corrupt(c, "values end early");
		return json_boolean((p[bitpos >> 3] >> (bitpos & 7)) & 1);
	case T_INT32: {
		if (end - p < 4)
			col_corrupt(c, "values end early");
		uint32_t u = le32(p);
		*pp = p + 4;
		v = c->ln->conv == CT_UINT_32 ? json_integer((json_int_t)u)
					      : json_integer((int32_t)u);
		break;
	}
	case T_INT64: {
		if (end - p < 8)
			col_corrupt(c, "values end early");
		uint64_t u = le64(p);
		*pp = p + 8;
		if (c->ln->conv == CT_UINT_64 && u > (uint64_t)INT64_MAX)
			v = json_real((double)u);
		else
			v = json_integer((json_int_t)(int64_t)u);
		break;
	}
	case T_FLOAT: {
		if (end - p < 4)
			col_corrupt(c, "values end early");
		uint32_t u = le32(p);
		float f;
		memcpy(&f, &u, 4);
		*pp = p + 4;
		v = isfinite(f) ? json_real(f) : json_null();
		break;
	}
	case T_DOUBLE: {
		if (end - p < 8)
			col_corrupt(c, "values end early");
		uint64_t u = le64(p);
		double d;
		memcpy(&d, &u, 8);
		*pp = p + 8;
		v = isfinite(d) ? json_real(d) : json_null();
		break;
	}
	case T_BYTE_ARRAY: {
		if (end - p < 4)
			col_corrupt(c, "values end early");
		uint32_t n = le32(p);
		if (n > (size_t)(end - p) - 4)
			col_corrupt(c, "string past the end of its page");
		v = json_stringn((const char *)p + 4, n);
		*pp = p + 4 + n;
		if (!v)
			col_die(c, "a value is not valid UTF-8 (binary data?)");
		return v;
	}
	default: BUG("type %d not checked", c->ptype);
	}
	if (!v)
		die("%s: out of memory", c->pq->name);
	return v;
}

static void decode_dict(pq_col *c, const pq_page *h, const uint8_t *p, size_t n)
{
	if (c->have_dict)
		col_corrupt(c, "second dictionary page");
	if (h->encoding != E_PLAIN && h->encoding != E_PLAIN_DICT)
		col_die(c, "dictionary encoding %s is not supported", encoding_name(h->encoding));
	const uint8_t *end = p + n;
	size_t nv = (size_t)h->dict_values;
	/* every value takes at least a bit (booleans) or 4 bytes */
	if (c->ptype == T_BOOLEAN ? nv > n * 8 : nv > n / 4)
		col_corrupt(c, "dictionary longer than its page");
	c->dict = xcalloc(nv ? nv : 1, sizeof *c->dict);
	c->have_dict = 1;
	for (size_t i = 0; i < nv; i++) {
		c->dict[i] = plain_value(c, &p, end, i);
		c->ndict++;
	}
}

/* ---- assembly ---- */

typedef struct {
	json_t *c; /* object or array */
	const char *key; /* object slot when set */
	size_t idx;      /* array slot */
} slot;

static json_t *slot_get(const pq_col *c, const slot *s)
{
	if (s->key)
		return json_object_get(s->c, s->key);
	size_t n = json_array_size(s->c);
	if (s->idx > n)
		col_corrupt(c, "list element out of order");
	return s->idx < n ? json_array_get(s->c, s->idx) : NULL;
}

static void slot_put(const pq_col *c, const slot *s, json_t *v)
{
	int rc = s->key ? json_object_set_new(s->c, s->key, v) : json_array_append_new(s->c, v);
	if (rc)
		die("%s: out of memory", c->pq->name);
}

/* get or create a container of the given kind at s */
static json_t *slot_container(const pq_col *c, const slot *s, int array)
{
	json_t *v = slot_get(c, s);
	if (v) {
		if (array ? !json_is_array(v) : !json_is_object(v))
			col_corrupt(c, "levels disagree between the columns of a group");
		return v;
	}
	v = array ? json_array() : json_object();
	if (!v)
		die("%s: out of memory", c->pq->name);
	slot_put(c, s, v);
	return v;
}

static void slot_null(const pq_col *c, const slot *s)
{
	json_t *v = slot_get(c, s);
	if (v) {
		if (!json_is_null(v))
			col_corrupt(c, "levels disagree between the columns of a group");
		return;
	}
	slot_put(c, s, json_null());
}

static void slot_value(const pq_col *c, const slot *s, json_t *v)
{
	if (slot_get(c, s)) {
		json_decref(v);
		col_corrupt(c, "a value written twice");
	}
	slot_put(c, s, v);
}

/* One (r, d, value) triple; value is consumed (NULL when d < max_def). */
static void assemble(pq_col *c, int r, int d, json_t *value)
{
	const pq_leaf *l = c->leaf;
	if (r == 0) {
		c->row++;
		if (c->row >= c->pq->groups[c->g].num_rows) {
			json_decref(value);
			col_corrupt(c, "more rows than the row group has");
		}
	} else if (c->row < 0) {
		json_decref(value);
		col_corrupt(c, "first value continues a row");
	}
	if (c->row < c->first || c->row >= c->stop) {
		json_decref(value);
		return;
	}
	size_t ri = (size_t)(c->row - c->first);
	json_t *obj = json_array_get(c->rows, ri);
	if (!obj) {
		if (ri != json_array_size(c->rows)) {
			json_decref(value);
			col_corrupt(c, "rows out of order");
		}
		obj = json_object();
		if (!obj || json_array_append_new(c->rows, obj))
			die("%s: out of memory", c->pq->name);
	}
	slot s = {obj, c->pq->nodes[l->path[0]].name, 0};
	for (int i = 0; i < l->depth; i++) {
		const pq_node *nd = &c->pq->nodes[l->path[i]];
		if (nd->rep == R_OPTIONAL && d < l->def[i]) {
			json_decref(value);
			slot_null(c, &s);
			return;
		}
		if (nd->rep == R_REPEATED) {
			json_t *arr = slot_container(c, &s, 1);
			if (r < l->rep[i]) {
				c->idx[i] = 0;
				if (d < l->def[i]) { /* empty list */
					json_decref(value);
					if (json_array_size(arr))
						col_corrupt(c, "levels disagree between the "
							       "columns of a group");
					return;
				}
			} else {
				if (d < l->def[i]) {
					json_decref(value);
					col_corrupt(c, "repeated element without a value");
				}
				if (r == l->rep[i])
					c->idx[i]++;
			}
			s = (slot){arr, NULL, c->idx[i]};
		}
		if (i == l->depth - 1) {
			slot_value(c, &s, value);
			return;
		}
		if (nd->kind == K_OBJECT) {
			json_t *o = slot_container(c, &s, 0);
			s = (slot){o, c->pq->nodes[l->path[i + 1]].name, 0};
		}
		/* K_PASS: the child's value goes into the same slot */
	}
	BUG("leaf path without a leaf");
}

static void check_leaf(pq_col *c)
{
	const pq_leaf *l = c->leaf;
	for (int i = 0; i < l->depth; i++) {
		const pq_node *nd = &c->pq->nodes[l->path[i]];
		if (nd->conv == CT_MAP || nd->conv == CT_MAP_KV || nd->logical == LT_MAP)
			col_die(c, "MAP columns are not supported");
		if (nd->conv == CT_DECIMAL || nd->logical == LT_DECIMAL)
			col_die(c, "DECIMAL columns are not supported");
		if (nd->type < 0 && nd->kind == K_OBJECT && (nd->conv == CT_LIST ||
							      nd->logical == LT_LIST))
			col_die(c, "LIST layout is not supported (not one repeated child)");
	}
	switch (c->ptype) {
	case T_BOOLEAN:
	case T_INT32:
	case T_INT64:
	case T_FLOAT:
	case T_DOUBLE:
	case T_BYTE_ARRAY: break;
	case T_INT96: col_die(c, "type INT96 is not supported");
	case T_FLBA: col_die(c, "type FIXED_LEN_BYTE_ARRAY is not supported");
	default: col_corrupt(c, "unknown physical type");
	}
	switch (c->codec) {
	case C_UNCOMPRESSED:
	case C_SNAPPY:
	case C_GZIP:
	case C_ZSTD: break;
	default: col_die(c, "compression %s is not supported", codec_name(c->codec));
	}
}

/* One data page: levels, values, assembly.  Returns the number of level entries. */
static void data_page(pq_col *c, const pq_page *h, const uint8_t *body, size_t n)
{
	const pq_leaf *l = c->leaf;
	size_t nv = (size_t)h->num_values;
	const uint8_t *p, *end;
	const uint8_t *rep_p = NULL, *rep_e = NULL, *def_p = NULL, *def_e = NULL;
	if (h->type == P_DATA) {
		p = decompress(c, body, n, (size_t)h->usize);
		end = p + h->usize;
		if (l->max_rep) {
			if (h->rep_enc != E_RLE)
				col_die(c, "level encoding %s is not supported",
					encoding_name(h->rep_enc));
			if (end - p < 4 || le32(p) > (size_t)(end - p) - 4)
				col_corrupt(c, "repetition levels past the page");
			rep_p = p + 4, rep_e = p + 4 + le32(p);
			p = rep_e;
		}
		if (l->max_def) {
			if (h->def_enc != E_RLE)
				col_die(c, "level encoding %s is not supported",
					encoding_name(h->def_enc));
			if (end - p < 4 || le32(p) > (size_t)(end - p) - 4)
				col_corrupt(c, "definition levels past the page");
			def_p = p + 4, def_e = p + 4 + le32(p);
			p = def_e;
		}
	} else {
		size_t ll = (size_t)h->rep_len + (size_t)h->def_len;
		if (ll > n || ll > (size_t)h->usize)
			col_corrupt(c, "levels longer than the page");
		rep_p = body, rep_e = body + h->rep_len;
		def_p = rep_e, def_e = body + ll;
		if (h->v2_compressed) {
			p = decompress(c, body + ll, n - ll, (size_t)h->usize - ll);
		} else {
			if (n != (size_t)h->usize)
				col_corrupt(c, "uncompressed page size differs from its header");
			p = body + ll;
		}
		end = p + (h->usize - ll);
	}
	/* levels: each entry came from at least a bit of a run header, or a run */
	uint32_t *rep = c->rep = xcalloc(nv ? nv : 1, sizeof *rep);
	uint32_t *def = c->def = xcalloc(nv ? nv : 1, sizeof *def);
	if (l->max_rep)
		rle_decode(c, rep_p, rep_e, bit_width(l->max_rep), rep, nv);
	if (l->max_def)
		rle_decode(c, def_p, def_e, bit_width(l->max_def), def, nv);
	else
		for (size_t i = 0; i < nv; i++)
			def[i] = 0;
	size_t nvals = 0;
	for (size_t i = 0; i < nv; i++) {
		if (rep[i] > (uint32_t)l->max_rep || def[i] > (uint32_t)l->max_def) {
			free(rep), free(def);
			col_corrupt(c, "level above its maximum");
		}
		nvals += def[i] == (uint32_t)l->max_def;
	}
	uint32_t *ids = NULL;
	int dict = h->encoding == E_RLE_DICT || h->encoding == E_PLAIN_DICT;
	if (dict) {
		if (!c->have_dict) {
			free(rep), free(def);
			col_corrupt(c, "dictionary-encoded page without a dictionary");
		}
		ids = c->ids = xcalloc(nvals ? nvals : 1, sizeof *ids);
		if (nvals) {
			if (p >= end) {
				free(rep), free(def), free(ids);
				col_corrupt(c, "no bit width for dictionary indices");
			}
			rle_decode(c, p + 1, end, p[0], ids, nvals);
		}
		for (size_t i = 0; i < nvals; i++)
			if (ids[i] >= c->ndict) {
				free(rep), free(def), free(ids);
				col_corrupt(c, "dictionary index out of range");
			}
	} else if (h->encoding == E_RLE && c->ptype == T_BOOLEAN) {
		/* booleans in v2 pages: a 4-byte length, then the hybrid with width 1 */
		if (end - p < 4 || le32(p) > (size_t)(end - p) - 4) {
			free(rep), free(def);
			col_corrupt(c, "boolean values past the page");
		}
		ids = c->ids = xcalloc(nvals ? nvals : 1, sizeof *ids);
		rle_decode(c, p + 4, p + 4 + le32(p), 1, ids, nvals);
	} else if (h->encoding != E_PLAIN) {
		free(rep), free(def);
		col_die(c, "encoding %s is not supported", encoding_name(h->encoding));
	}
	size_t k = 0;
	for (size_t i = 0; i < nv; i++) {
		json_t *v = NULL;
		if (def[i] == (uint32_t)l->max_def) {
			if (dict)
				v = json_incref(c->dict[ids[k]]);
			else if (ids)
				v = json_boolean(ids[k]);
			else
				v = plain_value(c, &p, end, k);
			k++;
		}
		assemble(c, (int)rep[i], (int)def[i], v);
		if (c->row >= c->stop)
			break;
	}
	free(rep);
	free(def);
	free(ids);
	c->rep = c->def = c->ids = NULL;
}

static void read_column(pq_col *c)
{
	const pq_chunk *ch = &c->pq->groups[c->g].chunks[c->leaf - c->pq->leaves];
	c->ptype = ch->type;
	c->codec = ch->codec;
	if (ch->type != c->ln->type)
		col_corrupt(c, "chunk type differs from the schema's");
	check_leaf(c);
	int64_t start = ch->data_off;
	if (ch->dict_off > 0 && ch->dict_off < start)
		start = ch->dict_off;
	if (start < 4 || ch->size < 0 || (uint64_t)start > c->pq->len ||
	    (uint64_t)ch->size > c->pq->len - (uint64_t)start)
		col_corrupt(c, "column chunk outside the file");
	const uint8_t *p = c->pq->buf + start, *end = p + ch->size;
	int64_t seen = 0;
	while (seen < ch->num_values && c->row < c->stop) {
		if (p >= end)
			col_corrupt(c, "column chunk ends before its values");
		tc t = {p, end, c->pq->name, 0};
		pq_page h;
		read_page_header(&t, &h);
		p = t.p;
		if ((size_t)h.csize > (size_t)(end - p))
			col_corrupt(c, "page past the end of its column chunk");
		switch (h.type) {
		case P_DICT: {
			const uint8_t *d = decompress(c, p, (size_t)h.csize, (size_t)h.usize);
			decode_dict(c, &h, d, (size_t)h.usize);
			break;
		}
		case P_DATA:
		case P_DATA_V2:
			if (h.num_values > ch->num_values - seen)
				col_corrupt(c, "pages hold more values than the chunk");
			data_page(c, &h, p, (size_t)h.csize);
			seen += h.num_values;
			break;
		case P_INDEX: break;
		default: col_corrupt(c, "unknown page type");
		}
		p += h.csize;
	}
	int64_t want = c->pq->groups[c->g].num_rows;
	if (c->row < c->stop && c->row + 1 != want)
		col_corrupt(c, "fewer rows than the row group has");
}

json_t *bk_parquet_read_rows(bk_parquet *pq, size_t g, int64_t first, int64_t count,
			     const char *const *columns)
{
	BUG_ON(g >= pq->ngroups);
	int64_t nr = pq->groups[g].num_rows;
	if (first < 0)
		first = 0;
	if (first > nr)
		first = nr;
	if (count < 0 || count > nr - first)
		count = nr - first;
	json_t *rows = json_array();
	if (!rows)
		die("%s: out of memory", pq->name);
	for (size_t i = 0; i < pq->nleaves && count > 0; i++) {
		const pq_leaf *l = &pq->leaves[i];
		const char *top = pq->nodes[l->path[0]].name;
		if (columns) {
			size_t k = 0;
			while (columns[k] && strcmp(columns[k], top))
				k++;
			if (!columns[k])
				continue;
		}
		pq_col c = {.pq = pq, .leaf = l, .ln = &pq->nodes[l->path[l->depth - 1]],
			    .g = g, .rows = rows, .row = -1, .first = first,
			    .stop = first + count};
		read_column(&c);
		for (size_t k = 0; k < c.ndict; k++)
			json_decref(c.dict[k]);
		free(c.dict);
		free(c.scratch);
	}
	/* rows no column was read for (no column selected): empty objects */
	while ((int64_t)json_array_size(rows) < count) {
		json_t *o = json_object();
		if (!o || json_array_append_new(rows, o))
			die("%s: out of memory", pq->name);
	}
	return rows;
}
