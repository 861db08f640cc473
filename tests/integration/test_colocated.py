"""llm-server's colocated canary: a second revision's model loaded beside
the stable one through POST /admin/canary, taking exactly its weight of the
completions (answers checked against the stable model's, the split against
the per-revision metrics), a session keeping its revision, refusals (no
token, bad fields, a model that does not fit the memory budget, which says
by how much), unloading, and a clean stop with a canary loaded."""
import json
import shutil
import time

import pytest

from harness import Server, metric


openai = pytest.importorskip("openai")
TOKEN = "s3cret"


def admin(srv, body=None, token=TOKEN):
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    status, text, _ = srv.request("POST" if body is not None else "GET", "/admin/canary", body, headers)
    return status, json.loads(text) if text else None


def wait_state(srv, want, timeout=60):
    end = time.time() + timeout
    while time.time() < end:
        st = admin(srv)[1]
        if st["state"] == want:
            return st
        assert st["state"] == "loading", st
        time.sleep(0.05)
    raise AssertionError(f"canary not {want}: {admin(srv)[1]}")


def revision_counts(srv):
    """Completions by revision; a stream is counted as its handler ends,
    just after the client saw [DONE], so read until two readings agree."""
    def read():
        m = srv.metrics()
        return tuple(metric(m, "llm_revision_requests_total", revision=r, code="2xx") for r in ("stable", "canary"))
    prev = read()
    while True:
        time.sleep(0.05)
        cur = read()
        if cur == prev:
            return cur
        prev = cur


@pytest.fixture()
def canary_model(tmp_path, models):
    """The same weights under another path: a new revision whose answers
    must equal the stable one's."""
    p = tmp_path / "canary.gguf"
    shutil.copy(models("tiny", "Q8_0"), p)
    return p


def test_colocated_canary_serves_its_weight(models, canary_model):
    srv = Server(models("tiny", "Q8_0"), "--admin_token", TOKEN, "--model_dir", canary_model.parent)
    try:
        assert admin(srv)[1] == {"state": "none", "model": "", "weight": 0, "message": "", "requests": 0}
        assert admin(srv, token=None)[0] == 401 and admin(srv, token="wrong")[0] == 401
        for bad, param in (({"model": "rel.gguf"}, "model"), ({"model": "/x.gguf", "weight": 101}, "weight"),
                           ({"model": "/x.gguf", "sha256": "abc"}, "sha256"), ([1], "model")):
            status, body = admin(srv, bad)
            assert status == 400 and body["error"]["param"] == param, (bad, body)
        oa = srv.client()
        want = oa.completions.create(model="test-model", prompt="Once upon", max_tokens=8, temperature=0).choices[0].text
        status, st = admin(srv, {"model": str(canary_model), "weight": 30})
        assert status == 200 and st["state"] in ("loading", "ready"), st
        st = wait_state(srv, "ready")
        assert st["weight"] == 30 and st["model"] == str(canary_model)
        m = srv.metrics()
        assert metric(m, "llm_canary_loaded") == 1 and metric(m, "llm_canary_weight") == 30
        s0, c0 = revision_counts(srv)
        for _ in range(20):  # exactly 30% by the smooth counter; same weights: same greedy answer
            got = oa.completions.create(model="test-model", prompt="Once upon", max_tokens=8, temperature=0)
            assert got.choices[0].text == want
        s1, c1 = revision_counts(srv)
        assert (s1 - s0, c1 - c0) == (14, 6)
        chunks = oa.chat.completions.create(model="test-model", messages=[{"role": "user", "content": "Hi"}],
                                            max_tokens=4, stream=True)
        assert any(ch.choices and ch.choices[0].delta.content for ch in chunks)
        # a session stays on one revision
        before = revision_counts(srv)
        for _ in range(6):
            oa.completions.create(model="test-model", prompt="Once", max_tokens=2,
                                  extra_headers={"X-Session-Id": "user-42"})
        after = revision_counts(srv)
        assert sorted((after[0] - before[0], after[1] - before[1])) == [0, 6]
        m = srv.metrics()
        assert metric(m, "llm_revision_ttfb_seconds_count", revision="canary") >= 6
        assert metric(m, "llm_revision_itl_seconds_count", revision="canary") > 0
        # unloading: everything back on stable
        assert admin(srv, {"model": None})[1]["state"] == "none"
        s0, c0 = revision_counts(srv)
        for _ in range(5):
            oa.completions.create(model="test-model", prompt="Once", max_tokens=2)
        assert revision_counts(srv) == (s0 + 5, c0)
        assert metric(srv.metrics(), "llm_canary_loaded") == 0
        # loaded again, then stopped with it loaded: a clean exit
        admin(srv, {"model": str(canary_model), "weight": 100})
        wait_state(srv, "ready")
        oa.completions.create(model="test-model", prompt="Once", max_tokens=2)
        assert revision_counts(srv)[1] == c0 + 1
    finally:
        assert srv.stop() == 0, srv.log


