"""POST /v1/embeddings.

Oracle: a float64 numpy forward pass of stories260K (llama: RMSNorm, RoPE
on adjacent pairs, grouped-query attention, SwiGLU), written here from the
GGUF's tensors as read by the `gguf` package, with mean and last-token
pooling of the final normed hidden states and L2 normalisation. The server
runs with an F32 KV cache, so the only differences are float32 rounding:
measured max |difference| 1.3e-7 (mean) and 2.5e-7 (last) on these unit
vectors (x86-64, AVX-512); the bound is 1e-4.

Equivalences: an input in a request of many, sent beside completions,
equals the same input alone, bit for bit (the engine is batch-invariant);
base64 decodes to the floats. Clients: the official `openai` client
(float and base64, which it asks for by default). Hostile input: every bad
field is a 400 naming it, and nothing is left running."""
import base64
import json
import random
import threading

import numpy as np
import pytest

from harness import NAME, SHARED, Server, metric, tool


STORIES = SHARED / "models/stories260K.gguf"


@pytest.fixture(scope="module")
def story_srv():
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    s = Server(STORIES, "--kv_type", "f32")
    yield s
    assert s.stop() == 0


# ---- the float64 oracle ---------------------------------------------------------------

class Llama64:
    """stories260K's forward pass in float64, whole prompt at once."""

    def __init__(self, path):
        from gguf import GGUFReader
        r = GGUFReader(str(path))
        f = {k: v for k, v in r.fields.items()}

        def num(key, default=None):
            if key not in f:
                return default
            v = f[key]
            return v.parts[v.data[0]][0]
        self.n_layer = int(num("llama.block_count"))
        self.n_head = int(num("llama.attention.head_count"))
        self.n_kv = int(num("llama.attention.head_count_kv"))
        self.eps = float(num("llama.attention.layer_norm_rms_epsilon"))
        self.base = float(num("llama.rope.freq_base", 10000.0))
        self.t = {t.name: np.array(t.data, dtype=np.float64).reshape([int(x) for x in reversed(t.shape)])
                  for t in r.tensors}
        self.d = self.t["token_embd.weight"].shape[1]
        self.hd = self.d // self.n_head

    def norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x, n):
        """Adjacent pairs (2i, 2i+1) rotate by pos * base^(-2i/hd)."""
        pos = np.arange(n)[:, None]
        inv = self.base ** (-np.arange(0, self.hd, 2) / self.hd)
        a = pos * inv[None, :]
        cos, sin = np.cos(a)[:, None, :], np.sin(a)[:, None, :]
        x0, x1 = x[..., 0::2], x[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x0 * cos - x1 * sin
        out[..., 1::2] = x0 * sin + x1 * cos
        return out

    def hidden(self, ids):
        t, n = self.t, len(ids)
        x = t["token_embd.weight"][ids]
        mask = np.triu(np.full((n, n), -np.inf), 1)
        for i in range(self.n_layer):
            p = f"blk.{i}."
            h = self.norm(x, t[p + "attn_norm.weight"])
            q = self.rope((h @ t[p + "attn_q.weight"].T).reshape(n, self.n_head, self.hd), n)
            k = self.rope((h @ t[p + "attn_k.weight"].T).reshape(n, self.n_kv, self.hd), n)
            v = (h @ t[p + "attn_v.weight"].T).reshape(n, self.n_kv, self.hd)
            g = self.n_head // self.n_kv
            out = np.empty((n, self.n_head, self.hd))
            for hh in range(self.n_head):
                s = q[:, hh, :] @ k[:, hh // g, :].T / np.sqrt(self.hd) + mask
                s = np.exp(s - s.max(axis=1, keepdims=True))
                out[:, hh, :] = (s / s.sum(axis=1, keepdims=True)) @ v[:, hh // g, :]
            x = x + out.reshape(n, self.d) @ t[p + "attn_output.weight"].T
            h = self.norm(x, t[p + "ffn_norm.weight"])
            gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
            x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
        return self.norm(x, t["output_norm.weight"])

    def embed(self, ids, pooling):
        h = self.hidden(ids)
        v = h.mean(axis=0) if pooling == "mean" else h[-1]
        return v / np.linalg.norm(v)


def tokens(srv, text):
    s, body, _ = srv.post("/tokenize", {"content": text})
    assert s == 200
    return body["tokens"]


TEXTS = ["Once upon a time there was a little girl named Lily.", "The cat sat on the mat.",
         "He ran to the park and played with his ball all day long, until the sun went down.", "Hi"]


@pytest.mark.parametrize("pooling", ["mean", "last"])
def test_equal_float64_reference(story_srv, pooling):
    ref = Llama64(STORIES)
    s, body, _ = story_srv.post("/v1/embeddings", {"input": TEXTS, "pooling": pooling, "model": NAME})
    assert s == 200, body
    assert body["object"] == "list" and body["model"] == NAME
    want_tokens = 0
    worst = 0.0
    for i, text in enumerate(TEXTS):
        ids = tokens(story_srv, text)
        want_tokens += len(ids)
        got = np.array(body["data"][i]["embedding"])
        assert body["data"][i]["index"] == i and body["data"][i]["object"] == "embedding"
        assert got.shape == (ref.d,)
        want = ref.embed(ids, pooling)
        worst = max(worst, float(np.abs(got - want).max()))
        assert abs(np.linalg.norm(got) - 1) < 1e-6
    print(f"{pooling}: max |ours - float64| {worst:.2e}")
    assert worst < 1e-4
    assert body["usage"] == {"prompt_tokens": want_tokens, "total_tokens": want_tokens}


def test_token_inputs_and_pooling_differ(story_srv):
    ids = tokens(story_srv, TEXTS[0])
    by_text = story_srv.post("/v1/embeddings", {"input": TEXTS[0]})[1]["data"][0]["embedding"]
    by_ids = story_srv.post("/v1/embeddings", {"input": ids})[1]["data"][0]["embedding"]
    by_ids2 = story_srv.post("/v1/embeddings", {"input": [ids, ids[:3]]})[1]["data"]
    assert by_text == by_ids == by_ids2[0]["embedding"]
    assert by_ids2[1]["embedding"] != by_ids
    mean = story_srv.post("/v1/embeddings", {"input": ids, "pooling": "mean"})[1]["data"][0]["embedding"]
    assert mean != by_ids  # the server's default here is last (no pooling_type in the file)


def test_batched_equals_alone(story_srv):
    """40 random inputs in one request, with completions running beside it,
    equal each input sent alone (bit for bit), in input order."""
    rng = random.Random(5)
    inputs = [[rng.randrange(3, 512) for _ in range(rng.randrange(1, 120))] for _ in range(40)]
    for pooling in ("mean", "last"):
        alone = [story_srv.post("/v1/embeddings", {"input": x, "pooling": pooling})[1]["data"][0]["embedding"]
                 for x in inputs]
        results = []

        def completions():
            for i in range(4):
                results.append(story_srv.post("/v1/completions", {"prompt": f"Story {i}", "max_tokens": 40})[0])
        th = threading.Thread(target=completions)
        th.start()
        s, body, _ = story_srv.post("/v1/embeddings", {"input": inputs, "pooling": pooling})
        th.join()
        assert s == 200 and results == [200] * 4
        assert [d["index"] for d in body["data"]] == list(range(40))
        for i, d in enumerate(body["data"]):
            assert d["embedding"] == alone[i], f"{pooling} input {i}: differs from the same input alone"


def test_openai_client(story_srv):
    c = story_srv.client()
    r = c.embeddings.create(model=NAME, input=TEXTS[:2], encoding_format="float")
    assert len(r.data) == 2 and len(r.data[0].embedding) == 64
    assert r.usage.prompt_tokens == r.usage.total_tokens > 0
    # the client's default asks for base64 and decodes it itself
    # (the JSON floats have 9 significant digits: as float32 they are the same numbers)
    r2 = c.embeddings.create(model=NAME, input=TEXTS[:2])
    f32 = lambda v: np.array(v, np.float32)
    for i in range(2):
        assert np.array_equal(f32(r2.data[i].embedding), f32(r.data[i].embedding))
    raw = story_srv.post("/v1/embeddings", {"input": TEXTS[0], "encoding_format": "base64"})[1]
    floats = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), "<f4")
    assert np.array_equal(floats, f32(r.data[0].embedding))


@pytest.mark.parametrize("body,param,words", [
    ({}, "input", "non-empty"),
    ({"input": ""}, "input", "empty string"),
    ({"input": []}, "input", "non-empty"),
    ({"input": [[]]}, "input", "empty array"),
    ({"input": [1, "a"]}, "input", "not a token id"),
    ({"input": [[1, 2], 3]}, "input", "neither"),
    ({"input": [512]}, "input", "not a token id"),
    ({"input": [-1]}, "input", "not a token id"),
    ({"input": [[1], [2**40]]}, "input", "input 1"),
    ({"input": {"a": 1}}, "input", "non-empty"),
    ({"input": ["x"] * 2049}, "input", "at most 2048"),
    ({"input": "x", "dimensions": 32}, "dimensions", "cannot be shortened"),
    ({"input": "x", "dimensions": "64"}, "dimensions", "must be 64"),
    ({"input": "x", "encoding_format": "int8"}, "encoding_format", "base64"),
    ({"input": "x", "pooling": "cls"}, "pooling", "mean"),
    ({"input": "x", "priority": 1.5}, "priority", "integer"),
    ({"input": "x", "cache_salt": ""}, "cache_salt", "1 to 256"),
    ({"input": "x", "user": 3}, "user", "string"),
    ({"input": "x", "model": "other"}, "model", "not served"),
    ({"input": list(range(3, 200))}, "input", "holds at most 128"),
])
def test_bad_requests(story_srv, body, param, words):
    s, out, _ = story_srv.post("/v1/embeddings", body)
    assert s in (400, 404), out
    assert out["error"]["param"] == param and words in out["error"]["message"], out
    st = story_srv.metrics()
    assert metric(st, "llm_requests_running") == 0 and metric(st, "llm_requests_waiting") == 0


def test_bad_input_is_refused_before_anything_runs(story_srv):
    """An input over the context at the end of a batch: 400 naming it, and
    not one token of the inputs before it was run."""
    before = metric(story_srv.metrics(), "vllm:prompt_tokens_total", model_name=NAME)
    s, out, _ = story_srv.post("/v1/embeddings", {"input": [[5] * 100] * 50 + [[5] * 129]})
    assert s == 400 and out["error"]["param"] == "input" and "input 50 has 129 tokens" in out["error"]["message"], out
    assert metric(story_srv.metrics(), "vllm:prompt_tokens_total", model_name=NAME) == before


def test_answer_bound(tmp_path):
    """max_answer_bytes bounds the answer before anything is tokenized: the
    same inputs are refused as floats and taken as base64 (a third of the
    size) when the bound lies between."""
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    srv = Server(STORIES, "--max_answer_bytes", 1 << 20)
    try:
        body = {"input": [[5]] * 1000}  # 1000 x 64 values: ~1.1 MB as floats (bound), ~0.4 MB as base64
        s, out, _ = srv.post("/v1/embeddings", body)
        assert s == 400 and "max_answer_bytes" in out["error"]["message"], out
        s, out, _ = srv.post("/v1/embeddings", {**body, "encoding_format": "base64"})
        assert s == 200 and len(out["data"]) == 1000
    finally:
        assert srv.stop() == 0


def test_methods_and_metrics(story_srv):
    assert story_srv.request("GET", "/v1/embeddings")[0] == 405
    before = story_srv.metrics()
    assert story_srv.post("/v1/embeddings", {"input": "x", "dimensions": 64, "user": "u"})[0] == 200
    after = story_srv.metrics()
    assert metric(after, "llm_http_requests_total", route="/v1/embeddings", status="2xx") == \
        metric(before, "llm_http_requests_total", route="/v1/embeddings", status="2xx") + 1
    assert metric(after, "vllm:prompt_tokens_total", model_name=NAME) > \
        metric(before, "vllm:prompt_tokens_total", model_name=NAME)


def test_pooling_setting(tmp_path):
    """embedding_pooling sets the default; a bad value stops the server
    with the key named."""
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    srv = Server(STORIES, "--embedding_pooling", "mean")
    try:
        a = srv.post("/v1/embeddings", {"input": TEXTS[0]})[1]["data"][0]["embedding"]
        b = srv.post("/v1/embeddings", {"input": TEXTS[0], "pooling": "mean"})[1]["data"][0]["embedding"]
        assert a == b
    finally:
        assert srv.stop() == 0
    import subprocess
    p = subprocess.run([tool("llm-server"), "-m", str(STORIES), "--embedding_pooling", "cls"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode != 0 and "embedding_pooling 'cls'" in p.stderr


def test_gemma_sentences(gemma):
    """A real pretrained model: a paraphrase is nearer than an unrelated
    sentence, for both poolings (a sanity check of the whole path on
    Gemma 3: sliding-window layers, embedding scale, post-norms)."""
    srv = Server(gemma, "--n_ctx", 512)
    try:
        for pooling in ("mean", "last"):
            s, body, _ = srv.post("/v1/embeddings", {"input": [
                "The cat sat on the mat.", "A cat was sitting on the mat.", "Stock markets fell sharply on Monday."],
                "pooling": pooling})
            assert s == 200, body
            v = [np.array(d["embedding"]) for d in body["data"]]
            near, far = float(v[0] @ v[1]), float(v[0] @ v[2])
            print(f"gemma {pooling}: cos(paraphrase) {near:.3f}, cos(unrelated) {far:.3f}")
            assert near > far
    finally:
        assert srv.stop() == 0


def test_window_shrinks_to_the_free_slots(models, tmp_path):
    """A tenant (max_inflight=2) with a long completion in flight sends 10
    inputs: they run one at a time in its free slot (not a 429). The
    completion runs before and still after the request (a round where it
    ended first is run again)."""
    model = models("llama-110m", "Q8_0")
    (tmp_path / "keys").write_text("a tenant=A max_inflight=2\n")
    srv = Server(model, "--api_keys_file", tmp_path / "keys", "--n_ctx", 512)
    hdr = {"Content-Type": "application/json", "Authorization": "Bearer a"}
    running = lambda: metric(srv.metrics(), "vllm:num_requests_running", model_name=NAME) >= 1
    try:
        import time
        for _ in range(5):
            hold = threading.Thread(target=srv.request, args=("POST", "/v1/completions",
                                    {"prompt": "Once", "ignore_eos": True, "max_tokens": 480}, hdr))
            hold.start()
            end = time.time() + 30
            while not running() and time.time() < end:
                time.sleep(0.02)
            s, text, _ = srv.request("POST", "/v1/embeddings", {"input": [f"Story {i}" for i in range(10)]}, hdr)
            assert s == 200, text
            assert len(json.loads(text)["data"]) == 10
            # still held: a request for both slots is refused now
            still = srv.request("POST", "/v1/completions", {"prompt": "x", "max_tokens": 1, "n": 2}, hdr)[0] == 429
            hold.join()
            if still:
                break
        else:
            raise AssertionError("the completion never outlasted the embeddings request")
    finally:
        assert srv.stop() == 0


def test_tenant_cap_limits_the_window(tmp_path):
    """A tenant with max_inflight=2 may send 10 inputs in one request: they
    run 2 at a time (never a 400 or 429 for the count alone)."""
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    (tmp_path / "keys").write_text("a tenant=A max_inflight=2\n")
    srv = Server(STORIES, "--api_keys_file", tmp_path / "keys")
    try:
        s, text, _ = srv.request("POST", "/v1/embeddings", {"input": [f"Story {i}" for i in range(10)]},
                                 {"Content-Type": "application/json", "Authorization": "Bearer a"})
        assert s == 200, text
        assert len(json.loads(text)["data"]) == 10
        assert srv.request("POST", "/v1/embeddings", {"input": "x"})[0] == 401
    finally:
        assert srv.stop() == 0


def test_client_gone_cancels(story_srv):
    """A client that leaves in the middle of a long request: its inputs
    stop being computed (nothing stays running or waiting, and most of its
    204,800 tokens are never admitted to the engine)."""
    import socket
    import time
    body = json.dumps({"input": [[(i * 7 + j) % 500 + 3 for j in range(100)] for i in range(2048)]}).encode()
    assert len(body) < 1 << 20  # under max_body_bytes
    before = metric(story_srv.metrics(), "vllm:prompt_tokens_total", model_name=NAME)
    sock = socket.create_connection(("127.0.0.1", story_srv.port))
    sock.sendall(b"POST /v1/embeddings HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    end = time.time() + 60
    while time.time() < end and metric(story_srv.metrics(), "llm_requests_running") == 0:
        time.sleep(0.01)  # until its inputs run
    assert metric(story_srv.metrics(), "llm_requests_running") > 0
    sock.close()
    t0 = time.time()
    while time.time() < end:
        st = story_srv.metrics()
        if metric(st, "llm_requests_running") == 0 and metric(st, "llm_requests_waiting") == 0:
            break
        time.sleep(0.05)
    st = story_srv.metrics()
    assert metric(st, "llm_requests_running") == 0 and metric(st, "llm_requests_waiting") == 0
    done = metric(st, "vllm:prompt_tokens_total", model_name=NAME) - before
    print(f"stopped {time.time() - t0:.2f} s after the client left, {done:.0f} of 204800 tokens admitted")
    assert done < 204800 / 2
    assert story_srv.post("/v1/embeddings", {"input": "x"})[0] == 200


def with_pooling_type(src, out, value):
    """A copy of src with llama.pooling_type = value (the gguf package's
    metadata copier, as llama.cpp's converters write that key)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata
    reader = gguf.GGUFReader(str(src))
    writer = gguf.GGUFWriter(str(out), arch="llama", endianess=reader.endianess)
    copy_with_new_metadata(reader, writer, {"llama.pooling_type": MetadataDetails(gguf.GGUFValueType.UINT32, value)}, [])
    return out


def test_pooling_type_from_the_file(tmp_path):
    """embedding_pooling auto follows the GGUF's pooling_type: 1 is mean,
    3 last; a type we do not pool by (2, cls) leaves last."""
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    srv = Server(STORIES)
    try:
        want = {p: srv.post("/v1/embeddings", {"input": TEXTS[0], "pooling": p})[1]["data"][0]["embedding"]
                for p in ("mean", "last")}
    finally:
        assert srv.stop() == 0
    for value, pooling in ((1, "mean"), (3, "last"), (2, "last")):
        srv = Server(with_pooling_type(STORIES, tmp_path / f"p{value}.gguf", value))
        try:
            got = srv.post("/v1/embeddings", {"input": TEXTS[0]})[1]["data"][0]["embedding"]
            assert got == want[pooling], (value, pooling)
        finally:
            assert srv.stop() == 0
        assert f"embeddings: {pooling} pooling" in srv.log
