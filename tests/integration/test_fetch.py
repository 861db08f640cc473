"""Models from anywhere (net/fetch.c, llm-fetch, llm-server -m SOURCE),
against servers we did not write the clients of: the hub stand-in
(tests/hubsim, held to the official huggingface_hub client in
test_hubsim.py) and moto's S3 server with objects put by boto3, which
checks our SigV4 signatures with botocore's signer.

What is held: huggingface_hub's cache layout both ways (ours read by it,
its reused by us without a download); the QUANT choice and its errors; a
cut resumed with a Range from where the bytes stopped; a wrong digest
refused with nothing kept; gated, missing and throttled answers as their
reasons; a stalled transfer cut; hostile URIs, redirects, sizes, bodies and
a full disk refused with nothing usable left; two fetchers sharing a cache
download once; llm-server serving the same greedy answer from hf:// and
s3:// as from the file, with /startupz reporting the download."""
import hashlib
import json
import os
import pathlib
import resource
import shutil
import signal
import subprocess
import sys
import time

import pytest

from harness import ROOT, Server, free_port, running, sanitized, tool, wait_for

sys.path.insert(0, str(ROOT / "tests" / "hubsim"))
from hubsim import Hub  # noqa: E402


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


@pytest.fixture()
def hub(tmp_path, models):
    root = tmp_path / "root"
    for repo in ("acme/tiny-GGUF", "acme/gated", "acme/two"):
        (root / repo).mkdir(parents=True)
    tiny = models("tiny", "Q8_0")
    shutil.copy(tiny, root / "acme/tiny-GGUF/tiny-Q8_0.gguf")
    shutil.copy(models("tiny", "F32"), root / "acme/tiny-GGUF/tiny-F32.gguf")
    (root / "acme/tiny-GGUF/bad-Q4_0.gguf").write_text("<html>" + "x" * 5000 + "</html>")
    (root / "acme/tiny-GGUF/README.md").write_text("a tiny model\n")
    shutil.copy(tiny, root / "acme/gated/tiny-Q8_0.gguf")
    (root / "acme/gated/.token").write_text("sekrit\n")
    shutil.copy(tiny, root / "acme/two/a-Q8_0.gguf")
    shutil.copy(tiny, root / "acme/two/b-Q8_0.gguf")
    h = Hub(str(root))
    yield h
    h.close()