def test_colocated_refusals(models, canary_model, tmp_path):
    off = Server(models("tiny", "Q8_0"))
    try:
        assert admin(off)[0] == 404  # no admin_token: the route is off
    finally:
        assert off.stop() == 0
    srv = Server(models("tiny", "Q8_0"), "--admin_token", TOKEN, "--memory_budget_mb", 1, "--model_dir", tmp_path)
    try:
        admin(srv, {"model": str(canary_model), "weight": 10})
        st = wait_state(srv, "does_not_fit")
        assert "the canary needs" in st["message"] and "MiB budget" in st["message"], st
        status, body = admin(srv, {"model": str(tmp_path / "missing.gguf"), "weight": 10})
        assert status == 400 and "missing.gguf" in body["error"]["message"], body  # refused at once
        assert metric(srv.metrics(), "llm_canary_loaded") == 0
    finally:
        assert srv.stop() == 0, srv.log


def quality_read(srv, path, body, revision=None, token=TOKEN):
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if revision:
        headers["X-LLM-Revision"] = revision
    status, text, _ = srv.request("POST", path, body, headers)
    return status, json.loads(text) if text else None


def test_quality_reads_address_each_revision(models, tmp_path):
    """The quality gate's admin routes: /admin/tokenize and /admin/completions answered by the revision
    X-LLM-Revision names. The canary (another quantization of the same weights) must answer exactly as a
    server of its own model alone does, and the stable as the plain API does."""
    canary = tmp_path / "canary.gguf"
    shutil.copy(models("tiny", "Q8_0"), canary)
    ids = [1, 45, 97, 300, 12, 7, 220, 401, 18, 66]
    score = {"model": "test-model", "prompt": ids, "max_tokens": 1, "prompt_logprobs": 5}
    alone = Server(canary)
    try:
        want_canary = alone.post("/v1/completions", score)[1]["choices"][0]["prompt_logprobs"]
    finally:
        assert alone.stop() == 0, alone.log
    srv = Server(models("tiny", "F32"), "--admin_token", TOKEN, "--model_dir", tmp_path)
    try:
        assert quality_read(srv, "/admin/tokenize", {"prompt": "Once upon"}, "canary")[0] == 409  # none loaded
        assert quality_read(srv, "/admin/tokenize", {"prompt": "Once upon"}, token=None)[0] == 401
        assert quality_read(srv, "/admin/tokenize", {"prompt": "Once upon"}, "other")[0] == 400
        admin(srv, {"model": str(canary), "weight": 0})
        wait_state(srv, "ready")
        want_stable = srv.post("/v1/completions", score)[1]["choices"][0]["prompt_logprobs"]
        assert want_stable != want_canary  # F32 and Q8_0 differ somewhere: the header must matter
        for rev, want in (("stable", want_stable), (None, want_stable), ("canary", want_canary)):
            status, body = quality_read(srv, "/admin/completions", score, rev)
            assert status == 200 and body["choices"][0]["prompt_logprobs"] == want, (rev, body)
        plain = srv.post("/tokenize", {"content": "Once upon a time"})[1]["tokens"]
        for rev in ("stable", "canary"):
            status, body = quality_read(srv, "/admin/tokenize", {"prompt": "Once upon a time"}, rev)
            assert status == 200 and body == {"tokens": plain, "vocab_size": 512}, body
            status, chat = quality_read(srv, "/admin/tokenize", {"messages": [{"role": "user", "content": "Hi"}]}, rev)
            assert status == 200 and len(chat["tokens"]) > 2, chat
        assert quality_read(srv, "/admin/tokenize", {"prompt": 5})[0] == 400
        m = srv.metrics()  # reads, not traffic: the canary's analysis never sees them
        assert metric(m, "llm_revision_requests_total", revision="canary", code="2xx") == 0
        assert metric(m, "llm_revision_ttfb_seconds_count", revision="canary") == 0
    finally:
        assert srv.stop() == 0, srv.log
