#!/usr/bin/env python3
"""hubserver.py - a stand-in for the Hugging Face hub on 127.0.0.1, for the hub tests.

Python standard library only.  Two HTTP servers on free ports: the hub (resolve/ and
api/ endpoints, as huggingface_hub uses them) and a "CDN" host that LFS files redirect
to.  Not the hub: only what a download client sees.

Repos are directories: ROOT/models/ORG/NAME/ and ROOT/datasets/ORG/NAME/, each file a
file of the repo at revision "main" (the commit is the sha1 of the repo's file names
and bytes).  Files ending in .safetensors, .model or .parquet are LFS: the hub answers
302 to the CDN with X-Linked-Etag (sha256), X-Linked-Size and X-Repo-Commit; other
files answer 200 with ETag = git's blob sha1.  Control files in a repo directory (not
repo files): .gated holds the one token that has accepted the licence (no token: 401
GatedRepo; another token: 403 GatedRepo); .private likewise, answered as the hub answers
a private repo (401 RepoNotFound); .corrupt names files whose bytes the CDN serves with
one byte changed; .cut holds N: the CDN's first answer for one of the repo's LFS
files ends after N bytes (a dropped connection; Range requests are honoured);
.expired: the CDN answers 403, as S3 does to an expired signed URL; .rangefail: the
CDN's first answer to a Range request for one of the repo's files is 503 with an error
page (a resume that meets a failing host).  A missing repo is
401 RepoNotFound (404 with a token); an unknown
revision 404 RevisionNotFound; a missing file 404 EntryNotFound with X-Repo-Commit.

The CDN refuses (400) any request that carries Authorization (a client must drop it
when it leaves the hub's host).
Every request is logged to ROOT/requests.log: "HOST METHOD PATH auth=0|1 range=R".
Writes "HUBPORT CDNPORT" to --port-file once both listen; stops on SIGTERM.

Usage: hubserver.py --root DIR --port-file FILE
"""
import argparse
import hashlib
import json
import os
import signal
import sys
import threading
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

LFS_EXT = (".safetensors", ".model", ".parquet")
CONTROL = (".gated", ".private", ".corrupt", ".cut", ".expired", ".rangefail")


class Hub:
    def __init__(self, root):
        self.root = root
        self.cut_done = set()
        self.rangefail_done = set()
        self.lock = threading.Lock()
        self.cdn_port = 0

    def log(self, line):
        with self.lock, open(os.path.join(self.root, "requests.log"), "a") as f:
            f.write(line + "\n")

    def repo_dir(self, kind, rid):
        d = os.path.join(self.root, kind, rid)
        return d if os.path.isdir(d) else None

    def files(self, d):
        out = []
        for base, dirs, names in os.walk(d):
            dirs.sort()
            for n in sorted(names):
                p = os.path.join(base, n)
                rel = os.path.relpath(p, d)
                if rel not in CONTROL:
                    out.append(rel)
        return sorted(out)

    def commit(self, d):
        h = hashlib.sha1()
        for rel in self.files(d):
            h.update(rel.encode() + b"\0")
            with open(os.path.join(d, rel), "rb") as f:
                h.update(f.read())
        return h.hexdigest()

    def control(self, d, name):
        p = os.path.join(d, name)
        if not os.path.exists(p):
            return None
        with open(p) as f:
            return f.read().strip()


