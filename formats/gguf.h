/* gguf.h - reading GGUF files (llama.cpp's model format, versions 2 and 3): metadata
 * key/values, tensor infos, and dequantization of F32/F16/BF16/Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K
 * tensors to fp32.  Not a model loader: formats/gguf_hf.c turns a file into an HF model
 * directory.
 *
 * Invariants of an open bk_gguf (checked at open; a bad file is one die() line naming
 * the file and the byte offset, key or tensor, never an out-of-bounds read):
 *   1. magic "GGUF", version 2 or 3, little-endian;
 *   2. every string and array lies inside the file; arrays of arrays are refused;
 *      keys are unique;
 *   3. general.alignment (default 32) is a power of two; the data region starts at the
 *      first aligned offset after the tensor infos;
 *   4. every tensor: 1 <= n_dims <= 4, dims >= 1, a known ggml type, ne[0] a multiple
 *      of the type's block size, no size overflow, offset aligned, data inside the file,
 *      no two tensors overlap; names unique.
 * Strings point into the mapping and are not NUL-terminated: use (s, n). */
#ifndef BK_GGUF_H
#define BK_GGUF_H

#include <stddef.h>
#include <stdint.h>

/* GGUF metadata value types */
enum {
	BK_GGUF_U8 = 0, BK_GGUF_I8 = 1, BK_GGUF_U16 = 2, BK_GGUF_I16 = 3, BK_GGUF_U32 = 4,
	BK_GGUF_I32 = 5, BK_GGUF_F32 = 6, BK_GGUF_BOOL = 7, BK_GGUF_STRING = 8,
	BK_GGUF_ARRAY = 9, BK_GGUF_U64 = 10, BK_GGUF_I64 = 11, BK_GGUF_F64 = 12,
};

/* ggml tensor types (the ones dequantized here, plus names for messages) */
enum {
	BK_GGML_F32 = 0, BK_GGML_F16 = 1, BK_GGML_Q4_0 = 2, BK_GGML_Q4_1 = 3,
	BK_GGML_Q5_0 = 6, BK_GGML_Q5_1 = 7, BK_GGML_Q8_0 = 8, BK_GGML_Q4_K = 12,
	BK_GGML_Q5_K = 13, BK_GGML_Q6_K = 14, BK_GGML_BF16 = 30,
};

typedef struct {
	const char *s; /* into the mapping, not NUL-terminated */
	uint64_t n;
} bk_gguf_str;

typedef struct {
	char *key;          /* NUL-terminated copy */
	uint32_t type;      /* BK_GGUF_* */
	uint32_t arr_type;  /* element type when type == BK_GGUF_ARRAY */
	uint64_t n;         /* array length (1 for a scalar) */
	const uint8_t *data; /* numbers (scalar or array): little-endian values in the file */
	bk_gguf_str *strs;  /* string or array of strings: n entries; else NULL */
} bk_gguf_kv;

typedef struct {
	char *name;
	int ndim;
	int64_t ne[4];      /* ggml order: ne[0] varies fastest (an HF [out,in] weight is {in,out}) */
	uint32_t type;      /* BK_GGML_* or another ggml type id */
	uint64_t offset;    /* relative to the data region */
	const uint8_t *data;
	size_t nbytes;
} bk_gguf_tensor;

typedef struct bk_gguf bk_gguf;

/* Opens and validates a file (mmap); dies on error naming the file. */
bk_gguf *bk_gguf_open(const char *path);
/* The same over a buffer the caller keeps alive (fuzzing, tests); name for messages. */
bk_gguf *bk_gguf_open_mem(const char *name, const uint8_t *data, size_t len);
void bk_gguf_close(bk_gguf *g);
const char *bk_gguf_path(const bk_gguf *g);
uint32_t bk_gguf_version(const bk_gguf *g);

size_t bk_gguf_n_kv(const bk_gguf *g);
const bk_gguf_kv *bk_gguf_kv_at(const bk_gguf *g, size_t i);
const bk_gguf_kv *bk_gguf_find_kv(const bk_gguf *g, const char *key); /* NULL if absent */

/* Typed getters: 1 and *out when present, 0 when absent; a value of the wrong type dies
 * naming the file and key.  get_int accepts every integer type (and bool), get_float
 * every number, get_bool a bool. */
int bk_gguf_get_int(const bk_gguf *g, const char *key, int64_t *out);
int bk_gguf_get_float(const bk_gguf *g, const char *key, double *out);
int bk_gguf_get_bool(const bk_gguf *g, const char *key, int *out);
/* A string value: malloc'd NUL-terminated copy, or NULL when absent; dies if it holds
 * a NUL byte or is not a string. */
char *bk_gguf_get_str(const bk_gguf *g, const char *key);
/* An array: NULL when absent; dies if not an array of elem_type (for integers: any
 * integer element type when elem_type is BK_GGUF_I64). */
const bk_gguf_kv *bk_gguf_get_arr(const bk_gguf *g, const char *key, uint32_t elem_type);
/* Element i of an integer array. */
int64_t bk_gguf_arr_int(const bk_gguf_kv *kv, uint64_t i);

size_t bk_gguf_n_tensors(const bk_gguf *g);
const bk_gguf_tensor *bk_gguf_tensor_at(const bk_gguf *g, size_t i); /* file order */
const bk_gguf_tensor *bk_gguf_find_tensor(const bk_gguf *g, const char *name);
int64_t bk_gguf_numel(const bk_gguf_tensor *t);

/* "Q4_K", or "type 7" style for ids without a name here (static buffer not used:
 * returns "unknown" for ids never assigned). */
const char *bk_ggml_type_name(uint32_t type);
int bk_ggml_type_supported(uint32_t type); /* dequantized by bk_gguf_dequant */
/* Elements per block and bytes per block of a supported type; 0 if unsupported. */
int bk_ggml_block_elems(uint32_t type);
size_t bk_ggml_block_bytes(uint32_t type);

/* Dequantizes n elements (a multiple of the block size) of type at src into out, in
 * the order of operations of llama.cpp's dequantize_row_* (and gguf-py's numpy code). */
void bk_ggml_dequant(uint32_t type, const void *src, float *out, int64_t n);
/* The whole tensor into out (bk_gguf_numel floats); dies naming the tensor when its
 * type is not supported. */
void bk_gguf_dequant(const bk_gguf *g, const bk_gguf_tensor *t, float *out);

/* Undoes llama.cpp's q/k row permutation of a [n_head * D, cols] weight, in place:
 * GGUF row h*D + 2i + j is HF row h*D + j*D/2 + i (D even). */
void bk_gguf_unpermute(float *w, int64_t rows, int64_t cols, int n_head);

#endif
