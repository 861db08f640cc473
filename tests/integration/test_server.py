"""llm-server black-box tests through real clients: the official `openai`
package (completions, streaming, n, seed, stop, logprobs, usage), raw HTTP
for the error table and probes, prometheus_client's parser for /metrics,
signals for the drain, and the YAML/env/flag configuration."""
import json
import pathlib
import signal
import socket
import threading
import time

import openai
import pytest

from harness import NAME, Server, failed_detail, metric, run, story, tool


@pytest.fixture(scope="module")
def srv(model):
    s = Server(model)
    yield s
    assert s.stop() == 0


def test_completion_matches_llm_generate(srv):
    c = srv.client()
    story()  # the comparison is of text: a real vocabulary
    r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=20, temperature=0)
    want = run(tool("llm-generate"), "-m", story(), "-p", "Once upon a time", "-n", 20, "--temp", 0).stdout
    assert r.choices[0].text == want[:-1]  # llm-generate ends with a newline
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 20 and r.usage.prompt_tokens > 3
    assert r.usage.total_tokens == r.usage.prompt_tokens + 20


def test_stream_equals_whole(srv):
    c = srv.client()
    whole = c.completions.create(model=NAME, prompt="The cat", max_tokens=24, temperature=0)
    chunks = list(c.completions.create(model=NAME, prompt="The cat", max_tokens=24, temperature=0,
                                       stream=True, stream_options={"include_usage": True}))
    text = "".join(ch.choices[0].text for ch in chunks if ch.choices)
    assert text == whole.choices[0].text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "length"
    assert len([ch for ch in chunks if ch.choices]) >= 10  # tokens arrive as they are made
    assert chunks[-1].usage.completion_tokens == 24 and not chunks[-1].choices


def test_stream_writes_per_step(srv):
    """The events of one engine step go out in one write: n=4 streamed
    choices make 4 events a step; one write each (the old way) fails it.
    (A stream held back whole to its end would pass: no bound from below
    that does not depend on timing.)"""
    c = srv.client()
    before = srv.metrics()
    kw = dict(model=NAME, prompt="The cat", max_tokens=12, temperature=0.9, seed=3, n=4, extra_body={"ignore_eos": True})
    chunks = list(c.completions.create(stream=True, **kw))
    after = srv.metrics()
    d = lambda name: metric(after, name) - metric(before, name)
    events, writes, steps = d("llm_stream_events_total"), d("llm_stream_writes_total"), d("llm_engine_steps_total")
    assert events == len(chunks) >= 4 * 12
    assert 1 <= writes <= steps + 1  # at most one a step, and the end's
    whole = c.completions.create(**kw)  # and the text is what it was
    for i in range(4):
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices[0].index == i) == whole.choices[i].text


def test_seed_n_stop_logprobs(srv):
    c = srv.client()
    a = c.completions.create(model=NAME, prompt="One day", max_tokens=16, temperature=0.9, seed=42, n=3)
    b = c.completions.create(model=NAME, prompt="One day", max_tokens=16, temperature=0.9, seed=42, n=3)
    assert [x.text for x in a.choices] == [x.text for x in b.choices]
    assert sorted(x.index for x in a.choices) == [0, 1, 2]
    assert len({x.text for x in a.choices}) > 1
    g = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=40, temperature=0)
    words = g.choices[0].text.split(" ")
    stop = " " + words[len(words) // 2]
    s = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=40, temperature=0, stop=[stop])
    assert s.choices[0].finish_reason == "stop"
    assert s.choices[0].text == g.choices[0].text[:g.choices[0].text.index(stop)]
    lp = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=5, temperature=0, logprobs=2)
    l0 = lp.choices[0].logprobs
    assert len(l0.tokens) == 5 and len(l0.token_logprobs) == 5
    # tokens whose texts coincide share one key of a top_logprobs object (OpenAI's format)
    assert all(x <= 0 for x in l0.token_logprobs) and all(1 <= len(t) <= 2 for t in l0.top_logprobs)
    assert "".join(l0.tokens).strip() == lp.choices[0].text.strip()


