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
