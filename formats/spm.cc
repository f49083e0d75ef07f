// spm.cc - the C shim over sentencepiece::SentencePieceProcessor (see spm.h).
// Holds two processors per model: the model as shipped, and a "bare" copy that
// encodes as HF's fast tokenizer does one segment (see bare_proto below).
#include "formats/spm.h"

#include <sentencepiece_processor.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

extern "C" {
#include "common/files.h"
#include "common/hash.h"
// common/diag.h is C11 (_Noreturn); the two functions used here:
[[noreturn]] void die(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void *xmalloc(size_t n);
}

unsigned long bk_spm_encode_calls;

struct bk_spm {
	sentencepiece::SentencePieceProcessor sp;   // the model as shipped
	sentencepiece::SentencePieceProcessor bare; // add_dummy_prefix = remove_extra_whitespaces = false
	std::string path;
	uint64_t hash;
};

// Reads one protobuf varint at *p (< end); false when truncated.
static bool read_varint(const unsigned char **p, const unsigned char *end, uint64_t *v)
{
	uint64_t r = 0;
	for (int shift = 0; *p < end && shift < 64; shift += 7) {
		unsigned char b = *(*p)++;
		r |= (uint64_t)(b & 0x7f) << shift;
		if (!(b & 0x80)) {
			*v = r;
			return true;
		}
	}
	return false;
}

static void put_varint(std::string *out, uint64_t v)
{
	for (; v >= 0x80; v >>= 7)
		out->push_back((char)(0x80 | (v & 0x7f)));
	out->push_back((char)v);
}

// Calls fn(field, start, end) for each field of the protobuf message [p, end)
// (start: the field's key; end: past its value); false when malformed.
template <typename F>
static bool walk_fields(const unsigned char *p, const unsigned char *end, F fn)
{
	while (p < end) {
		const unsigned char *start = p;
		uint64_t key, len;
		if (!read_varint(&p, end, &key))
			return false;
		switch (key & 7) {
		case 0:
			if (!read_varint(&p, end, &len))
				return false;
			break;
		case 1:
			p += 8;
			break;
		case 2:
			if (!read_varint(&p, end, &len) || len > (uint64_t)(end - p))
				return false;
			p += len;
			break;
		case 5:
			p += 4;
			break;
		default:
			return false;
		}
		if (p > end)
			return false;
		fn(key >> 3, start, p);
	}
	return true;
}

// The serialized ModelProto rewritten for HF-style segment encoding:
// - NormalizerSpec (field 3) gets add_dummy_prefix (3) and remove_extra_whitespaces
//   (4) set to false, by appending a second field 3 (protobuf merges repeated
//   embedded messages, so every other normalizer setting is kept);
// - each NORMAL piece (field 1; type 3 absent or 1) gets score (2) = -index: HF's
//   converter ranks BPE merges by piece id, sentencepiece by score, and the two
//   differ where a model gives whitespace-only pieces a score of -1e9 (Llama 2);
// - the self-test samples (4) are dropped (they hold the old normalizer's output).
// A walk over the wire format only: libsentencepiece-dev ships no ModelProto header.
static bool bare_proto(const std::string &in, std::string *out)
{
	const unsigned char *p = (const unsigned char *)in.data(), *end = p + in.size();
	uint64_t index = 0;
	bool ok = true;
	out->clear();
	ok = walk_fields(p, end, [&](uint64_t field, const unsigned char *start, const unsigned char *fend) {
		if (field == 4)
			return;
		if (field != 1) {
			out->append((const char *)start, (size_t)(fend - start));
			return;
		}
		// the piece message: value of [start, fend) after its key and length
		if ((*start & 7) != 2) {
			ok = false;
			return;
		}
		const unsigned char *q = start;
		uint64_t key, len;
		read_varint(&q, fend, &key);
		read_varint(&q, fend, &len);
		std::string piece;
		uint64_t type = 1;
		bool pok = walk_fields(q, fend, [&](uint64_t f, const unsigned char *s0, const unsigned char *s1) {
			if (f == 3) {
				const unsigned char *r = s0;
				uint64_t k = 0, v = 1;
				read_varint(&r, s1, &k);
				read_varint(&r, s1, &v);
				type = v;
			}
			if (f != 2)
				piece.append((const char *)s0, (size_t)(s1 - s0));
		});
		if (!pok) {
			ok = false;
			return;
		}
		if (type == 1) {
			float score = -(float)index;
			char b[4];
			memcpy(b, &score, 4); // protobuf fixed32 is little-endian, as is x86-64 / aarch64
			piece.push_back(0x15);
			piece.append(b, 4);
		}
		index++;
		out->push_back(0x0a);
		put_varint(out, piece.size());
		out->append(piece);
	}) && ok;
	static const char override_spec[] = {0x1a, 0x04, 0x18, 0x00, 0x20, 0x00};
	out->append(override_spec, sizeof override_spec);
	return ok;
}

bk_spm *bk_spm_load(const char *path)
{
	size_t len;
	char *data = bk_try_read_file(path, &len);
	if (!data)
		die("%s: %s", path, strerror(errno));
	bk_spm *s = new bk_spm;
	std::string bytes(data, len);
	free(data);
	std::string bare;
	if (!s->sp.LoadFromSerializedProto(bytes).ok() || s->sp.GetPieceSize() <= 0)
		die("%s: not a sentencepiece model", path);
	if (!bare_proto(s->sp.serialized_model_proto(), &bare) ||
	    !s->bare.LoadFromSerializedProto(bare).ok() ||
	    s->bare.GetPieceSize() != s->sp.GetPieceSize())
		die("%s: sentencepiece model cannot be loaded without its dummy prefix", path);
	s->path = path;
	s->hash = bk_hash(bytes.data(), bytes.size(), 0);
	return s;
}

void bk_spm_free(bk_spm *s)
{
	delete s;
}

static void encode_with(const sentencepiece::SentencePieceProcessor &sp, const bk_spm *s,
			const char *text, size_t len, int32_t **ids, size_t *n)
{
	std::vector<int> v;
	bk_spm_encode_calls++;
	auto st = sp.Encode(absl::string_view(text, len), &v);
	if (!st.ok())
		die("%s: cannot encode text: %s", s->path.c_str(), st.ToString().c_str());
	*n = v.size();
	*ids = (int32_t *)xmalloc((v.size() ? v.size() : 1) * sizeof(int32_t));
	for (size_t i = 0; i < v.size(); i++)
		(*ids)[i] = v[i];
}

void bk_spm_encode(const bk_spm *s, const char *text, size_t len, int32_t **ids, size_t *n)
{
	encode_with(s->sp, s, text, len, ids, n);
}

void bk_spm_encode_bare(const bk_spm *s, const char *text, size_t len, int32_t **ids, size_t *n)
{
	encode_with(s->bare, s, text, len, ids, n);
}

char *bk_spm_decode(const bk_spm *s, const int32_t *ids, size_t n)
{
	std::vector<int> v(ids, ids + n);
	int size = s->sp.GetPieceSize();
	for (size_t i = 0; i < n; i++)
		if (ids[i] < 0 || ids[i] >= size)
			die("%s: cannot decode id %d: vocabulary has %d pieces", s->path.c_str(),
			    (int)ids[i], size);
	std::string text;
	auto st = s->sp.Decode(v, &text);
	if (!st.ok())
		die("%s: cannot decode ids: %s", s->path.c_str(), st.ToString().c_str());
	char *r = (char *)xmalloc(text.size() + 1);
	memcpy(r, text.data(), text.size());
	r[text.size()] = '\0';
	return r;
}

int32_t bk_spm_piece_to_id(const bk_spm *s, const char *piece)
{
	int id = s->sp.PieceToId(piece);
	if (id < 0 || (s->sp.IsUnknown(id) && s->sp.IdToPiece(id) != piece))
		return -1;
	return id;
}

const char *bk_spm_id_to_piece(const bk_spm *s, int32_t id)
{
	if (id < 0 || id >= s->sp.GetPieceSize())
		return NULL;
	return s->sp.IdToPiece(id).c_str();
}

int32_t bk_spm_vocab_size(const bk_spm *s) { return s->sp.GetPieceSize(); }
int32_t bk_spm_bos(const bk_spm *s) { return s->sp.bos_id(); }
int32_t bk_spm_eos(const bk_spm *s) { return s->sp.eos_id(); }
int32_t bk_spm_unk(const bk_spm *s) { return s->sp.unk_id(); }
int32_t bk_spm_pad(const bk_spm *s) { return s->sp.pad_id(); }
uint64_t bk_spm_file_hash(const bk_spm *s) { return s->hash; }
const char *bk_spm_path(const bk_spm *s) { return s->path.c_str(); }