def fetch(hub, tmp_path, source, *args, env=None, timeout=120, preexec=None):
    """llm-fetch SOURCE against the stand-in, cache in tmp_path/cache."""
    e = {**os.environ, "HF_ENDPOINT": hub.url, **(env or {})}
    e.pop("HF_TOKEN", None) if "HF_TOKEN" not in (env or {}) else None
    return subprocess.run([str(tool("llm-fetch")), source, "--cache", str(tmp_path / "cache"), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout, env=e, preexec_fn=preexec)


def cdn_gets(hub):
    return [(p, hd) for host, m, p, hd in hub.log if host == "cdn" and m == "GET"]


def leftovers(tmp_path):
    """Every file under the cache but locks: what a failed fetch left."""
    c = tmp_path / "cache"
    return sorted(str(p.relative_to(c)) for p in c.rglob("*") if p.is_file() and ".locks" not in p.parts) \
        if c.exists() else []


def test_quant_into_the_hub_cache_read_by_huggingface_hub(hub, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:q8_0")
    assert r.returncode == 0, r.stderr
    path = r.stdout.strip()
    src = tmp_path / "root/acme/tiny-GGUF/tiny-Q8_0.gguf"
    digest = sha256(src)
    repo = tmp_path / "cache/models--acme--tiny-GGUF"
    assert os.readlink(path) == f"../../blobs/{digest}"
    assert path.startswith(str(repo / "snapshots")) and sha256(path) == digest
    commit = (repo / "refs/main").read_text()
    assert path == str(repo / "snapshots" / commit / "tiny-Q8_0.gguf")
    # huggingface_hub finds it offline: our cache is its cache
    got = hf.hf_hub_download("acme/tiny-GGUF", "tiny-Q8_0.gguf", cache_dir=str(tmp_path / "cache"),
                             local_files_only=True)
    assert got == path
    # the file named with a revision: the same blob, nothing downloaded again
    before = len(cdn_gets(hub))
    r = fetch(hub, tmp_path, f"hf://acme/tiny-GGUF/tiny-Q8_0.gguf@{commit}")
    assert r.returncode == 0 and r.stdout.strip() == path, r.stderr
    assert len(cdn_gets(hub)) == before


def test_hostile_file_lists_cost_their_bytes_only(hub, tmp_path):
    """The file list a hub (spec.model.endpoint: the tenant's choice) sends
    is read in place: 3 MiB of `[{},{},...]` (a jansson tree of it would take
    ~230 MB) costs llm-fetch a few MB; a page over 4 MiB, a text that is no
    array, entries that are no files or whose path is unsafe, cut or holds
    a NUL are refused or skipped; an escaped path still matches."""
    hub.tree_body = b"[" + b"{}," * (1 << 20) + b"{}]"
    # 13 MB measured; AddressSanitizer maps its shadow as data, so its builds run the walk without the cap
    data_cap = None if sanitized() else lambda: resource.setrlimit(resource.RLIMIT_DATA, (64 << 20, 64 << 20))
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0", preexec=data_cap)
    assert r.returncode == 3 and "no .gguf file carries 'Q8_0'" in r.stderr, r.stderr
    hub.tree_body = b"[" + b"{}," * (5 << 19) + b"{}]"  # 7.5 MiB
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 1 and "the answer is over 4194304 bytes" in r.stderr, r.stderr
    for body in (b'{"path": "tiny-Q8_0.gguf"}', b"[" * 65 + b"]" * 65, b'[{"path": "x.gguf"}'):
        hub.tree_body = body
        r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
        assert r.returncode != 0 and "file list" in r.stderr, (body[:40], r.stderr)
    skipped = [{"type": "directory", "path": "d-Q8_0.gguf"}, {"path": "../up-Q8_0.gguf"}, {"path": "/abs-Q8_0.gguf"},
               {"path": "nul\u0000-Q8_0.gguf"}, {"path": "x" * 2000 + "-Q8_0.gguf"},
               {"path": "y" * 1010 + "-Q8_0.gguf\U0001F600z"}, {"path": 7}, []]
    # the NUL as \u0000; the emoji as a surrogate pair after 1,020 bytes: a decoder cutting at 1,023 bytes would
    # keep "yyy...-Q8_0.gguf", a name the hub never listed
    hub.tree_body = json.dumps(skipped).encode()
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 3 and "no .gguf file carries 'Q8_0'" in r.stderr and "(the .gguf files: none)" in r.stderr, \
        r.stderr
    hub.tree_body = json.dumps(skipped + [{"type": "file", "path": "tiny\\u002dQ8_0.gguf"}]).replace(
        "\\\\u", "\\u").encode()  # json.dumps escapes the backslash; the hub's own \u002d is meant
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 0 and r.stdout.strip().endswith("/tiny-Q8_0.gguf"), r.stderr


def test_a_cache_filled_by_huggingface_hub_is_reused(hub, tmp_path):
    hf = pytest.importorskip("huggingface_hub")
    theirs = hf.hf_hub_download("acme/tiny-GGUF", "tiny-F32.gguf", cache_dir=str(tmp_path / "cache"),
                                endpoint=hub.url)
    hub.log.clear()
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == theirs
    assert cdn_gets(hub) == [], "the blob was downloaded again"


def test_quant_choice_errors(hub, tmp_path):
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q5_K")
    assert r.returncode == 3, r.stderr
    assert "no .gguf file carries 'Q5_K'" in r.stderr and "tiny-Q8_0.gguf" in r.stderr, r.stderr
    assert "ModelNotFound" in r.stderr
    r = fetch(hub, tmp_path, "hf://acme/two:Q8_0")
    assert r.returncode == 1 and "'Q8_0' names 2 files: a-Q8_0.gguf, b-Q8_0.gguf" in r.stderr, r.stderr
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8")  # a token, not a prefix of Q8_0
    assert r.returncode == 3, r.stderr


def test_a_cut_resumes_where_the_bytes_stopped(hub, tmp_path):
    src = tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf"
    size = src.stat().st_size
    hub.faults = {"drop_at": size // 2}
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF/tiny-F32.gguf")
    assert r.returncode == 0, r.stderr
    assert sha256(r.stdout.strip()) == sha256(src)
    gets = cdn_gets(hub)
    assert len(gets) == 2, gets
    assert "range" not in gets[0][1]
    start = int(gets[1][1]["range"].removeprefix("bytes=").rstrip("-"))
    # the second transfer starts where the first stopped: at most one chunk sent twice
    assert size // 2 - 65536 <= start <= size // 2, (start, size)
    assert "retrying" in r.stderr


def test_a_wrong_digest_is_refused_and_nothing_kept(hub, tmp_path):
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0", "--sha256", "0" * 64)
    assert r.returncode == 5 and "ModelChecksumMismatch" in r.stderr and "not downloaded" in r.stderr, r.stderr
    assert cdn_gets(hub) == [] and leftovers(tmp_path) == []
    hub.faults = {"corrupt": True}  # the bytes differ from the hub's sha256
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 5 and "sha256 mismatch" in r.stderr, r.stderr
    assert leftovers(tmp_path) == [], leftovers(tmp_path)


def test_gated_missing_and_throttled(hub, tmp_path):
    r = fetch(hub, tmp_path, "hf://acme/gated/tiny-Q8_0.gguf")
    assert r.returncode == 4 and "ModelAccessDenied" in r.stderr and "set HF_TOKEN" in r.stderr, r.stderr
    r = fetch(hub, tmp_path, "hf://acme/gated/tiny-Q8_0.gguf", env={"HF_TOKEN": "wrong"})
    assert r.returncode == 4 and "wrong" not in r.stderr, r.stderr
    hub.log.clear()
    r = fetch(hub, tmp_path, "hf://acme/gated/tiny-Q8_0.gguf", env={"HF_TOKEN": "sekrit"})
    assert r.returncode == 0, r.stderr
    api = [hd for host, _, _, hd in hub.log if host == "api"]
    assert api and all(hd.get("authorization") == "Bearer sekrit" for hd in api)
    assert cdn_gets(hub) and all("authorization" not in hd for _, hd in cdn_gets(hub)), "the token went to the CDN"
    for src, what in [("hf://acme/nope/x.gguf", "no such repository"), ("hf://acme/tiny-GGUF/nope.gguf", "not found"),
                      ("hf://acme/tiny-GGUF/tiny-Q8_0.gguf@v9", "no revision 'v9'")]:
        r = fetch(hub, tmp_path, src)
        assert r.returncode == 3 and what in r.stderr and "ModelNotFound" in r.stderr, (src, r.stderr)
    hub.faults = {"status": (429, 1)}
    t = time.time()
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32")
    assert r.returncode == 0 and "HTTP 429" in r.stderr and "retrying in 1 s" in r.stderr, r.stderr
    assert time.time() - t >= 1.0


def test_a_stalled_transfer_is_cut_and_resumed_later(hub, tmp_path):
    hub.faults = {"trickle": 1, "sticky": True}
    t = time.time()
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32", "--stall-seconds", 2, "--retries", 1)
    assert r.returncode == 1 and "gave up after 2 attempts" in r.stderr, r.stderr
    assert time.time() - t < 30
    assert not list((tmp_path / "cache").rglob("snapshots/*/*")), "a partial file is in the snapshot"
    hub.faults = {}
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32")
    assert r.returncode == 0, r.stderr
    assert sha256(r.stdout.strip()) == sha256(tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf")


@pytest.mark.parametrize("source,what", [
    ("hf://acme/tiny-GGUF/../gated/tiny-Q8_0.gguf", "segment"),
    ("hf://acme/tiny-GGUF//tiny-Q8_0.gguf", "segment"),
    ("hf://../x/y.gguf", "not hf://"),
    ("hf://acme/tiny-GGUF", "name a file"),
    ("hf://acme/tiny-GGUF:Q8_0@main/../x", "revision"),
    ("s3://bucket/../key.gguf", "s3://BUCKET/KEY"),
    ("s3://Bucket_Upper/key.gguf", "s3://BUCKET/KEY"),
    ("https://example.invalid/a/../b.gguf", "segment"),
    ("https://example.invalid/a/%2e%2e/b.gguf", "encoded"),
    ("https://user@example.invalid/b.gguf", "not an http(s) URL"),
])
def test_hostile_sources_are_refused_before_any_request(hub, tmp_path, source, what):
    r = fetch(hub, tmp_path, source)
    assert r.returncode == 1 and what in r.stderr, r.stderr
    assert hub.log == [] and leftovers(tmp_path) == []


def test_hostile_answers_leave_nothing_usable(hub, tmp_path):
    # a redirect to another scheme, and a redirect loop
    hub.resolve_faults = {"location": "ftp://127.0.0.1/x"}
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 1 and "only https (or http from http)" in r.stderr, r.stderr
    hub.resolve_faults = {}
    hub.faults = {"redirect": hub.cdn_url + "/loop", "sticky": True}
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 1 and "more than 5 redirects" in r.stderr, r.stderr
    hub.faults = {}
    # a body that is not GGUF
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q4_0")
    assert r.returncode == 1 and "not a GGUF file (it starts with 3c 68 74 6d" in r.stderr, r.stderr
    # a size beyond the cache's free space: refused before a byte is written
    hub.log.clear()
    hub.resolve_faults = {"linked_size": 1 << 60}
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 1 and "nothing written" in r.stderr, r.stderr
    assert cdn_gets(hub) == []
    hub.resolve_faults = {}
    assert leftovers(tmp_path) == [], leftovers(tmp_path)


def test_a_full_disk_mid_file_keeps_nothing(hub, tmp_path):
    def small_disk():  # writes past 1 MB fail (EFBIG), as on a full volume
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32", preexec=small_disk)
    assert r.returncode == 1 and "writing" in r.stderr and "File too large" in r.stderr, r.stderr
    assert leftovers(tmp_path) == [], leftovers(tmp_path)


def test_two_fetchers_on_one_cache_download_once(hub, tmp_path):
    size = (tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf").stat().st_size
    hub.faults = {"rate": size / 4, "sticky": True}  # ~4 s: the second starts while the first downloads
    e = {**os.environ, "HF_ENDPOINT": hub.url}
    cmd = [str(tool("llm-fetch")), "hf://acme/tiny-GGUF:F32", "--cache", str(tmp_path / "cache")]
    a = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    wait_for(lambda: cdn_gets(hub), what="the first fetcher's download")
    b = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
    (oa, ea), (ob, eb) = a.communicate(timeout=120), b.communicate(timeout=120)
    assert a.returncode == 0 and b.returncode == 0, (ea, eb)
    assert oa == ob
    assert len(cdn_gets(hub)) == 1, cdn_gets(hub)
    assert "waiting" in eb, eb


# ---- S3 (moto's server, which checks SigV4 signatures once IAM is on) -------------------------------

@pytest.fixture()
def s3():
    """Factory: s3({key: file}) puts the files in bucket "models" of a new
    moto server, then turns its IAM checks on (every later request's
    signature is verified) and returns the environment of a user allowed
    s3:GetObject."""
    boto3 = pytest.importorskip("boto3")
    pytest.importorskip("moto.server")
    procs = []

    def start(objects):
        port = free_port()
        # after the set-up's unauthenticated calls moto checks every request's signature
        n_setup = 1 + len(objects) + 3
        env = {**os.environ, "INITIAL_NO_AUTH_ACTION_COUNT": str(n_setup)}
        p = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port)], stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, env=env)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: p.poll() is None and _up(url), what="moto's server")
        kw = dict(endpoint_url=url, region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
        s3c, iam = boto3.client("s3", **kw), boto3.client("iam", **kw)
        s3c.create_bucket(Bucket="models")
        for key, path in objects.items():  # one PutObject each (no multipart: one counted call)
            with open(path, "rb") as f:
                s3c.put_object(Bucket="models", Key=key, Body=f)
        iam.create_user(UserName="puller")
        key = iam.create_access_key(UserName="puller")["AccessKey"]
        iam.put_user_policy(UserName="puller", PolicyName="read", PolicyDocument=json.dumps(
            {"Version": "2012-10-17", "Statement": [{"Effect": "Allow", "Action": "s3:GetObject", "Resource": "*"}]}))
        return {"AWS_ENDPOINT_URL_S3": url, "AWS_ACCESS_KEY_ID": key["AccessKeyId"],
                "AWS_SECRET_ACCESS_KEY": key["SecretAccessKey"], "AWS_REGION": "us-east-1"}
    yield start
    for p in procs:
        p.terminate()
        p.wait(timeout=10)


def _up(url):
    import urllib.request
    try:
        urllib.request.urlopen(url + "/moto-api/", timeout=1)
        return True
    except OSError:
        return False


def test_s3_with_sigv4_checked_by_moto(hub, tmp_path, s3, models):
    env = s3({"tiny/tiny-Q8_0.gguf": models("tiny", "Q8_0")})
    r = fetch(hub, tmp_path, "s3://models/tiny/tiny-Q8_0.gguf", env=env)
    assert r.returncode == 0, r.stderr
    assert sha256(r.stdout.strip()) == sha256(models("tiny", "Q8_0"))
    assert "/urls/" in r.stdout
    r = fetch(hub, tmp_path, "s3://models/tiny/tiny-Q8_0.gguf", env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert r.returncode == 0, "a cached file needs no request"  # (the key is in the cache already)
    r = fetch(hub, tmp_path / "b", "s3://models/tiny/tiny-Q8_0.gguf", env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"})
    assert r.returncode == 4 and "access denied (HTTP 403)" in r.stderr, r.stderr
    assert "wrong" not in r.stderr
    r = fetch(hub, tmp_path / "c", "s3://models/tiny/none.gguf", env=env)
    assert r.returncode == 3 and "ModelNotFound" in r.stderr, r.stderr


# ---- llm-server ----------------------------------------------------------------------------------

def greedy(server):
    s, body, _ = server.post("/v1/completions", {"model": "test-model", "prompt": "The capital of France is",
                                                  "max_tokens": 12, "temperature": 0})
    assert s == 200, body
    return body["choices"][0]["text"]


def test_server_serves_gemma_from_hf_and_s3_as_from_the_file(gemma, tmp_path, s3):
    env = s3({"gemma/gemma-3-270m-Q4_K_M.gguf": gemma})
    root = tmp_path / "hubroot"
    (root / "google/gemma-3-270m-GGUF").mkdir(parents=True)
    os.symlink(gemma, root / "google/gemma-3-270m-GGUF/gemma-3-270m-Q4_K_M.gguf")
    hub = Hub(str(root))
    started = []

    def server(*args, **kw):  # every server is stopped at the end, whatever fails
        started.append(Server(*args, **kw))
        return started[-1]
    try:
        local = server(gemma)
        want = greedy(local)
        local.stop()
        size = gemma.stat().st_size
        hub.faults = {"rate": size / 6, "sticky": True}  # ~6 s: /startupz is read while it downloads
        srv = server("hf://google/gemma-3-270m-GGUF:Q4_K_M", "--model_cache", tmp_path / "cache",
                     env={"HF_ENDPOINT": hub.url}, wait=False)
        seen = []

        def startupz():
            try:
                return json.loads(srv.get("/startupz")[1])
            except OSError:  # not listening yet
                return {"phase": "loading"}

        def downloading():
            j = startupz()
            if j["phase"] == "downloading" and j["download"]["bytes_total"] == size and \
                    0 < j["download"]["bytes_done"] < size:
                seen.append(j)
            return seen or j["phase"] != "downloading" and j["phase"] != "loading"
        wait_for(downloading, timeout=60, what="/startupz during the download")
        assert seen, "never saw the download in /startupz"
        assert seen[0]["status"] == "downloading" and "MB" in seen[0]["detail"]
        srv.wait_ready(timeout=120)
        assert greedy(srv) == want
        srv.stop()
        hub.faults = {}
        srv = server("s3://models/gemma/gemma-3-270m-Q4_K_M.gguf", "--model_cache", tmp_path / "cache", env=env)
        assert greedy(srv) == want
        srv.stop()
        # a wrong digest: nothing served, the reason in /startupz
        srv = server("hf://google/gemma-3-270m-GGUF:Q4_K_M", "--model_cache", tmp_path / "cache2", "--model_sha256",
                     "ab" * 32, env={"HF_ENDPOINT": hub.url}, wait=False)
        wait_for(lambda: startupz()["phase"] == "failed", timeout=60, what="the failure")
        j = startupz()
        assert j["reason"] == "ModelChecksumMismatch" and "sha256" in j["detail"], j
        assert srv.get("/readyz")[0] == 503
        srv.stop()
    finally:
        for s in started:
            s.stop()
        hub.close()


# ---- the operator (kubesim) ----------------------------------------------------------------------

LLMD_URI = """apiVersion: llmk8s.io/v1alpha1
kind: LLMDeployment
metadata: {{name: {name}}}
spec:
  image: llm-server:test
  replicas: {replicas}
  model:
    uri: {uri}
    name: tiny
    endpoint: {endpoint}
{model_extra}  engine: {{threads: 1, contextLength: 128, maxSeqs: 4}}
  probes: {{shutdownDelaySeconds: 1, drainSeconds: 5}}
"""


def llmd_uri(c, name, uri, endpoint, replicas=1, model_extra=""):
    c.k("apply", "-f", "-", stdin=LLMD_URI.format(name=name, uri=uri, endpoint=endpoint, replicas=replicas,
                                                  model_extra=model_extra))


def test_llmdeployment_downloads_once_for_three_replicas(hub, tmp_path, model):
    """model.uri on a shared PVC cache: the status says Downloading with the
    progress while the first pod downloads, the three replicas get one
    download between them, and they serve."""
    with running(tmp_path, model, quiet=True) as c:
        c.controller()
        c.k("apply", "-f", "-", stdin="apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: models}\n"
                                      "spec: {accessModes: [ReadWriteMany], resources: {requests: {storage: 1Gi}}}\n")
        size = (tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf").stat().st_size
        hub.faults = {"rate": size / 12, "sticky": True}  # ~12 s
        llmd_uri(c, "hf", "hf://acme/tiny-GGUF:F32", hub.url, replicas=3,
                 model_extra="    cache: {pvc: {claimName: models}}\n")
        def downloading():  # what kubectl get and describe show, read while it downloads
            cond = c.cond("Ready", "hf")
            if c.status("hf").get("phase") != "Downloading" or "%" not in cond.get("message", ""):
                return None
            got, described = c.k("get", "llmd", "hf").stdout, c.k("describe", "llmd", "hf").stdout
            return "Downloading" in got and "Downloading" in described and "%" in described and (cond, got)
        seen, got = wait_for(downloading, 60, "phase Downloading with the progress in get and describe")
        assert seen["reason"] == "Downloading" and "tiny-F32.gguf" in seen["message"], seen
        wait_for(lambda: c.status("hf").get("phase") == "Ready", 120, "Ready")
        assert c.status("hf")["readyReplicas"] == 3
        assert len(cdn_gets(hub)) == 1, cdn_gets(hub)


def test_llmdeployment_download_failures_have_their_reasons(hub, tmp_path, model):
    """A missing file, a gated repository without a token, a wrong sha256:
    each its reason in the Ready condition, the Secret's value nowhere; the
    token from credentialsSecret opens the gated repository."""
    with running(tmp_path, model, quiet=True) as c:
        c.controller()
        c.k("create", "secret", "generic", "hf-token", "--from-literal=HF_TOKEN=sekrit")
        llmd_uri(c, "missing", "hf://acme/tiny-GGUF/nope.gguf", hub.url)
        llmd_uri(c, "gated", "hf://acme/gated/tiny-Q8_0.gguf", hub.url)
        llmd_uri(c, "wrongsum", "hf://acme/tiny-GGUF:Q8_0", hub.url, model_extra="    sha256: \"" + "ab" * 32 + "\"\n")
        llmd_uri(c, "token", "hf://acme/gated/tiny-Q8_0.gguf", hub.url,
                 model_extra="    credentialsSecret: {name: hf-token}\n")
        want = {"missing": ("ModelNotFound", "nope.gguf"), "gated": ("ModelAccessDenied", "set HF_TOKEN"),
                "wrongsum": ("ModelChecksumMismatch", "sha256")}

        def seen():
            got = {n: (c.cond("Ready", n).get("reason"), c.cond("Ready", n).get("message", "")) for n in want}
            return all(got[n][0] == r and m in got[n][1] for n, (r, m) in want.items()) and got
        got = wait_for(seen, 90, "the three reasons")
        for n in want:
            assert c.status(n)["phase"] == "Degraded", (n, c.status(n))
        wait_for(lambda: c.status("token").get("phase") == "Ready", 90, "the token's deployment Ready")
        everything = c.k("get", "llmd", "-o", "json").stdout + c.k("get", "events", "-o", "json").stdout
        assert "sekrit" not in everything and got


@pytest.mark.parametrize("model_spec,why", [
    ("{uri: 'hf://acme/x:Q8_0', path: /m/x.gguf}", "exactly one of path (a file on a volume) and uri"),
    ("{name: x}", "exactly one of path (a file on a volume) and uri"),
    ("{uri: 'hf://acme/x/../y.gguf'}", "must not have empty, . or .. segments"),
    ("{uri: 'hf://acme/x//y.gguf'}", "must not have empty, . or .. segments"),
    ("{uri: 'ftp://host/x.gguf'}", "spec.model.uri"),
    ("{uri: 'hf://acme/x:Q8_0', volume: {hostPath: {path: /m}}}", "volume is for path"),
    ("{path: /m/x.gguf, cache: {emptyDir: {}}}", "cache, credentialsSecret and endpoint are for a uri"),
    ("{uri: 'https://h/x.gguf', endpoint: 'https://mirror'}", "endpoint is for hf://"),
    ("{uri: 'hf://acme/x:Q8_0', cache: {pvc: {claimName: a}, emptyDir: {}}}", "at most one of pvc, emptyDir and hostPath"),
    ("{uri: 'hf://acme/x:Q8_0', cache: {hostPath: {}, emptyDir: {}}}", "at most one of pvc, emptyDir and hostPath"),
    ("{uri: 'hf://acme/x:Q8_0', sha256: 'abc'}", "spec.model.sha256"),
])
def test_the_crd_refuses_bad_model_sources(tmp_path, model, kubectl, model_spec, why):
    """The CRD's rules (kubesim evaluates them as the API server does)."""
    kubectl("apply", "-f", str(ROOT / "manifests/crd/llmdeployments.yaml"))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    r = kubectl("apply", "-f", "-", check=False, stdin=f"apiVersion: llmk8s.io/v1alpha1\nkind: LLMDeployment\n"
                f"metadata: {{name: bad}}\nspec: {{model: {model_spec}}}\n")
    assert r.returncode != 0 and why in r.stderr, r.stderr


def test_the_hf_sample_runs_as_written(gemma, tmp_path, model):
    """manifests/samples/hf-gemma.yaml applied as written on kubesim, but
    for one line: spec.model.endpoint, the hub stand-in serving the same
    repository name (the real hub is not reachable from the tests)."""
    import yaml
    docs = list(yaml.safe_load_all((ROOT / "manifests/samples/hf-gemma.yaml").read_text()))
    llmd = next(d for d in docs if d["kind"] == "LLMDeployment")
    uri = llmd["spec"]["model"]["uri"]
    org, repo = uri.removeprefix("hf://").split(":")[0].split("/")
    root = tmp_path / "hubroot"
    (root / org / repo).mkdir(parents=True)
    os.symlink(gemma, root / org / repo / "gemma-3-270m-it-Q4_K_M.gguf")
    hub = Hub(str(root))
    try:
        llmd["spec"]["model"]["endpoint"] = hub.url
        with running(tmp_path, model, images={"llm-server:0.1.0": [str(tool("llm-server"))]}) as c:
            c.controller()
            c.k("apply", "-f", "-", stdin=yaml.safe_dump_all(docs))
            name = llmd["metadata"]["name"]
            wait_for(lambda: c.status(name).get("phase") == "Ready", 180, "the sample Ready")
            assert c.status(name)["readyReplicas"] == llmd["spec"]["replicas"]
            assert len(cdn_gets(hub)) == 1
    finally:
        hub.close()


def test_the_crd_lets_no_spec_choose_the_node_folder(tmp_path, kubectl):
    """cache.hostPath is {}: a path in it is pruned (the folder is the
    operator's), never mounted."""
    kubectl("apply", "-f", str(ROOT / "manifests/crd/llmdeployments.yaml"))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    kubectl("apply", "--validate=false", "-f", "-", stdin="apiVersion: llmk8s.io/v1alpha1\nkind: LLMDeployment\n"
            "metadata: {name: hp}\nspec: {model: {uri: 'hf://acme/x:Q8_0', cache: {hostPath: {path: /var/lib/m}}}}\n")
    stored = json.loads(kubectl("get", "llmd", "hp", "-o", "json").stdout)
    assert stored["spec"]["model"]["cache"] == {"hostPath": {}}, stored["spec"]


def test_node_cache_is_one_folder_per_namespace(hub, tmp_path, model):
    """cache.hostPath with the operator's --model-cache-host-root: the
    namespace's folder on the node, shared by its pods and kept after them.
    Two replicas download once, a second namespace downloads into its own
    folder; the pods hash what they find there (model_cache_verify), so a
    blob rewritten in the folder is downloaded again, not served; a
    podTemplate naming the cache volume or the init container does not
    change them; a model volume inside the folders is refused. (kubesim
    does not run init containers: the folder is the test user's, and the
    cache-owner container is checked as written.)"""
    root = tmp_path / "node-cache"
    owner = "llm-controller:9.9"
    with running(tmp_path, model, quiet=True) as c:
        c.controller("--model-cache-host-root", str(root), "--model-cache-owner-image", owner)
        c.k("create", "namespace", "team-b")
        extra = "    cache: {hostPath: {}}\n"
        llmd_uri(c, "hf", "hf://acme/tiny-GGUF:Q8_0", hub.url, replicas=2, model_extra=extra)
        sneaky = LLMD_URI.format(name="hf", uri="hf://acme/tiny-GGUF:Q8_0", endpoint=hub.url, replicas=1,
                                 model_extra=extra) + (
            "  podTemplate:\n    spec:\n"
            f"      volumes: [{{name: model-cache, hostPath: {{path: {root}/default}}}}]\n"
            "      initContainers: [{name: cache-owner, image: evil, command: [sh, -c, 'chmod u+s /bin/sh'],"
            " securityContext: {privileged: true}}]\n")
        c.k("apply", "-n", "team-b", "-f", "-", stdin=sneaky)
        ready = lambda ns: json.loads(c.k("get", "llmd", "hf", "-n", ns, "-o", "json").stdout).get(  # noqa: E731
            "status", {}).get("phase") == "Ready"
        wait_for(lambda: ready("default") and ready("team-b"), 120, "both Ready")
        assert len(cdn_gets(hub)) == 2, cdn_gets(hub)  # one per namespace
        for ns in ("default", "team-b"):
            blobs = list((root / ns / "models--acme--tiny-GGUF" / "blobs").iterdir())
            assert len(blobs) == 1 and blobs[0].stat().st_size > 0, blobs
        pod = json.loads(c.k("get", "deploy", "hf", "-n", "team-b", "-o", "json").stdout)["spec"]["template"]["spec"]
        vols = [v for v in pod["volumes"] if v["name"] == "model-cache"]
        assert vols == [{"name": "model-cache", "hostPath": {"path": f"{root}/team-b", "type": "DirectoryOrCreate"}}], vols
        init = pod["initContainers"]
        assert [(i["name"], i["image"]) for i in init] == [("cache-owner", owner)], init
        assert init[0]["command"] == ["chown", "-h", "65532:65532", "/var/cache/llm-models"], init
        sc = init[0]["securityContext"]
        assert sc == {"runAsNonRoot": False, "runAsUser": 0, "allowPrivilegeEscalation": False,
                      "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"], "add": ["CHOWN"]}}, sc
        cm = json.loads(c.k("get", "cm", "hf-config", "-n", "team-b", "-o", "json").stdout)["data"]["config.yaml"]
        assert "model_cache_verify: true" in cm, cm
        # someone rewrites the blob in team-b's folder; a new deployment there hashes it, downloads again
        c.k("delete", "llmd", "hf", "-n", "team-b", "--wait=true")
        wait_for(lambda: not json.loads(c.k("get", "pods", "-n", "team-b", "-o", "json").stdout)["items"], 60,
                 "team-b's pods gone")
        blob = next((root / "team-b" / "models--acme--tiny-GGUF" / "blobs").iterdir())
        good = blob.read_bytes()
        blob.write_bytes(good[:-4] + b"EVIL")
        c.k("apply", "-n", "team-b", "-f", "-", stdin=LLMD_URI.format(
            name="hf", uri="hf://acme/tiny-GGUF:Q8_0", endpoint=hub.url, replicas=1, model_extra=extra))
        wait_for(lambda: ready("team-b"), 120, "team-b Ready again")
        assert len(cdn_gets(hub)) == 3, cdn_gets(hub)
        assert blob.read_bytes() == good
        # the default namespace's deployment, made again: the file found and hashed, nothing downloaded
        c.k("delete", "llmd", "hf", "--wait=true")
        wait_for(lambda: not json.loads(c.k("get", "pods", "-o", "json").stdout)["items"], 60, "default's pods gone")
        llmd_uri(c, "hf", "hf://acme/tiny-GGUF:Q8_0", hub.url, model_extra=extra)
        wait_for(lambda: ready("default"), 120, "default Ready again")
        assert len(cdn_gets(hub)) == 3, cdn_gets(hub)
        # a model volume reaching into the folders (spelled with // and /./) is refused
        c.k("apply", "-f", "-", stdin=llmd_path_on_node("peek", f"{root}//./team-b"))
        cond = wait_for(lambda: c.cond("Ready", "peek").get("reason") == "InvalidSpec" and c.cond("Ready", "peek"),
                        60, "InvalidSpec")
        assert "node cache folder" in cond["message"], cond
        assert c.get("deploy", "peek") is None


def llmd_path_on_node(name, folder):
    return ("apiVersion: llmk8s.io/v1alpha1\nkind: LLMDeployment\n"
            f"metadata: {{name: {name}}}\nspec:\n  image: llm-server:test\n"
            f"  model: {{path: /models/x.gguf, volume: {{hostPath: {{path: '{folder}'}}}}}}\n")


def test_node_cache_needs_the_operators_folder(hub, tmp_path, model):
    """Without --model-cache-host-root no node folder is offered: the spec
    is refused with the reason, nothing is created; a bad folder, or one
    without the owner image, stops the controller at start."""
    for args, why in ((["--model-cache-host-root", "/var/../etc", "--model-cache-owner-image", "x"],
                       "--model-cache-host-root /var/../etc"),
                      (["--model-cache-host-root", "/var/.hidden", "--model-cache-owner-image", "x"], "starting with '.'"),
                      (["--model-cache-host-root", "/var/lib/llm"], "needs --model-cache-owner-image")):
        bad = subprocess.run([tool("llm-controller"), *args], capture_output=True, text=True, timeout=30)
        assert bad.returncode == 2 and why in bad.stderr, bad.stderr
    with running(tmp_path, model) as c:
        c.controller()
        llmd_uri(c, "hf", "hf://acme/tiny-GGUF:Q8_0", hub.url, model_extra="    cache: {hostPath: {}}\n")
        cond = wait_for(lambda: c.cond("Ready", "hf").get("reason") == "InvalidSpec" and c.cond("Ready", "hf"), 60,
                        "InvalidSpec")
        assert "modelCache.hostRoot" in cond["message"], cond
        assert c.get("deploy", "hf") is None


def cdn_url(hub, repo_file):
    """The CDN URL the stand-in redirects repo_file's resolve to (an http:// source)."""
    import urllib.error
    import urllib.request

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *a, **k):
            return None
    org, repo, name = repo_file.split("/", 2)
    req = urllib.request.Request(f"{hub.url}/{org}/{repo}/resolve/main/{name}", method="HEAD")
    try:
        urllib.request.build_opener(NoRedirect).open(req)
    except urllib.error.HTTPError as e:
        hub.log.clear()
        return e.headers["Location"]
    raise AssertionError("the stand-in did not redirect")


def test_what_others_put_in_the_cache_is_not_trusted(hub, tmp_path):
    """The cache is written by whoever shares it: a symbolic link or a FIFO
    planted as the partial file, a partial file of someone else's bytes
    where no digest judges them, a wrong file in place under a digest."""
    src = tmp_path / "root/acme/tiny-GGUF/tiny-Q8_0.gguf"
    want = sha256(src)
    url = cdn_url(hub, "acme/tiny-GGUF/tiny-Q8_0.gguf")
    r = fetch(hub, tmp_path, url)  # an http source: no digest from anywhere
    assert r.returncode == 0, r.stderr
    path = pathlib.Path(r.stdout.strip())
    # someone else's bytes as the partial file: not resumed without a digest
    path.unlink()
    pathlib.Path(str(path) + ".incomplete").write_bytes(b"GGUF" + b"planted" * 1000)
    r = fetch(hub, tmp_path, url)
    assert r.returncode == 0 and sha256(path) == want, r.stderr
    # a link planted as the partial file: never written through
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    path.unlink()
    os.symlink(victim, str(path) + ".incomplete")
    r = fetch(hub, tmp_path, url)
    assert r.returncode == 0 and sha256(path) == want and not path.is_symlink(), r.stderr
    assert victim.read_text() == "keep me"
    # a FIFO planted as the partial file: no hang
    path.unlink()
    os.mkfifo(str(path) + ".incomplete")
    r = fetch(hub, tmp_path, url, timeout=60)
    assert r.returncode == 0 and sha256(path) == want, r.stderr
    # a wrong file in place, fetched with the right digest: hashed, refused, fetched again
    r = fetch(hub, tmp_path, url, "--sha256", want)
    pinned = pathlib.Path(r.stdout.strip())
    assert r.returncode == 0 and sha256(pinned) == want, r.stderr
    pinned.write_bytes(b"GGUF" + b"x" * (src.stat().st_size - 4))
    r = fetch(hub, tmp_path, url, "--sha256", want)
    assert r.returncode == 0 and sha256(pinned) == want and "not the one expected" in r.stderr, r.stderr


def test_offline_the_cache_serves_only_what_the_digest_names(hub, tmp_path):
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:Q8_0")
    assert r.returncode == 0, r.stderr
    want = sha256(r.stdout.strip())
    down = "http://127.0.0.1:9"  # nothing listens: no answer at all
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF/tiny-Q8_0.gguf", "--retries", 1, env={"HF_ENDPOINT": down})
    assert r.returncode == 0 and "using the cached snapshot" in r.stderr, r.stderr
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF/tiny-Q8_0.gguf", "--retries", 1, "--sha256", want,
              env={"HF_ENDPOINT": down})
    assert r.returncode == 0, r.stderr
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF/tiny-Q8_0.gguf", "--retries", 1, "--sha256", "ab" * 32,
              env={"HF_ENDPOINT": down})
    assert r.returncode != 0 and "using the cached snapshot" not in r.stderr, r.stderr


