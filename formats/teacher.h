/* teacher.h - the 'teacher' field bk-teach appends to a record: the teacher's
 * distribution at each of the record's n response positions (the teacher-sequence
 * positions t_prompt_len-1 .. t_prompt_len+n-2, which predict resp[0..n-1]).
 *
 *   teacher: {k: K, temperature: T, n: n, v: V,
 *             ids:  bin, int32 little-endian [n,K]   (absent when K = 0)
 *             logp: bin, float32 little-endian [n,K] (K = 0: [n,V], the full
 *                   log_softmax(logits / T))
 *             rest: bin, float32 little-endian [n]   (absent when K = 0)}
 *
 * logp are normalised over the full vocabulary; rest = the probability of all ids
 * not listed.  Not the loss (gpu/host/loss.h consumes these arrays). */
#ifndef BK_TEACHER_H
#define BK_TEACHER_H

#include "formats/stream.h"

#include <stdint.h>

typedef struct {
	int k;             /* K ids per position; 0 = full distribution */
	float temperature; /* the KL temperature the log-probs are at */
	int n;             /* response positions */
	int v;             /* vocabulary size */
	int32_t *ids;      /* [n,K] (NULL when K = 0) */
	float *logp;       /* [n,K] or [n,V] */
	float *rest;       /* [n] (NULL when K = 0) */
	size_t cap_ids, cap_logp, cap_rest; /* owned storage, reused across records */
} bk_teacher;

/* Packs the field's value (the map) with pk; call after bk_rec_key(w, "teacher"). */
void bk_teacher_pack(msgpack_packer *pk, const bk_teacher *t);
/* Reads rec's 'teacher' into t (arrays copied into t's own storage).  Returns 0 when
 * the record has no teacher field; dies naming the record and key when it is
 * malformed (wrong types, a bin size that disagrees with the shape, ids out of
 * [0, V), rest outside [0, 1] beyond rounding). */
int bk_teacher_read(const bk_reader *r, const msgpack_object *rec, bk_teacher *t);
void bk_teacher_free(bk_teacher *t);

#endif
