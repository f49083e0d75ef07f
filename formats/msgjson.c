/* msgjson.c - see msgjson.h. */
#include "msgjson.h"
#include "common/diag.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

static const char b64[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

static char *b64_encode(const unsigned char *p, size_t n)
{
	char *out = xmalloc(4 * ((n + 2) / 3) + 1), *o = out;
	for (size_t i = 0; i < n; i += 3) {
		unsigned v = (unsigned)p[i] << 16;
		if (i + 1 < n)
			v |= (unsigned)p[i + 1] << 8;
		if (i + 2 < n)
			v |= p[i + 2];
		*o++ = b64[(v >> 18) & 63];
		*o++ = b64[(v >> 12) & 63];
		*o++ = i + 1 < n ? b64[(v >> 6) & 63] : '=';
		*o++ = i + 2 < n ? b64[v & 63] : '=';
	}
	*o = 0;
	return out;
}

static int b64_val(char c)
{
	const char *p = c ? strchr(b64, c) : NULL;
	return p ? (int)(p - b64) : -1;
}

/* returns decoded length or -1 */
static long b64_decode(const char *s, size_t n, unsigned char *out)
{
	if (n % 4)
		return -1;
	long len = 0;
	for (size_t i = 0; i < n; i += 4) {
		int v[4];
		for (int k = 0; k < 4; k++) {
			v[k] = s[i + k] == '=' ? 0 : b64_val(s[i + k]);
			if (v[k] < 0)
				return -1;
			if (s[i + k] == '=' && (i + 4 != n || k < 2))
				return -1;
		}
		unsigned x = (unsigned)v[0] << 18 | (unsigned)v[1] << 12 | (unsigned)v[2] << 6 | (unsigned)v[3];
		out[len++] = (unsigned char)(x >> 16);
		if (s[i + 2] != '=')
			out[len++] = (unsigned char)(x >> 8);
		if (s[i + 3] != '=')
			out[len++] = (unsigned char)x;
	}
	return len;
}

static int bk_obj_is_bin_key(const msgpack_object *k)
{
	return k->type == MSGPACK_OBJECT_STR && k->via.str.size == 4 &&
	       !memcmp(k->via.str.ptr, "$bin", 4);
}

json_t *bk_msg_to_json(const msgpack_object *o, const char **why)
{
	switch (o->type) {
	case MSGPACK_OBJECT_NIL:
		return json_null();
	case MSGPACK_OBJECT_BOOLEAN:
		return json_boolean(o->via.boolean);
	case MSGPACK_OBJECT_POSITIVE_INTEGER:
		if (o->via.u64 > (uint64_t)INT64_MAX) {
			*why = "integer too large for JSON";
			return NULL;
		}
		return json_integer((json_int_t)o->via.u64);
	case MSGPACK_OBJECT_NEGATIVE_INTEGER:
		return json_integer((json_int_t)o->via.i64);
	case MSGPACK_OBJECT_FLOAT32:
	case MSGPACK_OBJECT_FLOAT64: {
		json_t *r = json_real(o->via.f64);
		if (!r)
			*why = "NaN or infinity has no JSON form";
		return r;
	}
	case MSGPACK_OBJECT_STR: {
		json_t *s = json_stringn(o->via.str.ptr, o->via.str.size);
		if (!s)
			*why = "string is not valid UTF-8";
		return s;
	}
	case MSGPACK_OBJECT_BIN: {
		char *enc = b64_encode((const unsigned char *)o->via.bin.ptr, o->via.bin.size);
		json_t *j = json_pack("{s:s}", "$bin", enc);
		free(enc);
		return j;
	}
	case MSGPACK_OBJECT_ARRAY: {
		json_t *a = json_array();
		for (uint32_t i = 0; i < o->via.array.size; i++) {
			json_t *e = bk_msg_to_json(&o->via.array.ptr[i], why);
			if (!e) {
				json_decref(a);
				return NULL;
			}
			json_array_append_new(a, e);
		}
		return a;
	}
	case MSGPACK_OBJECT_MAP: {
		if (o->via.map.size == 1 && bk_obj_is_bin_key(&o->via.map.ptr[0].key)) {
			*why = "a map whose only key is '$bin' would read back as binary";
			return NULL;
		}
		json_t *m = json_object();
		for (uint32_t i = 0; i < o->via.map.size; i++) {
			const msgpack_object_kv *kv = &o->via.map.ptr[i];
			if (kv->key.type != MSGPACK_OBJECT_STR) {
				*why = "map key is not a string";
				json_decref(m);
				return NULL;
			}
			json_t *v = bk_msg_to_json(&kv->val, why);
			if (!v || json_object_setn_new(m, kv->key.via.str.ptr, kv->key.via.str.size,
						       v) != 0) {
				if (v)
					*why = "map key is not valid UTF-8";
				json_decref(m);
				return NULL;
			}
		}
		return m;
	}
	default:
		*why = "msgpack ext type has no JSON form";
		return NULL;
	}
}

int bk_json_to_msg(msgpack_packer *pk, const json_t *j, const char **why)
{
	switch (json_typeof(j)) {
	case JSON_NULL:
		return msgpack_pack_nil(pk), 0;
	case JSON_TRUE:
		return msgpack_pack_true(pk), 0;
	case JSON_FALSE:
		return msgpack_pack_false(pk), 0;
	case JSON_INTEGER:
		return msgpack_pack_int64(pk, json_integer_value(j)), 0;
	case JSON_REAL:
		return msgpack_pack_double(pk, json_real_value(j)), 0;
	case JSON_STRING:
		msgpack_pack_str(pk, json_string_length(j));
		msgpack_pack_str_body(pk, json_string_value(j), json_string_length(j));
		return 0;
	case JSON_ARRAY: {
		msgpack_pack_array(pk, json_array_size(j));
		size_t i;
		json_t *e;
		json_array_foreach(j, i, e) if (bk_json_to_msg(pk, e, why)) return -1;
		return 0;
	}
	case JSON_OBJECT: {
		json_t *bin = json_object_get(j, "$bin");
		if (bin && json_object_size(j) == 1) {
			if (!json_is_string(bin)) {
				*why = "'$bin' is not a base64 string";
				return -1;
			}
			size_t n = json_string_length(bin);
			unsigned char *buf = xmalloc(n / 4 * 3 + 3);
			long len = b64_decode(json_string_value(bin), n, buf);
			if (len < 0) {
				free(buf);
				*why = "'$bin' is not valid base64";
				return -1;
			}
			msgpack_pack_bin(pk, (size_t)len);
			msgpack_pack_bin_body(pk, buf, (size_t)len);
			free(buf);
			return 0;
		}
		msgpack_pack_map(pk, json_object_size(j));
		const char *k;
		size_t klen;
		json_t *v;
		json_t *obj = (json_t *)j; /* jansson's iterator API is not const */
		json_object_keylen_foreach(obj, k, klen, v)
		{
			msgpack_pack_str(pk, klen);
			msgpack_pack_str_body(pk, k, klen);
			if (bk_json_to_msg(pk, v, why))
				return -1;
		}
		return 0;
	}
	}
	*why = "unknown JSON type";
	return -1;
}

enum { JSON_MSG = JSON_ERROR_TEXT_LENGTH + 96 };

static const char *error_text(const json_error_t *e, char *buf, size_t n)
{
	static const char flag[] = " without JSON_ALLOW_NUL";
	const char *t = e->text, *f = strstr(t, flag);
	if (f)
		snprintf(buf, n, "%.*s (NUL characters cannot be read)%s", (int)(f - t), t,
			 f + sizeof flag - 1);
	else
		snprintf(buf, n, "%s", t);
	return buf;
}

const char *bk_json_error_text(const json_error_t *e)
{
	static _Thread_local char buf[JSON_MSG];
	return error_text(e, buf, sizeof buf);
}

const char *bk_json_error(const json_error_t *e)
{
	static _Thread_local char buf[JSON_MSG + 48];
	char t[JSON_MSG];
	error_text(e, t, sizeof t);
	if (e->line > 0 && e->column > 0)
		snprintf(buf, sizeof buf, "line %d: column %d: %s", e->line, e->column, t);
	else if (e->line > 0)
		snprintf(buf, sizeof buf, "line %d: %s", e->line, t);
	else
		snprintf(buf, sizeof buf, "%s", t);
	return buf;
}
