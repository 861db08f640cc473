"""hubsim.py - a Hugging Face hub stand-in for the model-source tests
(issue 42): the part of the hub's HTTP protocol a model download uses,
served from a folder of repositories (ROOT/ORG/REPO/files...).

Two hosts, as the real hub has: the API host answers
  HEAD/GET /ORG/REPO/resolve/REV/PATH  - large files (LFS, here: every file
      of at least LFS_MIN bytes) with a 302 to the CDN host and the headers
      X-Repo-Commit, X-Linked-Etag ("sha256"), X-Linked-Size; small files
      with 200, their ETag and the bytes
  GET /api/models/ORG/REPO[/revision/REV] - id, sha (the commit), siblings
  GET /api/models/ORG/REPO/tree/REV      - files with size, oid and lfs oid
and the CDN host answers GET/HEAD /blobs/SHA256 with Range (206) support.
REV is "main" or the 40-hex commit, which is the sha1 of the repository's
sorted (path, sha256) list, so it changes when a file does.

A repository with a file ".token" is gated: without "Authorization: Bearer
<that token>" the API answers 401 with X-Error-Code: GatedRepo. Missing
repositories answer 401 RepositoryNotFound, missing files 404
EntryNotFound, as the hub does. Faults for the next CDN answers are set on
Hub.faults: {"drop_at": N} (the connection cut after N bytes), {"trickle":
bytes_per_second} (one byte per write), {"rate": bytes_per_second} (64 KiB
writes, paced), {"corrupt": True} (a byte in the middle of the first write flipped), {"status": (429,
retry_after)}, {"redirect": URL} (a 302 there) - each used once unless
"sticky" is set. Hub.resolve_faults change the API's resolve answers:
{"linked_size": N} (a size claimed), {"location": URL} (the redirect's
target). Every request is
recorded in Hub.log as (host, method, path, headers with lower-case names)
for tests to read.

    python3 tests/hubsim/hubsim.py ROOT    # prints the API and CDN URLs"""
import hashlib
import http.server
import json
import os
import sys
import threading
import time
import urllib.parse

LFS_MIN = 1024


_digests = {}