@pytest.mark.parametrize("body,status,param", [
    ('{"prompt": "x", "max_tokens": "ten"}', 400, "max_tokens"),
    ('{"prompt": "x", "temperature": 5}', 400, "temperature"),
    ('{"prompt": "x", "n": 0}', 400, "n"),
    ('{"prompt": "x", "top_p": 0}', 400, "top_p"),
    ('{"prompt": "x", "stop": [1, 2]}', 400, "stop"),
    ('{"prompt": "x", "stream": "yes"}', 400, "stream"),
    ('{"prompt": [1, -3]}', 400, "prompt"),
    ('{"prompt": 7}', 400, "prompt"),
    ('{"max_tokens": 5}', 400, "prompt"),
    ('{"prompt": "x", "model": "gpt-5"}', 404, "model"),
    ('{"prompt": "x", "max_tokens": 5000}', 400, "max_tokens"),
    ('{"prompt": "x",', 400, None),
    ('[1, 2]', 400, None),
    ('{"prompt": "x", "prompt": "y"}', 400, None),
])
def test_bad_requests(srv, body, status, param):
    s, text, _ = srv.request("POST", "/v1/completions", raw=body)
    assert s == status, text
    err = json.loads(text)["error"]
    assert err["message"] and err["type"]
    if param:
        assert err["param"] == param
    assert srv.get("/readyz")[0] == 200  # still serving


def test_routes_and_limits(srv):
    assert srv.request("GET", "/v1/completions")[0] == 405
    assert srv.get("/nope")[0] == 404
    s, text, _ = srv.request("POST", "/v1/completions", raw='{"prompt": "' + "a" * (2 << 20) + '"}')
    assert s == 413 and "limit" in json.loads(text)["error"]["message"]
    s, tok, _ = srv.post("/tokenize", {"content": "Once upon a time"})
    assert s == 200 and len(tok["tokens"]) > 3
    s, det, _ = srv.post("/detokenize", {"tokens": tok["tokens"]})
    assert s == 200 and det["content"].strip() == "Once upon a time"
    assert srv.post("/detokenize", {"tokens": [10 ** 9]})[0] == 400
    assert [m.id for m in srv.client().models.list().data] == [NAME]


def test_metrics_move(srv):
    before = srv.metrics()
    srv.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=8, temperature=0)
    after = srv.metrics()
    assert metric(after, "llm_generation_tokens_total") - metric(before, "llm_generation_tokens_total") == 8
    assert metric(after, "llm_http_requests_total", route="/v1/completions", status="2xx") > \
        metric(before, "llm_http_requests_total", route="/v1/completions", status="2xx")
    assert metric(after, "llm_time_to_first_token_seconds_count") > metric(before, "llm_time_to_first_token_seconds_count")
    for name in ("vllm:num_requests_waiting", "vllm:num_requests_running", "vllm:kv_cache_usage_perc"):
        assert (name, (("model_name", NAME),)) in after
    info = [k for k in after if k[0] == "vllm:cache_config_info"]
    assert info and dict(info[0][1])["block_size"] == "16"
    assert metric(after, "process_resident_memory_bytes") > 1e6
    assert metric(after, "llm_batch_size_tokens_count") > metric(before, "llm_batch_size_tokens_count")
    assert metric(after, "llm_batch_size_tokens_bucket", le="1") >= 7  # the decode steps of one stream


def test_disconnect_frees_request(models):
    """A client that goes away mid-stream: the request is cancelled (abort)
    and its KV blocks are free, long before max_tokens."""
    srv = Server(models("llama-110m", "Q8_0"))
    sock = socket.create_connection(("127.0.0.1", srv.port))
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": 1000, "temperature": 0.5, "stream": True,
                       "ignore_eos": True})  # an early end of text would leave nothing to abort
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    got = b""
    while b"data:" not in got:
        part = sock.recv(4096)
        assert part, "stream ended before its first token"
        got += part
    sock.close()
    for _ in range(200):
        m = srv.metrics()
        if metric(m, "llm_request_success_total", finished_reason="abort") >= 1 and metric(m, "vllm:num_requests_running", model_name=NAME) == 0:
            break
        time.sleep(0.05)
    assert metric(m, "llm_request_success_total", finished_reason="abort") == 1
    assert metric(m, "vllm:kv_cache_usage_perc", model_name=NAME) == 0
    assert metric(m, "llm_generation_tokens_total") < 900
    assert srv.stop() == 0