def test_credentials_and_urls_are_not_injected(hub, tmp_path):
    url = cdn_url(hub, "acme/tiny-GGUF/tiny-Q8_0.gguf")
    r = fetch(hub, tmp_path, url, env={"LLM_FETCH_BEARER_TOKEN": "tok\r\nX-Injected: yes"})
    assert r.returncode == 4 and "LLM_FETCH_BEARER_TOKEN has a control character" in r.stderr, r.stderr
    assert "X-Injected" not in r.stderr and cdn_gets(hub) == []
    # a '/' in the query is the query's, not the path's
    r = fetch(hub, tmp_path, url + "&v=1/evil")
    assert r.returncode == 0 and r.stdout.strip().endswith("/" + url.split("?")[0].rsplit("/", 1)[1]), r.stdout
    assert cdn_gets(hub)[-1][0].endswith("&v=1/evil")


def test_a_dead_downloader_is_resumed(hub, tmp_path):
    """A downloader killed mid-file releases its lock with its process; the
    next resumes its partial file from where it stopped (the hub's sha256
    judges the whole)."""
    src = tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf"
    size = src.stat().st_size
    hub.faults = {"rate": size / 8, "sticky": True}
    e = {**os.environ, "HF_ENDPOINT": hub.url}
    p = subprocess.Popen([str(tool("llm-fetch")), "hf://acme/tiny-GGUF:F32", "--cache", str(tmp_path / "cache")],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=e)
    blobs = tmp_path / "cache/models--acme--tiny-GGUF/blobs"
    part = wait_for(lambda: next((f for f in blobs.glob("*.incomplete") if f.stat().st_size > size // 4), None)
                    if blobs.exists() else None, 60, "a quarter of the file")
    p.kill()
    p.wait()
    have = part.stat().st_size
    hub.faults = {}
    hub.log.clear()
    r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32")
    assert r.returncode == 0 and sha256(r.stdout.strip()) == sha256(src), r.stderr
    assert f"resuming at byte {have}" in r.stderr, r.stderr
    gets = cdn_gets(hub)
    assert len(gets) == 1 and gets[0][1]["range"] == f"bytes={have}-", gets


def test_a_stuck_lock_holder_is_left_behind(hub, tmp_path):
    """A process that holds a file's lock and writes nothing is left behind
    after the stale time: the waiter downloads into a partial file of its
    own and the verified result is the same."""
    import fcntl
    src = tmp_path / "root/acme/tiny-GGUF/tiny-F32.gguf"
    lock = tmp_path / f"cache/.locks/models--acme--tiny-GGUF/{sha256(src)}.lock"
    lock.parent.mkdir(parents=True)
    with open(lock, "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        t = time.time()
        r = fetch(hub, tmp_path, "hf://acme/tiny-GGUF:F32", "--lock-stale-seconds", 2)
        assert r.returncode == 0 and "downloading alone" in r.stderr, r.stderr
        assert time.time() - t >= 2
    assert sha256(r.stdout.strip()) == sha256(src)
    assert not list((tmp_path / "cache").rglob("*.incomplete"))


def test_an_https_bearer_token_from_a_file(hub, tmp_path):
    """LLM_FETCH_BEARER_TOKEN_FILE: the token read from a file (a mounted
    Secret), sent to the source's host only."""
    url = cdn_url(hub, "acme/tiny-GGUF/tiny-Q8_0.gguf")
    tok = tmp_path / "token"
    tok.write_text("filetoken\n")
    r = fetch(hub, tmp_path, url, env={"LLM_FETCH_BEARER_TOKEN_FILE": str(tok)})
    assert r.returncode == 0, r.stderr
    assert cdn_gets(hub)[-1][1].get("authorization") == "Bearer filetoken"
