/* safetensors.h - reading (mmap, validated) and writing (atomic) safetensors files,
 * single-file or sharded through model.safetensors.index.json; F32/F16/BF16 only.
 * Not a model loader: it knows tensor names, dtypes and shapes, not what they mean.
 *
 * Invariants of an open bk_st (checked at open; a bad file is one die() line naming
 * the file and tensor, never an out-of-bounds read):
 *   1. 8 + header length <= file size, header length < 100 MB, header is a JSON object;
 *   2. every tensor: dtype F32/F16/BF16, 0 <= ndim <= BK_ST_MAX_DIM, dims >= 0,
 *      product(shape) * dtype size does not overflow and equals end - begin;
 *   3. data_offsets [begin, end) lie inside the data region; non-empty tensors of one
 *      file do not overlap;
 *   4. tensor names are unique over all shards; tensors are kept sorted by name.
 * The data pointer points into the mapping: it may be unaligned when the file's header
 * was not padded, so read it with memcpy or bk_st_read_f32(). */
#ifndef BK_SAFETENSORS_H
#define BK_SAFETENSORS_H

#include "common/files.h"

#include <stddef.h>
#include <stdint.h>

#define BK_ST_MAX_DIM 8
#define BK_ST_MAX_HEADER (100u << 20) /* 100 MB */

typedef enum { BK_DT_F32, BK_DT_F16, BK_DT_BF16 } bk_dtype;

const char *bk_dtype_name(bk_dtype dt); /* "F32", "F16", "BF16" */
size_t bk_dtype_size(bk_dtype dt);
int bk_dtype_parse(const char *s, bk_dtype *out); /* 0 ok, -1 unknown */

typedef struct {
	char *name;
	bk_dtype dtype;
	int ndim;
	int64_t shape[BK_ST_MAX_DIM];
	const void *data; /* inside the mapping, possibly unaligned */
	size_t nbytes;
	const char *file; /* path of the file holding it (for messages) */
} bk_st_tensor;

typedef struct bk_st bk_st; /* one model: one file or all its shards */

/* path_or_model_dir: a .safetensors file, a model.safetensors.index.json, or a
 * directory holding model.safetensors or model.safetensors.index.json. Dies on error. */
bk_st *bk_st_open(const char *path_or_model_dir);
/* one .safetensors file whose mapped bytes check() sees before they are parsed (check
 * NULL: bk_st_open) */
bk_st *bk_st_open_checked(const char *path, bk_bytes_check check, void *ctx);
void bk_st_close(bk_st *st);
const char *bk_st_path(const bk_st *st); /* the path given to bk_st_open */

const bk_st_tensor *bk_st_find(const bk_st *st, const char *name); /* NULL if absent */
size_t bk_st_count(const bk_st *st);
const bk_st_tensor *bk_st_at(const bk_st *st, size_t i); /* sorted by name */
/* A __metadata__ value of the (first) file; NULL if absent. */
const char *bk_st_meta(const bk_st *st, const char *key);
int64_t bk_st_numel(const bk_st_tensor *t);

/* Copy a tensor into fp32 (out: product(shape) floats), checking it exists and has
 * the expected shape and only finite values; dies naming the tensor (and the expected
 * and actual shape, or the first NaN/inf). */
void bk_st_read_f32(const bk_st *st, const char *name, int ndim, const int64_t *shape,
		    float *out);
/* The tensor name with exactly this shape; dies naming the tensor when it is absent or
 * of another shape (the expected and the actual one). */
const bk_st_tensor *bk_st_get(const bk_st *st, const char *name, int ndim, const int64_t *shape);
/* Elements [off, off + n) of t (row-major) as bf16 bit patterns: a BF16 tensor's bytes as
 * they are, F16 and F32 rounded to nearest even (as the CUDA device rounds fp32, so the
 * same numbers as bk_st_read_f32 then rounded); dies naming the tensor at the first
 * NaN/inf, as bk_st_read_f32.  For loading chunk by chunk without a copy of the tensor. */
void bk_st_read_bf16(const bk_st_tensor *t, size_t off, size_t n, uint16_t *out);
/* Convert n elements of dtype dt at src (any alignment) to fp32. */
void bk_convert_to_f32(bk_dtype dt, const void *src, size_t n, float *out);
/* Format a shape as "[2, 3]" into buf (always NUL-terminated). */
void bk_shape_str(int ndim, const int64_t *shape, char *buf, size_t size);

/* Half-precision conversions. bf16/f16 from f32 round to nearest even; overflow
 * gives inf; NaN stays NaN (quiet, sign kept); f16 subnormals are exact. */
float bk_bf16_to_f32(uint16_t h);
uint16_t bk_f32_to_bf16(float f);
float bk_f16_to_f32(uint16_t h);
uint16_t bk_f32_to_f16(float f);

/* Writer: collects tensors and writes one valid file atomically (temporary + rename):
 * JSON keys sorted, data in name order, header padded with spaces so the data region
 * starts 8-byte aligned, optional __metadata__ string map. */
typedef struct bk_st_writer bk_st_writer;
bk_st_writer *bk_st_writer_new(void);
/* Add raw data of dtype dt; the bytes are referenced, not copied: keep them alive
 * until bk_st_writer_write(). Duplicate names are a BUG. */
void bk_st_writer_add(bk_st_writer *w, const char *name, bk_dtype dt, int ndim,
		      const int64_t *shape, const void *data);
/* Add fp32 data converted (copied) to dtype dt. */
void bk_st_writer_add_f32(bk_st_writer *w, const char *name, bk_dtype dt, int ndim,
			  const int64_t *shape, const float *src);
void bk_st_writer_meta(bk_st_writer *w, const char *key, const char *value);
void bk_st_writer_write(bk_st_writer *w, const char *path);
void bk_st_writer_free(bk_st_writer *w);

#endif
