#!/usr/bin/env bash
# Hub model ids (formats/hub.c) against tests/hubserver.py, a hub and a CDN on 127.0.0.1:
# the cache layout huggingface_hub writes (refs, blobs named by etag, snapshot links),
# offline and no-network use of it, a cache laid out by hand as huggingface_hub lays it
# out, gated/private/unknown repos, HF_TOKEN and the token file, Authorization not sent
# to the CDN, a corrupted blob refused, a partial download resumed, the lock, disk full.
. "$(dirname "$0")/lib.sh"
M="$MODELS/stories260K"
set -o pipefail
command -v python3 >/dev/null || { echo "not ok - python3 is needed"; exit 1; }

mkdir -p root/models/tiny/stories260K root/models/tiny/gated root/models/tiny/private \
	root/models/tiny/corrupt root/models/tiny/cut root/models/tiny/nosafe root/models/tiny/expired \
	root/models/tiny/rangefail
mkdir -p root/models/Qwen/Qwen3-0.6B
for r in tiny/stories260K tiny/gated tiny/private tiny/corrupt tiny/cut tiny/expired tiny/rangefail Qwen/Qwen3-0.6B; do
	cp "$M"/* root/models/$r/
done
cp "$M"/config.json "$M"/tokenizer.model root/models/tiny/nosafe/
echo "dummy" >root/models/tiny/nosafe/pytorch_model.bin
echo good-token >root/models/tiny/gated/.gated
echo good-token >root/models/tiny/private/.private
echo model.safetensors >root/models/tiny/corrupt/.corrupt
echo 4096 >root/models/tiny/cut/.cut
touch root/models/tiny/expired/.expired
echo 4096 >root/models/tiny/rangefail/.cut
touch root/models/tiny/rangefail/.rangefail
python3 "$ROOT/tests/hubserver.py" --root root --port-file port 2>server.err &
SERVER=$!
trap 'kill $SERVER 2>/dev/null; wait $SERVER 2>/dev/null; rm -rf "$TEST_TMP"' EXIT
for _ in $(seq 100); do [ -s port ] && break; sleep 0.1; done
read -r HUBPORT CDNPORT <port || { echo "not ok - the hub server did not start"; cat server.err; exit 1; }
export HF_ENDPOINT="http://127.0.0.1:$HUBPORT" HF_HUB_CACHE="$TEST_TMP/hub" HF_HOME="$TEST_TMP/hfhome"
unset HF_TOKEN HF_HUB_OFFLINE HF_TOKEN_PATH HUGGINGFACE_HUB_CACHE TRANSFORMERS_OFFLINE HF_DATASETS_OFFLINE
# libcurl honours proxy variables, as huggingface_hub does: never for the loopback hub
unset http_proxy https_proxy HTTP_PROXY HTTPS_PROXY ALL_PROXY all_proxy
export NO_PROXY=127.0.0.1 no_proxy=127.0.0.1
DEAD="http://127.0.0.1:1" # nothing listens there
C=hub/models--tiny--stories260K
tok() { bk-tokenize --model "$1" --prompt "Once upon a time" | bk-dump | jq -c .s_prompt; }
git_sha1() { python3 -c 'import hashlib,sys; d=open(sys.argv[1],"rb").read(); print(hashlib.sha1(b"blob %d\0" % len(d) + d).hexdigest())' "$1"; }

test_expect_success 'a hub id downloads into the HF cache layout and tokenizes as the local model' '
	BK_PROGRESS=1 tok tiny/stories260K >ids 2>err &&
	test "$(cat ids)" = "$(tok "$M")" &&
	grep -q "downloading tiny/stories260K model.safetensors: 1020.5 kB of 1020.5 kB, .*/s" err &&
	commit=$(cat $C/refs/main) && test ${#commit} -eq 40 && test $(wc -c <$C/refs/main) -eq 40 &&
	for f in config.json generation_config.json tokenizer.model tokenizer_config.json model.safetensors; do
		link=$(readlink $C/snapshots/$commit/$f) &&
		case $link in ../../blobs/*) ;; *) echo "$f -> $link"; exit 1 ;; esac &&
		cmp $C/snapshots/$commit/$f "$M/$f" || exit 1
	done &&
	test "$(readlink $C/snapshots/$commit/model.safetensors)" = "../../blobs/$(sha256sum <"$M"/model.safetensors | cut -c1-64)" &&
	test "$(readlink $C/snapshots/$commit/config.json)" = "../../blobs/$(git_sha1 "$M"/config.json)" &&
	test -z "$(find hub -name "*.incomplete")" &&
	test -f hub/.locks/models--tiny--stories260K/$(git_sha1 "$M"/config.json).lock &&
	! grep "^cdn.*auth=1" root/requests.log
'

test_expect_success 'HF_HUB_OFFLINE=1: the cache only, no request; no network: the cache too' '
	n=$(wc -l <root/requests.log) &&
	HF_HUB_OFFLINE=1 tok tiny/stories260K >off &&
	test_cmp ids off && test $(wc -l <root/requests.log) -eq $n &&
	HF_ENDPOINT=$DEAD tok tiny/stories260K >nonet 2>e && test_cmp ids nonet &&
	grep -q "warning: the hub $DEAD cannot be reached (.*); model tiny/stories260K: the cached snapshot [0-9a-f]\{40\}" e &&
	HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model tiny/notcached --prompt x 2>e &&
	grep -q "tiny/notcached (revision .main.) is not in the cache .*HF_HUB_OFFLINE" e &&
	HF_ENDPOINT=$DEAD test_must_fail bk-tokenize --model tiny/notcached --prompt x 2>e &&
	grep -q "cannot be reached" e
'

test_expect_success 'TRANSFORMERS_OFFLINE=1 is offline too, as huggingface_hub reads it (HF_HUB_OFFLINE wins when set)' '
	n=$(wc -l <root/requests.log) &&
	TRANSFORMERS_OFFLINE=1 tok tiny/stories260K >off2 &&
	test_cmp ids off2 && test $(wc -l <root/requests.log) -eq $n &&
	TRANSFORMERS_OFFLINE=yes test_must_fail bk-tokenize --model tiny/notcached --prompt x 2>e &&
	test $(grep -c "" e) -eq 1 && grep -q "not in the cache .*TRANSFORMERS_OFFLINE is set" e &&
	HF_HUB_OFFLINE=0 TRANSFORMERS_OFFLINE=1 tok tiny/stories260K >on && test_cmp ids on &&
	test $(wc -l <root/requests.log) -gt $n &&
	n=$(wc -l <root/requests.log) &&
	HF_DATASETS_OFFLINE=1 tok tiny/stories260K >on2 && test_cmp ids on2 &&
	test $(wc -l <root/requests.log) -gt $n
'

# A download host that sends more than the hub announced (X-Linked-Size): an endless
# chunked stream, and a Content-Length over the size.  The transfer must stop there.
# Repos named listed*: the listing gives the size (1000); listedover's HEAD announces
# 5000 (refused before any request to the host), listednosize's none (the listing's
# size caps the stream).  Every request is logged to PORTFILE.log.
cat >oversend.py <<'PY'
import hashlib, json, sys, threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
SIZE, COMMIT, ETAG = 1000, "c" * 40, hashlib.sha256(b"x").hexdigest()
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    def log_message(self, *a): pass
    def do_HEAD(self): self.route()
    def do_GET(self): self.route()
    def route(self):
        with open(sys.argv[1] + ".log", "a") as f:
            f.write("%s %s\n" % (self.command, self.path))
        p = self.path.split("?")[0].split("/")
        if p[1] == "api":  # /api/datasets/org/NAME/revision/main
            sib = {"rfilename": "train.parquet"}
            if p[4].startswith("listed"):
                sib["size"] = SIZE
            body = json.dumps({"sha": COMMIT, "siblings": [sib]}).encode()
            self.send_response(200); self.send_header("Content-Length", str(len(body))); self.end_headers()
            return self.wfile.write(body)
        if p[1] == "datasets":  # HEAD /datasets/org/NAME/resolve/main/train.parquet
            self.send_response(302)
            self.send_header("Location", "http://127.0.0.1:%d/cdn/%s" % (self.server.server_address[1], p[3]))
            h = [("X-Repo-Commit", COMMIT), ("X-Linked-Etag", '"%s"' % ETAG), ("ETag", '"%s"' % ("e" * 40))]
            if p[3] != "listednosize":
                h += [("X-Linked-Size", str(5 * SIZE if p[3] == "listedover" else SIZE)), ("Content-Length", "0")]
            for k, v in h:
                self.send_header(k, v)
            return self.end_headers()
        chunk = b"\0" * 65536
        self.send_response(200)
        if p[2] != "biglen":
            self.send_header("Transfer-Encoding", "chunked")
        else:
            self.send_header("Content-Length", str(1 << 30))
        self.end_headers()
        try:
            while True:
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk) if p[2] != "biglen" else chunk)
        except Exception:
            pass
srv = ThreadingHTTPServer(("127.0.0.1", 0), H)
srv.daemon_threads = True
open(sys.argv[1] + ".tmp", "w").write(str(srv.server_address[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
srv.serve_forever()
PY

test_expect_success 'a host that sends more than the announced size is cut off there: one line, partial file removed' '
	python3 oversend.py evil.port 2>evil.err & EVIL=$! &&
	for _ in $(seq 100); do [ -s evil.port ] && break; sleep 0.1; done &&
	for r in endless biglen; do
		# (a build that does not stop fails on the file size limit, not the disk)
		(ulimit -f 10240; HF_ENDPOINT=http://127.0.0.1:$(cat evil.port) HF_HUB_CACHE=$TEST_TMP/evil \
			timeout 60 bk-tokenize --model "$M" org/$r >/dev/null 2>e); rc=$?
		test $rc -eq 1 && test $(grep -c "" e) -eq 1 &&
		grep -q "org/$r train.parquet: the download host 127.0.0.1:$(cat evil.port) sent more than the 1000 bytes the hub announced" e &&
		test -z "$(find evil -name "*.incomplete")" || { cat e; kill $EVIL; exit 1; }
	done
	kill $EVIL
'

test_expect_success 'the listing.s size caps a download: more announced is refused before it starts; a stream is cut there' '
	python3 oversend.py listed.port 2>listed.err & EVIL=$! &&
	for _ in $(seq 100); do [ -s listed.port ] && break; sleep 0.1; done &&
	E=http://127.0.0.1:$(cat listed.port) &&
	(ulimit -f 10240; HF_ENDPOINT=$E HF_HUB_CACHE=$TEST_TMP/evil2 \
		timeout 60 bk-tokenize --model "$M" org/listedover >/dev/null 2>e); rc=$? &&
	test $rc -eq 1 && test $(grep -c "" e) -eq 1 &&
	grep -q "org/listedover train.parquet: the hub announces 5000 bytes, over the 1000 its file listing gives: refused before downloading" e &&
	! grep -q "GET /cdn/listedover" listed.port.log && test -z "$(find evil2 -name "*.incomplete")" &&
	(ulimit -f 10240; HF_ENDPOINT=$E HF_HUB_CACHE=$TEST_TMP/evil2 \
		timeout 60 bk-tokenize --model "$M" org/listednosize >/dev/null 2>e); rc=$? &&
	test $rc -eq 1 && test $(grep -c "" e) -eq 1 &&
	grep -q "org/listednosize train.parquet: the download host 127.0.0.1:$(cat listed.port) sent more than the 1000 bytes the hub announced" e &&
	grep -q "GET /cdn/listednosize" listed.port.log && test -z "$(find evil2 -name "*.incomplete")" || { cat e; kill $EVIL; exit 1; }
	kill $EVIL
'

test_expect_success 'the tool.s basic.yaml as it is (its hub id served by the stand-in): bk-bake --config' '
	bk-bake --config "$DATA/bake/tool/basic.yaml" --output_dir out-basic >sum 2>notes &&
	grep -q "^model  *Qwen/Qwen3-0.6B ($TEST_TMP/hub/models--Qwen--Qwen3-0.6B/snapshots/[0-9a-f]*)" sum &&
	grep -q "^optimizer steps *15 " sum &&
	jq -e ".base_model_name_or_path == \"Qwen/Qwen3-0.6B\"" out-basic/final_model/adapter_config.json &&
	grep -q "^base_model: Qwen/Qwen3-0.6B" out-basic/final_model/README.md &&
	cmp out-basic/final_model/tokenizer.model "$M"/tokenizer.model &&
	test $(grep -c "GET /api/models/Qwen/Qwen3-0.6B/revision/main" root/requests.log) -eq 1
'

test_expect_success 'a cache laid out by hand as huggingface_hub writes it is read offline' '
	R=hand/models--org--tiny && commit=0123456789abcdef0123456789abcdef01234567 &&
	mkdir -p $R/refs $R/blobs $R/snapshots/$commit &&
	printf %s $commit >$R/refs/main &&
	for f in config.json tokenizer_config.json generation_config.json; do
		e=$(git_sha1 "$M/$f") && cp "$M/$f" $R/blobs/$e && ln -s ../../blobs/$e $R/snapshots/$commit/$f || exit 1
	done &&
	for f in tokenizer.model model.safetensors; do
		e=$(sha256sum <"$M/$f" | cut -c1-64) && cp "$M/$f" $R/blobs/$e && ln -s ../../blobs/$e $R/snapshots/$commit/$f || exit 1
	done &&
	HF_HUB_CACHE=$TEST_TMP/hand HF_HUB_OFFLINE=1 tok org/tiny >hand.ids && test_cmp ids hand.ids &&
	bk-tokenize --model "$M" --system "A dragon." "$DATA/pipe/stories.txt" 2>/dev/null |
		bk-gen --device cpu --model "$M" --max-new-tokens 8 --seed 1 | bk-dump | jq -c .resp >local.gen &&
	bk-tokenize --model "$M" --system "A dragon." "$DATA/pipe/stories.txt" 2>/dev/null |
		HF_HUB_CACHE=$TEST_TMP/hand HF_HUB_OFFLINE=1 bk-gen --device cpu --model org/tiny --max-new-tokens 8 --seed 1 |
		bk-dump | jq -c .resp >hand.gen &&
	test -s hand.gen && test_cmp local.gen hand.gen &&
	HF_HUB_CACHE=$TEST_TMP/hand HF_HUB_OFFLINE=1 XDG_CACHE_HOME=$TEST_TMP/x HF_HOME=$TEST_TMP/y \
		bk-tokenize --model org/tiny --prompt x >/dev/null
'

test_expect_success 'the cache root: HF_HUB_CACHE, else HF_HOME/hub, else XDG_CACHE_HOME/huggingface/hub' '
	mkdir -p y && cp -r hand/models--org--tiny y/ &&
	mkdir -p h/hub x/huggingface/hub && cp -r hand/models--org--tiny h/hub/ && cp -r hand/models--org--tiny x/huggingface/hub/ &&
	(unset HF_HUB_CACHE; HF_HOME=$TEST_TMP/h HF_HUB_OFFLINE=1 bk-tokenize --model org/tiny --prompt x >/dev/null) &&
	(unset HF_HUB_CACHE HF_HOME; XDG_CACHE_HOME=$TEST_TMP/x HF_HUB_OFFLINE=1 bk-tokenize --model org/tiny --prompt x >/dev/null) &&
	(unset HF_HUB_CACHE HF_HOME XDG_CACHE_HOME; HOME=$TEST_TMP/nohome HF_HUB_OFFLINE=1 test_must_fail bk-tokenize --model org/tiny --prompt x 2>e) &&
	grep -q "nohome/.cache/huggingface/hub/models--org--tiny" e
'

test_expect_success 'gated: 401 and 403 name the licence page and HF_TOKEN; a good token (variable or file) downloads' '
	test_must_fail bk-tokenize --model tiny/gated --prompt x 2>e &&
	grep -q "model tiny/gated is gated (HTTP 401.*accept its licence at $HF_ENDPOINT/tiny/gated.*HF_TOKEN" e &&
	HF_TOKEN=bad-token test_must_fail bk-tokenize --model tiny/gated --prompt x 2>e &&
	grep -q "is gated (HTTP 403" e &&
	HF_TOKEN=good-token tok tiny/gated >g && test_cmp ids g &&
	grep -q "^hub HEAD /tiny/gated/resolve/.*/model.safetensors auth=1" root/requests.log &&
	grep -q "^cdn GET /blob/models/tiny/gated/model.safetensors.* auth=0" root/requests.log &&
	mkdir -p hfhome && echo good-token >hfhome/token &&
	rm -rf hub/models--tiny--gated && tok tiny/gated >g2 && test_cmp ids g2 && rm hfhome/token
'

test_expect_success 'private (401 RepoNotFound) and unknown repos (404): one line each' '
	test_must_fail bk-tokenize --model tiny/private --prompt x 2>e &&
	grep -q "tiny/private: not found, or private or gated (HTTP 401): no HF_TOKEN given" e &&
	HF_TOKEN=other test_must_fail bk-tokenize --model tiny/nothere --prompt x 2>e &&
	grep -q "model tiny/nothere not found on the hub (HTTP 404" e &&
	test_must_fail bk-tokenize --model tiny/nosafe --prompt x 2>e &&
	grep -q "no model.safetensors.*never downloaded" e &&
	! grep -q "pytorch_model.bin" root/requests.log &&
	test_must_fail bk-tokenize --model no/such/path --prompt x 2>e &&
	grep -q "is not a model directory" e
'

test_expect_success 'a blob whose sha256 is not its etag is refused: no blob, no snapshot link' '
	test_must_fail bk-tokenize --model tiny/corrupt --prompt x 2>e &&
	grep -q "model.safetensors: the downloaded bytes have sha256 .* refused" e &&
	test -z "$(find hub/models--tiny--corrupt/blobs -size +100k)" &&
	test -z "$(find hub/models--tiny--corrupt/snapshots -name model.safetensors)"
'

test_expect_success 'the download host refusing (an expired signed URL): one line, not a gated repo' '
	test_must_fail bk-tokenize --model tiny/expired --prompt x 2>e &&
	grep -q "tiny/expired tokenizer.model: the download host answered HTTP 403" e
'

test_expect_success 'a partial download is kept and resumed with a Range request' '
	test_must_fail bk-tokenize --model tiny/cut --prompt x 2>e &&
	grep -q "download failed after 4096 bytes.*resumed by the next run" e &&
	part=$(ls hub/models--tiny--cut/blobs/*.incomplete | head -1) && test $(wc -c <"$part") -eq 4096 &&
	tok tiny/cut >c && test_cmp ids c &&
	grep -q "^cdn GET /blob/models/tiny/cut/tokenizer.model.* range=bytes=4096-" root/requests.log &&
	test -z "$(find hub/models--tiny--cut -name "*.incomplete")"
'

test_expect_success 'an error answer to a resumed download leaves the partial file as it was, naming the URL and status' '
	test_must_fail bk-tokenize --model tiny/rangefail --prompt x 2>e &&
	grep -q "download failed after 4096 bytes" e &&
	part=$(ls hub/models--tiny--rangefail/blobs/*.incomplete | head -1) && test $(wc -c <"$part") -eq 4096 &&
	test_must_fail bk-tokenize --model tiny/rangefail --prompt x 2>e && test $(grep -c "" e) -eq 1 &&
	grep -q "tiny/rangefail tokenizer.model: the download host answered HTTP 503 for http://127.0.0.1:$CDNPORT/blob/models/tiny/rangefail/tokenizer.model; the partial file keeps its 4096 bytes" e &&
	! grep -q "sig=" e &&
	test $(wc -c <"$part") -eq 4096 && head -c 4096 "$M"/tokenizer.model | cmp - "$part" &&
	tok tiny/rangefail >rf && test_cmp ids rf &&
	test $(grep -c "^cdn GET /blob/models/tiny/rangefail/tokenizer.model.* range=bytes=4096-" root/requests.log) -eq 2 &&
	test -z "$(find hub/models--tiny--rangefail -name "*.incomplete")"
'

test_expect_success 'a download waits for the lock of another process on the same blob' '
	rm -rf hub/models--tiny--stories260K &&
	e=$(sha256sum <"$M"/model.safetensors | cut -c1-64) &&
	mkdir -p hub/.locks/models--tiny--stories260K && rm -f locked e &&
	# the other process holds the lock until this one says it waits (30 s at most)
	( flock 8 && touch locked &&
	  for _ in $(seq 300); do grep -q "waiting for another download" e 2>/dev/null && break; sleep 0.1; done
	) 8>hub/.locks/models--tiny--stories260K/$e.lock &
	holder=$! &&
	for _ in $(seq 100); do test -e locked && break; sleep 0.05; done &&
	tok tiny/stories260K >l 2>e && wait $holder &&
	test_cmp ids l && grep -q "waiting for another download of model.safetensors" e
'

test_expect_success 'disk full: one line naming the file' '
	rm -rf hub/models--tiny--stories260K &&
	e=$(sha256sum <"$M"/model.safetensors | cut -c1-64) &&
	mkdir -p hub/models--tiny--stories260K/blobs &&
	ln -s /dev/full hub/models--tiny--stories260K/blobs/$e.incomplete &&
	test_must_fail bk-tokenize --model tiny/stories260K --prompt x 2>e &&
	grep -q "blobs/$e.incomplete: disk full" e
'

test_done