def test_queue_full_429(model):
    s = Server(model, "--max_seqs", 1, "--max_waiting", 1, "--max_batch_tokens", 8)
    results = []

    def one():
        results.append(s.post("/v1/completions", {"prompt": "Once upon a time", "max_tokens": 60, "temperature": 0.5}))

    th = [threading.Thread(target=one) for _ in range(6)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    codes = sorted(r[0] for r in results)
    assert 200 in codes and 429 in codes, codes
    r429 = [r for r in results if r[0] == 429][0]
    assert r429[2].getheader("Retry-After") == "1" and r429[1]["error"]["type"] == "rate_limit_error"
    assert s.stop() == 0


def test_sigterm_drains(models):
    """SIGTERM with 20 streams in flight: readiness drops at once, new
    requests get 503, all 20 finish, exit code 0."""
    s = Server(models("llama-110m", "Q8_0"), "--drain_timeout_s", 600)  # sanitizer builds are slow
    name = s.client().models.list().data[0].id
    started, done = threading.Semaphore(0), []

    def stream():
        it = iter(s.client().completions.create(model=name, prompt="Once upon a time", max_tokens=50,
                                                temperature=0.5, stream=True, extra_body={"ignore_eos": True}))
        first = next(it)
        started.release()
        chunks = [first, *it]
        done.append(chunks[-1].choices[0].finish_reason)

    th = [threading.Thread(target=stream) for _ in range(20)]
    for t in th:
        t.start()
    for _ in th:
        assert started.acquire(timeout=300)
    t0 = time.time()
    assert s.get("/livez")[0] == 200
    assert time.time() - t0 < 0.5  # never waits behind the engine, even under full load
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.1)
    assert s.get("/readyz")[0] == 503
    assert s.post("/v1/completions", {"prompt": "x"})[0] == 503
    for t in th:
        t.join()
    assert done == ["length"] * 20
    assert s.stop() == 0


def test_shutdown_delay_keeps_serving(model):
    """shutdown_delay_s: after SIGTERM /readyz fails at once (endpoints drop
    the pod) but requests that still arrive are served until the delay
    ends; then (nothing in flight) the server exits 0."""
    s = Server(model, "--shutdown_delay_s", 2)
    t0 = time.time()
    s.proc.send_signal(signal.SIGTERM)
    time.sleep(0.2)
    assert s.get("/readyz")[0] == 503
    code, body, _ = s.post("/v1/completions", {"model": NAME, "prompt": "Once", "max_tokens": 2})
    assert code == 200 and body["usage"]["completion_tokens"] == 2, body
    assert s.stop() == 0
    assert time.time() - t0 >= 2
    assert "still taking requests for 2 s" in s.log


def test_model_sha256(model):
    """model_sha256: the right digest loads; a wrong one fails the load,
    /startupz saying so with both digests whole (what the controller shows
    as ModelChecksumMismatch: a platform team compares them with what it
    published; a model file's digest is no secret of its pod)."""
    import hashlib
    digest = hashlib.sha256(pathlib.Path(model).read_bytes()).hexdigest()
    s = Server(model, "--model_sha256", digest.upper())
    assert s.get("/readyz")[0] == 200
    assert s.stop() == 0
    s = Server(model, "--model_sha256", "0" * 64, wait=False)
    detail = failed_detail(s, 30)
    assert "sha256 mismatch" in detail and f"the file's is {digest}, expected {'0' * 64}" in detail, detail
    assert s.stop() == 0


def test_injected_faults(model):
    """fault_error_ratio / fault_delay_ms (for testing canaries): exactly
    that share of completions fail with a 500 saying so; each waits the delay."""
    s = Server(model, "--fault_error_ratio", 0.25, "--fault_delay_ms", 50)
    try:
        t0 = time.time()
        codes = [s.post("/v1/completions", {"model": NAME, "prompt": "Once", "max_tokens": 1})[:2] for _ in range(8)]
        assert time.time() - t0 >= 8 * 0.05
        assert [c for c, _ in codes].count(500) == 2 and [c for c, _ in codes].count(200) == 6
        assert all("injected fault" in b["error"]["message"] for c, b in codes if c == 500)
        assert s.get("/readyz")[0] == 200  # probes are not affected
    finally:
        assert s.stop() == 0


def test_config_sources(tmp_path, model):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("port: 1\nmax_seqs: 3\nmodel_name: from-file\n")
    s = Server(model, "--config", cfg, "--model_name", "from-flag", env={"LLM_SERVER_MODEL_NAME": "from-env",
                                                                           "LLM_SERVER_MAX_SEQS": "5"})
    assert [m.id for m in s.client().models.list().data] == ["from-flag"]  # flag > env > file
    assert s.stop() == 0
    bad = tmp_path / "bad.yaml"
    bad.write_text("max_seqz: 3\n")
    r = run(tool("llm-server"), "-m", model, "--config", bad, check=False)
    assert r.returncode == 2 and "unknown key 'max_seqz'" in r.stderr
    r = run(tool("llm-server"), "-m", model, "--port", "99999", check=False)
    assert r.returncode == 2 and "port" in r.stderr and "99999" in r.stderr
    r = run(tool("llm-server"), check=False)
    assert r.returncode == 2 and "model is required" in r.stderr
    r = run(tool("llm-server"), "-m", model, "--cpu_pack", "maybe", check=False)
    assert r.returncode == 2 and "cpu_pack 'maybe' is not auto, on or off" in r.stderr