def git_sha1(data):
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def make_handler(hub, is_cdn):
    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def send(self, code, headers=None, body=b""):
            self.send_response(code)
            for k, v in (headers or {}).items():
                self.send_header(k, v)
            if "Content-Length" not in (headers or {}):
                self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD" and body:
                self.wfile.write(body)

        def err(self, code, ecode, msg, extra=None):
            h = {"X-Error-Code": ecode, "X-Error-Message": msg}
            h.update(extra or {})
            self.send(code, h, json.dumps({"error": msg}).encode())

        def token(self):
            a = self.headers.get("Authorization", "")
            return a[7:] if a.startswith("Bearer ") else None

        def do_HEAD(self):
            self.route()

        def do_GET(self):
            self.route()

        def route(self):
            hub.log("%s %s %s auth=%d range=%s" % (
                "cdn" if is_cdn else "hub", self.command, self.path,
                1 if self.headers.get("Authorization") else 0,
                self.headers.get("Range", "-")))
            if is_cdn:
                return self.cdn()
            path = urllib.parse.urlsplit(self.path).path
            parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
            if parts[:1] == ["api"]:
                return self.api(parts)
            kind = "models"
            if parts[:1] == ["datasets"]:
                kind, parts = "datasets", parts[1:]
            if len(parts) >= 5 and parts[2] == "resolve":
                rid = parts[0] + "/" + parts[1]
                return self.resolve(kind, rid, parts[3], "/".join(parts[4:]))
            self.err(404, "NotFound", "no such endpoint")

        def access(self, kind, rid):
            """the repo dir, or None once an error is sent"""
            d = hub.repo_dir(kind, rid)
            tok = self.token()
            if d is None:
                if tok is None:
                    self.err(401, "RepoNotFound", "Repository Not Found for url")
                else:
                    self.err(404, "RepoNotFound", "Repository Not Found for url")
                return None
            priv = hub.control(d, ".private")
            if priv is not None and tok != priv:
                self.err(401, "RepoNotFound", "Repository Not Found for url")
                return None
            gated = hub.control(d, ".gated")
            if gated is not None and tok != gated:
                if tok is None:
                    self.err(401, "GatedRepo", "Access to model %s is restricted. You must "
                             "have access to it and be authenticated to access it." % rid)
                else:
                    self.err(403, "GatedRepo", "Access to model %s is restricted and you "
                             "are not in the authorized list." % rid)
                return None
            return d

        def api(self, parts):
            # /api/{models,datasets}/ORG/NAME/revision/REV
            if len(parts) >= 6 and parts[4] == "tree":
                return self.tree(parts)
            if len(parts) != 6 or parts[4] != "revision":
                return self.err(404, "NotFound", "bad api path")
            kind, rid, rev = parts[1], parts[2] + "/" + parts[3], parts[5]
            d = self.access(kind, rid)
            if d is None:
                return
            commit = hub.commit(d)
            if rev not in ("main", commit):
                return self.err(404, "RevisionNotFound", "Invalid rev id: " + rev)
            sib = []
            for rel in hub.files(d):
                sib.append({"rfilename": rel, "size": os.path.getsize(os.path.join(d, rel))})
            body = json.dumps({"id": rid, "sha": commit, "siblings": sib}).encode()
            self.send(200, {"Content-Type": "application/json"}, body)

        def tree(self, parts):
            # /api/{models,datasets}/ORG/NAME/tree/REV[/PATH]?recursive=true (newer
            # huggingface_hub lists a snapshot with it); one page, no Link header
            kind, rid, rev = parts[1], parts[2] + "/" + parts[3], parts[5]
            d = self.access(kind, rid)
            if d is None:
                return
            commit = hub.commit(d)
            if rev not in ("main", commit):
                return self.err(404, "RevisionNotFound", "Invalid rev id: " + rev)
            out, dirs = [], set()
            for rel in hub.files(d):
                with open(os.path.join(d, rel), "rb") as f:
                    data = f.read()
                for i in range(1, rel.count("/") + 1):
                    dirs.add("/".join(rel.split("/")[:i]))
                e = {"type": "file", "oid": git_sha1(data), "size": len(data), "path": rel}
                if rel.endswith(LFS_EXT):
                    e["lfs"] = {"oid": hashlib.sha256(data).hexdigest(), "size": len(data),
                                "pointerSize": 130}
                out.append(e)
            out += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": p}
                    for p in sorted(dirs)]
            self.send(200, {"Content-Type": "application/json"}, json.dumps(out).encode())

        def resolve(self, kind, rid, rev, rel):
            d = self.access(kind, rid)
            if d is None:
                return
            commit = hub.commit(d)
            if rev not in ("main", commit):
                return self.err(404, "RevisionNotFound", "Invalid rev id: " + rev)
            p = os.path.join(d, rel)
            if rel in CONTROL or not os.path.isfile(p):
                return self.err(404, "EntryNotFound", "Entry not found",
                                {"X-Repo-Commit": commit})
            with open(p, "rb") as f:
                data = f.read()
            if rel.endswith(LFS_EXT):
                sha = hashlib.sha256(data).hexdigest()
                loc = "http://127.0.0.1:%d/blob/%s/%s/%s?sig=x" % (
                    hub.cdn_port, kind, rid, urllib.parse.quote(rel))
                return self.send(302, {"Location": loc, "X-Repo-Commit": commit,
                                       "X-Linked-Etag": '"%s"' % sha,
                                       "X-Linked-Size": str(len(data)),
                                       "ETag": '"%s"' % git_sha1(b"pointer " + data[:16])})
            self.send(200, {"X-Repo-Commit": commit, "ETag": '"%s"' % git_sha1(data),
                            "Content-Type": "application/octet-stream"}, data)

        def cdn(self):
            if self.headers.get("Authorization"):
                return self.send(400, {}, b"Authorization sent to the CDN")
            path = urllib.parse.urlsplit(self.path).path
            parts = [urllib.parse.unquote(p) for p in path.split("/")[1:]]
            if len(parts) < 5 or parts[0] != "blob":
                return self.send(404, {}, b"no")
            kind, rid, rel = parts[1], parts[2] + "/" + parts[3], "/".join(parts[4:])
            d = hub.repo_dir(kind, rid)
            if d is None or not os.path.isfile(os.path.join(d, rel)):
                return self.send(404, {}, b"no")
            with open(os.path.join(d, rel), "rb") as f:
                data = f.read()
            if hub.control(d, ".expired") is not None:
                return self.send(403, {}, b"<Error><Code>AccessDenied</Code>"
                                 b"<Message>Request has expired</Message></Error>")
            corrupt = (hub.control(d, ".corrupt") or "").split()
            if rel in corrupt:
                data = bytes([data[0] ^ 1]) + data[1:]
            start = 0
            rng = self.headers.get("Range")
            if rng and hub.control(d, ".rangefail") is not None:
                with hub.lock:
                    fail = (kind, rid) not in hub.rangefail_done
                    hub.rangefail_done.add((kind, rid))
                if fail:
                    return self.send(503, {"Content-Type": "text/html"},
                                     b"<html><body>503 Service Unavailable: the host is "
                                     b"busy, try again</body></html>")
            if rng and rng.startswith("bytes=") and rng.endswith("-"):
                start = int(rng[6:-1])
                if start >= len(data):
                    return self.send(416, {"Content-Range": "bytes */%d" % len(data)})
            body = data[start:]
            code = 206 if rng else 200
            h = {"Content-Length": str(len(body)), "Content-Type": "application/octet-stream"}
            if rng:
                h["Content-Range"] = "bytes %d-%d/%d" % (start, len(data) - 1, len(data))
            key = (kind, rid)  # one cut per repo
            with hub.lock:
                cut = int(hub.control(d, ".cut") or 0)
                cut = cut if cut and key not in hub.cut_done and not rng else 0
                if cut:
                    hub.cut_done.add(key)
            self.send_response(code)
            for k, v in h.items():
                self.send_header(k, v)
            self.end_headers()
            if self.command == "HEAD":
                return
            if cut:
                self.wfile.write(body[:cut])
                self.wfile.flush()
                self.close_connection = True
                return
            self.wfile.write(body)

    return H


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--root", required=True)
    ap.add_argument("--port-file", required=True)
    a = ap.parse_args()
    hub = Hub(a.root)
    cdn = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub, True))
    hub.cdn_port = cdn.server_address[1]
    srv = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(hub, False))
    for s in (cdn, srv):
        s.daemon_threads = True
        threading.Thread(target=s.serve_forever, daemon=True).start()
    tmp = a.port_file + ".tmp"
    with open(tmp, "w") as f:
        f.write("%d %d\n" % (srv.server_address[1], hub.cdn_port))
    os.rename(tmp, a.port_file)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    while not stop.wait(0.2):
        pass
    srv.shutdown()
    cdn.shutdown()
    return 0


if __name__ == "__main__":
    sys.exit(main())
