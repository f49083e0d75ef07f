/* shard.h - sharded teacher stages: which records shard i of N owns (by record id, so
 * shards are stable under re-runs and reordering), and the merge of shard streams back
 * into the one stream the unsharded stage writes.
 * Not a scheduler: make, Slurm or the user runs the shards (pipelines/bake.mk). */
#ifndef BK_SHARD_H
#define BK_SHARD_H

#include "formats/stream.h"

typedef struct {
	int i, n; /* shard i of n; n = 0: not sharded */
} bk_shard;

/* "I/N" with 0 <= I < N; die_usage naming flag otherwise. */
bk_shard bk_shard_parse(const char *flag, const char *spec);
/* Does shard s own the current record?  By its 'id' (bk-tokenize's hex hash; any other
 * string is hashed): id mod N == i.  Dies naming the record when it has no id. */
int bk_shard_owns(const bk_shard *s, const bk_reader *in, const msgpack_object *rec);
/* "I/N" into buf (for the stream header's provenance). */
const char *bk_shard_str(const bk_shard *s, char *buf, size_t n);

/* Merges the streams at paths[0..n) (shards 0..N-1 of one stage, each once, as their
 * headers say) into out, in the order of the unsharded stage, given ref: the stream the
 * sharded stages read.  The order: when ref's records carry 'traj' or 'epoch' (a
 * stream of responses, bk-teach's input), one output record per ref record, the shard
 * record with the same (id, traj, epoch); otherwise (prompts, bk-gen's input) for each
 * epoch in increasing order, for each ref record, the shard records with its id in
 * their shard's order.  The header's provenance is the shards' (equal apart from their
 * 'shard' keys, which go) plus an entry for this tool.  Dies naming the file and record
 * on a missing or surplus shard, a record no shard has, or a shard record not used. */
void bk_shard_merge(const char *ref, const char *const *paths, int n, const char *out);

#endif