def test_api_keys_and_loading_probes(tmp_path, model):
    s = Server(model, env={"LLM_SERVER_API_KEYS": "k1,k2"})
    with pytest.raises(openai.AuthenticationError):
        s.client("wrong").models.list()
    assert s.client("k2").models.list().data[0].id == NAME
    assert s.get("/livez")[0] == 200 and s.get("/startupz")[0] == 200
    assert s.stop() == 0
    # loading logs its progress; one warm-up token ran before ready
    assert "paging in the weights: 100%" in s.log and "warm-up done" in s.log
    assert s.log.index("warm-up done") < s.log.index("ready: serving")
    f = Server(tmp_path / "missing.gguf", wait=False)
    st, text = 0, ""
    for _ in range(200):
        try:
            st, text, _ = f.get("/startupz")
        except OSError:  # not listening yet
            pass
        if "failed" in text:
            break
        time.sleep(0.05)
    assert st == 503 and "missing.gguf" in json.loads(text)["detail"]
    assert f.get("/readyz")[0] == 503 and f.get("/livez")[0] == 503
    assert f.stop() == 0


def test_chat(srv):
    c = srv.client()
    msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Tell me a story."}]
    whole = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=20, temperature=0)
    m = whole.choices[0]
    assert m.message.role == "assistant" and m.message.content and m.finish_reason == "length"
    # the prompt is the chatml rendering (stories260K has no template of its own)
    rendered = ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nTell me a story.<|im_end|>\n"
                "<|im_start|>assistant\n")
    assert whole.usage.prompt_tokens == len(srv.post("/tokenize", {"content": rendered})[1]["tokens"])
    chunks = list(c.chat.completions.create(model=NAME, messages=msgs, max_tokens=20, temperature=0,
                                            stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(ch.choices[0].delta.content or "" for ch in chunks) == m.message.content
    assert chunks[-1].choices[0].finish_reason == "length"
    two = c.chat.completions.create(model=NAME, messages=msgs, max_tokens=12, temperature=1.0, seed=5, n=2)
    assert sorted(x.index for x in two.choices) == [0, 1] and two.usage.completion_tokens == 24
    parts = [{"role": "user", "content": [{"type": "text", "text": "Tell me "}, {"type": "text", "text": "a story."}]}]
    p = c.chat.completions.create(model=NAME, messages=parts, max_tokens=5, temperature=0, logprobs=True,
                                  top_logprobs=3)
    lp = p.choices[0].logprobs.content
    assert len(lp) == 5 and all(len(x.top_logprobs) == 3 and x.logprob <= 0 for x in lp)


@pytest.mark.parametrize("body,param", [
    ('{"messages": []}', "messages"),
    ('{"messages": [{"role": "user<|im_start|>", "content": "x"}]}', "messages"),
    ('{"messages": [{"role": "assistant", "tool_calls": [{"function": {"arguments": "{}"}}]}]}', "messages"),
    ('{"messages": [{"role": "user", "content": 5}]}', "messages"),
    ('{"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}', "messages"),
    ('{"messages": [{"content": "x"}]}', "messages"),
    ('{"messages": [{"role": "user", "content": "x"}], "top_logprobs": 50}', "top_logprobs"),
])
def test_bad_chat(srv, body, param):
    s, text, _ = srv.request("POST", "/v1/chat/completions", raw=body)
    assert s == 400 and json.loads(text)["error"]["param"] == param, text


def test_generate_route(srv):
    s, r, _ = srv.post("/generate", {"text": "Once upon a time", "max_tokens": 20, "temperature": 0})
    want = srv.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=20, temperature=0)
    assert s == 200 and r["text"] == want.choices[0].text and r["usage"]["completion_tokens"] == 20
    assert srv.post("/generate", {"prompt": "x"})[0] == 400
    assert srv.post("/generate", {"text": "x", "stream": True})[0] == 400


def test_request_deadline(models):
    s = Server(models("llama-110m", "Q8_0"), "--request_timeout_s", 1)
    name = s.client().models.list().data[0].id
    t0 = time.time()
    # ignore_eos: a sampled end of text before the deadline would answer 200
    st, r, _ = s.post("/v1/completions", {"model": name, "prompt": "x", "max_tokens": 1000, "ignore_eos": True})
    assert st == 504 and "deadline" in r["error"]["message"] and time.time() - t0 < 10
    m = s.metrics()
    assert metric(m, "vllm:num_requests_running", model_name=NAME) == 0 and metric(m, "vllm:kv_cache_usage_perc", model_name=NAME) == 0
    assert s.stop() == 0
