/* msgjson.h - msgpack object <-> jansson JSON value, for bk-dump and tests.
 * bin becomes {"$bin": "<base64>"} and back; map keys must be strings.  Not a
 * general converter: ext types and non-string keys are refused. */
#ifndef BK_MSGJSON_H
#define BK_MSGJSON_H

#include <jansson.h>
#include <msgpack.h>

/* Returns a new JSON value, or NULL with *why set (static text) when the object has
 * no JSON form (invalid UTF-8 string, non-string key, ext type). */
json_t *bk_msg_to_json(const msgpack_object *o, const char **why);
/* Packs a JSON value; returns 0 on success, -1 with *why set. */
int bk_json_to_msg(msgpack_packer *pk, const json_t *j, const char **why);

/* A jansson parse error as message text: "line L: column C: TEXT", TEXT alone when the
 * error has no position (a file that could not be opened: jansson says line -1), and
 * without jansson's flag names (JSON_ALLOW_NUL), which mean nothing to a user.
 * bk_json_error_text: TEXT alone, for callers that count lines themselves.  The text
 * lives in a per-thread buffer until the next call (for the message being made). */
const char *bk_json_error(const json_error_t *e);
const char *bk_json_error_text(const json_error_t *e);

#endif