def sha256_file(path):
    """The file's sha256, computed once per (path, size, mtime): a request
    must not cost a read of every file of the repository."""
    st = os.stat(path)
    key = (os.path.realpath(path), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        with open(path, "rb") as f:
            _digests[key] = hashlib.file_digest(f, "sha256").hexdigest()
    return _digests[key]


class Repo:
    def __init__(self, path):
        self.path = path
        self.files = {}  # relative path -> (size, sha256)
        for base, _, names in os.walk(path):
            for n in names:
                full = os.path.join(base, n)
                rel = os.path.relpath(full, path)
                if rel != ".token":
                    self.files[rel] = (os.path.getsize(full), sha256_file(full))
        listing = "".join(f"{p}\0{h}\n" for p, (_, h) in sorted(self.files.items()))
        self.commit = hashlib.sha1(listing.encode()).hexdigest()
        tok = os.path.join(path, ".token")
        self.token = open(tok).read().strip() if os.path.exists(tok) else None

    def git_oid(self, rel):
        """What git calls the blob's id (its ETag for small files), once per file version."""
        path = os.path.join(self.path, rel)
        st = os.stat(path)
        key = ("oid", os.path.realpath(path), st.st_size, st.st_mtime_ns)
        if key not in _digests:
            h = hashlib.sha1(b"blob %d\0" % st.st_size)
            with open(path, "rb") as f:
                while chunk := f.read(1 << 20):
                    h.update(chunk)
            _digests[key] = h.hexdigest()
        return _digests[key]


class Hub:
    def __init__(self, root):
        self.root = root
        self.faults = {}
        self.resolve_faults = {}
        self.tree_body = None  # bytes: every file list page answers these instead
        self.log = []
        self.blobs = {}  # sha256 -> file path (what the CDN serves)
        self.api = self._serve("api")
        self.cdn = self._serve("cdn")
        self.url = f"http://127.0.0.1:{self.api.server_address[1]}"
        self.cdn_url = f"http://127.0.0.1:{self.cdn.server_address[1]}"

    def _serve(self, host):
        hub = self

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a):
                pass

            def do_HEAD(self):
                hub.log.append((host, "HEAD", self.path, {k.lower(): v for k, v in self.headers.items()}))
                (hub.api_route if host == "api" else hub.cdn_route)(self, head=True)

            def do_GET(self):
                hub.log.append((host, "GET", self.path, {k.lower(): v for k, v in self.headers.items()}))
                (hub.api_route if host == "api" else hub.cdn_route)(self, head=False)
        class Quiet(http.server.ThreadingHTTPServer):
            def handle_error(self, request, client_address):
                if not isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
                    super().handle_error(request, client_address)  # a client that hung up is no error here
        srv = Quiet(("127.0.0.1", 0), H)
        srv.daemon_threads = True
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        return srv

    def close(self):
        for s in (self.api, self.cdn):
            s.shutdown()
            s.server_close()

    # ---- answers ---------------------------------------------------------------
    @staticmethod
    def reply(h, status, body=b"", headers=None, head=False, ctype="application/json"):
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if not head:
            h.wfile.write(body)

    def error(self, h, status, code, message, head):
        self.reply(h, status, json.dumps({"error": message}).encode(), {"X-Error-Code": code, "X-Error-Message": message},
                   head)

    def repo(self, h, org, name, head):
        """The repository, or None after answering as the hub does."""
        path = os.path.join(self.root, org, name)
        if "/" in org + name or org in (".", "..") or name in (".", "..") or not os.path.isdir(path):
            self.error(h, 401, "RepoNotFound", "Repository Not Found", head)
            return None
        r = Repo(path)
        if r.token and h.headers.get("Authorization") != f"Bearer {r.token}":
            self.error(h, 401, "GatedRepo", f"Access to model {org}/{name} is restricted.", head)
            return None
        return r

    def api_route(self, h, head):
        url = urllib.parse.urlsplit(h.path)
        parts = [urllib.parse.unquote(p) for p in url.path.split("/") if p]
        if len(parts) >= 5 and parts[2] == "resolve":
            return self.resolve(h, parts[0], parts[1], parts[3], "/".join(parts[4:]), head)
        if len(parts) >= 4 and parts[:2] == ["api", "models"]:
            r = self.repo(h, parts[2], parts[3], head)
            if r is None:
                return
            rest = parts[4:]
            if rest[:1] == ["tree"]:
                return self.tree(h, r, rest[1] if len(rest) > 1 else "main", head)
            if rest and rest[0] != "revision":
                return self.error(h, 404, "EntryNotFound", "no such route", head)
            if len(rest) > 1 and rest[1] not in ("main", r.commit):
                return self.error(h, 404, "RevisionNotFound", f"Invalid rev id: {rest[1]}", head)
            info = {"id": f"{parts[2]}/{parts[3]}", "modelId": f"{parts[2]}/{parts[3]}", "sha": r.commit,
                    "private": False, "gated": "manual" if r.token else False,
                    "siblings": [{"rfilename": p} for p in sorted(r.files)]}
            return self.reply(h, 200, json.dumps(info).encode(), head=head)
        self.error(h, 404, "EntryNotFound", "no such route", head)

    def tree(self, h, r, rev, head):
        if rev not in ("main", r.commit):
            return self.error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        if self.tree_body is not None:  # a hostile hub's page, as given
            return self.reply(h, 200, self.tree_body, head=head)
        out = []
        for p, (size, sha) in sorted(r.files.items()):
            e = {"type": "file", "path": p, "size": size, "oid": r.git_oid(p)}
            if size >= LFS_MIN:
                e["lfs"] = {"oid": sha, "size": size, "pointerSize": 134}
            out.append(e)
        self.reply(h, 200, json.dumps(out).encode(), head=head)

    def resolve(self, h, org, name, rev, rel, head):
        r = self.repo(h, org, name, head)
        if r is None:
            return
        if rev not in ("main", r.commit):
            return self.error(h, 404, "RevisionNotFound", f"Invalid rev id: {rev}", head)
        if rel not in r.files:
            return self.error(h, 404, "EntryNotFound", f"{rel} does not exist at revision {r.commit}", head)
        size, sha = r.files[rel]
        common = {"X-Repo-Commit": r.commit}
        if size < LFS_MIN:
            body = open(os.path.join(r.path, rel), "rb").read()
            return self.reply(h, 200, body, {**common, "ETag": f'"{r.git_oid(rel)}"'}, head, "application/octet-stream")
        self.blobs[sha] = os.path.join(r.path, rel)
        loc = f"{self.cdn_url}/blobs/{sha}?repo={urllib.parse.quote(org + '/' + name)}"
        loc = self.resolve_faults.get("location", loc)
        size = self.resolve_faults.get("linked_size", size)
        self.reply(h, 302, b"", {**common, "Location": loc, "X-Linked-Etag": f'"{sha}"', "X-Linked-Size": str(size),
                                 "ETag": f'"{r.git_oid(rel)}"'}, head)

    def take_fault(self):
        f = dict(self.faults)
        if not f.get("sticky"):
            self.faults.clear()
        return f

    def cdn_route(self, h, head):
        parts = [p for p in urllib.parse.urlsplit(h.path).path.split("/") if p]
        f = self.take_fault() if not head else {}
        if "redirect" in f:
            return self.reply(h, 302, b"", {"Location": f["redirect"]}, head, "text/plain")
        path = self.blobs.get(parts[1]) if len(parts) == 2 and parts[0] == "blobs" else None
        if path is None:
            return self.reply(h, 404, b"NoSuchKey", head=head, ctype="text/plain")
        if "status" in f:
            code, retry = f["status"]
            return self.reply(h, code, b"slow down", {"Retry-After": str(retry)}, head, "text/plain")
        size = os.path.getsize(path)
        start, end = 0, size - 1
        rng = h.headers.get("Range", "")
        if rng.startswith("bytes="):
            a, _, b = rng[6:].partition("-")
            start, end = int(a or 0), min(int(b) if b else size - 1, size - 1)
            if start >= size:
                return self.reply(h, 416, b"", {"Content-Range": f"bytes */{size}"}, head, "text/plain")
        h.send_response(206 if rng else 200)
        h.send_header("Content-Type", "application/octet-stream")
        h.send_header("Content-Length", str(end - start + 1))
        h.send_header("ETag", f'"{parts[1]}"')
        h.send_header("Accept-Ranges", "bytes")
        if rng:
            h.send_header("Content-Range", f"bytes {start}-{end}/{size}")
        h.end_headers()
        if not head:
            self.send_bytes(h, path, start, end, f)

    def send_bytes(self, h, path, start, end, f):
        with open(path, "rb") as src:
            src.seek(start)
            sent, left = 0, end - start + 1
            while left:
                chunk = src.read(min(left, 1 if f.get("trickle") else 1 << 16))
                if f.get("rate"):
                    time.sleep(len(chunk) / f["rate"])
                if f.get("corrupt") and sent == 0:  # a byte past the header: the file still looks like one
                    k = len(chunk) // 2
                    chunk = chunk[:k] + bytes([chunk[k] ^ 0xFF]) + chunk[k + 1:]
                if "drop_at" in f and sent + len(chunk) > f["drop_at"]:
                    h.wfile.write(chunk[:max(0, f["drop_at"] - sent)])
                    h.wfile.flush()
                    h.close_connection = True
                    h.connection.shutdown(2)
                    return
                h.wfile.write(chunk)
                sent, left = sent + len(chunk), left - len(chunk)
                if f.get("trickle"):
                    h.wfile.flush()
                    time.sleep(1 / f["trickle"])


if __name__ == "__main__":
    hub = Hub(sys.argv[1])
    print(f"api {hub.url}\ncdn {hub.cdn_url}", flush=True)
    threading.Event().wait()
