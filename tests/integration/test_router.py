"""llm-router in front of real llm-server backends: answers pass through
unchanged (streams too), load goes to the least busy backend, a session
stays on one backend, a killed backend is ejected with no request lost, a
client that leaves cancels its request on the backend, bad input and no
backends get clear errors, and backends can come from a Service's
EndpointSlices (kubesim)."""
import json
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from harness import Cluster, NAME, Router, Server, running, tool, wait_for


def status_of(url):
    try:
        return urllib.request.urlopen(url, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.fixture()
def two(models):
    """Two llm-server backends (one sequence at a time each) of a model slow
    enough to keep one busy, and their URLs."""
    m = models("llama-110m", "Q8_0")
    a, b = Server(m, "--max_seqs", 1), Server(m, "--max_seqs", 1)
    yield a, b
    for s in (a, b):
        if s.proc.poll() is None:
            s.stop()


def short(**kw):
    return {"model": NAME, "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0, **kw}


def test_pass_through_and_spread(two):
    a, b = two
    r = Router("--backend", a.base, "--backend", b.base)
    try:
        direct = a.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
        via = r.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
        assert via.choices[0].text == direct.choices[0].text and via.usage == direct.usage
        chunks = list(r.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12,
                                                    temperature=0, stream=True))
        assert len(chunks) >= 2 and "".join(c.choices[0].text for c in chunks) == direct.choices[0].text
        chat = r.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=3)
        assert chat.usage.completion_tokens == 3
        assert [m.id for m in r.client().models.list().data] == [NAME]
        seen = {r.post(short())[2] for _ in range(6)}
        assert seen == {a.base, b.base}  # idle backends tie: the choice rotates
        with pytest.raises(openai.BadRequestError):  # the backend's own 400 passes through
            r.client().completions.create(model=NAME, prompt="x", max_tokens=-1)
        m = r.metrics()
        assert sum(v for (n, lab), v in m.items() if n == "llm_router_requests_total" and ("code", "2xx") in lab) >= 10
        assert m[("llm_router_requests_total", (("backend", a.base), ("code", "4xx")))] + \
            m[("llm_router_requests_total", (("backend", b.base), ("code", "4xx")))] == 1
    finally:
        assert r.stop() == 0


def test_least_loaded_avoids_the_busy_backend(two):
    a, b = two
    r = Router("--backend", a.base, "--backend", b.base)
    try:
        busy = {}

        def long_request():
            busy["r"] = r.post(short(max_tokens=400, ignore_eos=True), timeout=120)
        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.5)
        hits = [r.post(short())[2] for _ in range(5)]
        t.join()
        owner = busy["r"][2]
        assert busy["r"][0] == 200 and all(h != owner for h in hits), (owner, hits)
    finally:
        assert r.stop() == 0


def test_session_affinity(two):
    a, b = two
    r = Router("--backend", a.base, "--backend", b.base, "--affinity-user")
    try:
        for who in ("alice", "bob", "carol", "dave"):
            by_header = {r.post(short(), {"X-Session-Id": who})[2] for _ in range(4)}
            by_user = {r.post(short(user=who + "-u"))[2] for _ in range(4)}
            assert len(by_header) == 1 and len(by_user) == 1
    finally:
        assert r.stop() == 0


def test_prefix_affinity(two):
    """--prefix-affinity: requests whose prompts share their first bytes go
    to one backend (its prefix cache holds them); other prefixes spread."""
    a, b = two
    r = Router("--backend", a.base, "--backend", b.base, "--prefix-affinity", 48)
    try:
        doc = "You are a helpful assistant for the city library. Answer briefly. "
        for topic in ("hours", "cards", "books", "rooms"):
            same = {r.post(short(prompt=doc + f"Question {i} about {topic}?"))[2] for i in range(4)}
            assert len(same) == 1
        spread = {r.post(short(prompt=f"{i} " * 30))[2] for i in range(12)}
        assert spread == {a.base, b.base}
        chat = {r.post({"model": NAME, "messages": [{"role": "system", "content": doc}, {"role": "user", "content": q}],
                        "max_tokens": 2}, path="/v1/chat/completions")[2] for q in ("a?", "b?", "c?")}
        assert len(chat) == 1
    finally:
        assert r.stop() == 0


def chat_turn(r, messages, stream):
    """One chat request through the router: (pod, prompt_tokens, cached_tokens, answer text); a stream asks for
    its usage (stream_options.include_usage), which comes in its last event."""
    body = {"model": NAME, "messages": messages, "max_tokens": 4, "temperature": 0}
    if stream:
        body.update(stream=True, stream_options={"include_usage": True})
    req = urllib.request.Request(r.base + "/v1/chat/completions", json.dumps(body).encode(),
                                 {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            pod, raw = resp.headers.get("X-Backend"), resp.read().decode()
    except urllib.error.HTTPError as e:
        raise AssertionError(f"{e.code}: {e.read()!r}") from None
    if not stream:
        a = json.loads(raw)
        return pod, a["usage"]["prompt_tokens"], a["usage"]["prompt_tokens_details"]["cached_tokens"], \
            a["choices"][0]["message"]["content"]
    events = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: {")]
    usage = events[-1]["usage"]
    text = "".join(e["choices"][0]["delta"].get("content") or "" for e in events if e.get("choices"))
    return pod, usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"], text


def test_cache_aware_keeps_each_conversation_where_its_prefix_is(models):
    """The default policy, cache-aware, against round robin on the same trace in the same test: five
    conversations, each with its own ~480-byte system prompt, three turns each, taken turn by turn over three
    idle pods. Cache-aware sends every turn of a conversation to the pod its first turn went to, and the pods'
    own usage says most prompt tokens came from their caches; round robin moves each turn to another pod and
    finds almost none. The router's per-pod usage counters add up to what the answers said (read from whole
    answers and from streams' last event)."""
    m = models("llama-110m", "Q8_0")  # a context of 1024: three turns fit
    servers = [Server(m) for _ in range(3)]
    try:
        share = {}
        for policy in ("cache-aware", "round-robin"):
            args = [x for s in servers for x in ("--backend", s.base)]
            r = Router(*args, *(["--policy", policy] if policy != "cache-aware" else []))
            try:
                convs = [[{"role": "system", "content": f"[{policy} {c}] " + " ".join(
                    f"Rule {k}: answer the {c}th guest about room {k * 7 + c}." for k in range(10))}] for c in range(5)]
                pods, prompt, cached = {c: set() for c in range(5)}, 0, 0
                for turn in range(3):
                    for c, msgs in enumerate(convs):
                        msgs.append({"role": "user", "content": f"Question {turn} of guest {c}?"})
                        pod, p, k, text = chat_turn(r, msgs, stream=c % 2 == 1)
                        msgs.append({"role": "assistant", "content": text})
                        pods[c].add(pod)
                        prompt, cached = prompt + p, cached + k
                share[policy] = cached / prompt
                m = r.metrics()
                said = {n: sum(v for (name, _), v in m.items() if name == n)
                        for n in ("llm_router_backend_prompt_tokens_total", "llm_router_backend_cached_tokens_total")}
                assert said == {"llm_router_backend_prompt_tokens_total": prompt,
                                "llm_router_backend_cached_tokens_total": cached}, said
                if policy == "cache-aware":
                    assert all(len(v) == 1 for v in pods.values()), pods
                    assert len(set().union(*pods.values())) >= 2, pods  # the conversations spread over the pods
                else:
                    assert all(len(v) == 3 for v in pods.values()), pods
            finally:
                assert r.stop() == 0
        print("shares of prompt tokens cached:", share)
        assert share["cache-aware"] >= 0.4 and share["round-robin"] <= share["cache-aware"] / 2, share
    finally:
        for s in servers:
            s.stop()


def test_killed_backend_is_ejected_and_nothing_lost(two):
    a, b = two
    r = Router("--backend", a.base, "--backend", b.base, "--eject-after", 2, "--eject-seconds", 30)
    try:
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        results = [r.post(short()) for _ in range(10)]
        assert all(code == 200 and backend == a.base for code, _, backend in results), results
        m = wait_for(lambda: (m := r.metrics())[("llm_router_backend_up", (("backend", b.base),))] == 0 and m, 5)
        assert m[("llm_router_backend_ejections_total", (("backend", b.base),))] >= 1
    finally:
        assert r.stop() == 0


def test_client_leaving_cancels_on_the_backend(two):
    a, b = two
    r = Router("--backend", a.base)
    try:
        s = socket.create_connection(("127.0.0.1", r.port))
        body = json.dumps(short(max_tokens=400, ignore_eos=True, stream=True)).encode()
        s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        s.settimeout(30)
        got = b""
        while b"data: " not in got:  # the head and the first event may come in separate reads
            chunk = s.recv(65536)
            assert chunk, got
            got += chunk
        s.close()
        wait_for(lambda: a.metrics().get(("llm_request_success_total", (("finished_reason", "abort"),))) == 1, 10)
        assert a.metrics()[("llm_requests_running", ())] == 0
    finally:
        assert r.stop() == 0


def test_errors(two, tmp_path):
    a, b = two
    r = Router("--backend", "http://127.0.0.1:1", "--max-body-bytes", 1000, "--retries", 1)
    try:
        code, body, _ = r.post(short())
        assert code == 503 and "no backend could take the request" in body["error"]["message"]
        code, body, _ = r.post(short(prompt="x" * 2000))
        assert code == 413 and "limit" in body["error"]["message"]
        assert r.code("/readyz") == 200 and r.metrics()[("llm_router_no_backend_total", ())] == 1
    finally:
        assert r.stop() == 0
    for bad in (["--port", "1"], ["--backend", a.base, "--service", "x/y"], ["--backend", a.base, "--retries", "x"]):
        p = subprocess.run([tool("llm-router"), *bad], capture_output=True, text=True, timeout=10)
        assert p.returncode == 2 and "usage" in p.stderr
    p = subprocess.run([tool("llm-router"), "--host", "127.0.0.1", "--port", "18437", "--health-port", "18437",
                        "--backend", a.base], capture_output=True, text=True, timeout=10)
    assert p.returncode == 2 and "--health-port 18437 is the API port" in p.stderr, p.stderr


def test_backends_from_endpointslices(tmp_path, models):
    """--service NS/NAME: the router follows the Service's ready endpoints
    as an LLMDeployment scales."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    c = Cluster(tmp_path, models("tiny", "Q8_0"))
    r = None
    try:
        c.controller()
        c.apply(replicas=2)
        wait_for(lambda: len(c.ready_ips()) == 2, 90)
        r = Router("--service", "default/story", "--kubeconfig", c.dir / "kubeconfig")
        wait_for(lambda: r.code("/readyz") == 200, 20)
        wait_for(lambda: r.metrics().get(("llm_router_backends", ()), 0) == 2, 30)  # both known before the count
        hits = {r.post({"model": "story", "prompt": "Once", "max_tokens": 2})[2] for _ in range(6)}
        # X-Backend names the pod (the endpoint's targetRef), not its address
        subsets = (c.get("endpoints", "story") or {}).get("subsets") or []
        pods = {a["targetRef"]["name"] for s in subsets for a in s.get("addresses", [])}
        assert len(pods) == 2 and hits == pods, (hits, pods)
        assert not any(h.startswith("http") or "127.0.0." in h for h in hits)
        c.k("scale", "llmd/story", "--replicas=1")
        wait_for(lambda: len(c.ready_ips()) == 1, 60)
        wait_for(lambda: sum(1 for (n, _), v in r.metrics().items() if n == "llm_router_backend_up") == 1, 20)
        assert all(r.post({"model": "story", "prompt": "Once", "max_tokens": 2})[0] == 200 for _ in range(4))
    finally:
        if r:
            assert r.stop() == 0
        c.close()


def admin(r, body, token="t"):
    req = urllib.request.Request(r.base + "/admin/canary", json.dumps(body).encode(),
                                 {"Content-Type": "application/json", **({"Authorization": f"Bearer {token}"}
                                                                          if token else {})})
    try:
        return urllib.request.urlopen(req, timeout=5).status
    except urllib.error.HTTPError as e:
        return e.code


def test_canary_split_and_revision_metrics(two):
    """Stable and canary backends: the canary gets exactly its weight of
    the requests, the weight changes at run time through the admin
    endpoint, a session keeps its revision, per-revision counts and
    time-to-first-byte are exported, and a dead canary sends all to stable."""
    a, b = two
    r = Router("--backend", a.base, "--canary-backend", b.base, "--canary-weight", 20, "--admin-token", "t")
    try:
        hits = [r.post(short())[2] for _ in range(50)]
        assert hits.count(b.base) == 10 and hits.count(a.base) == 40
        assert admin(r, {"weight": 50}, token="wrong") == 401 and admin(r, {"weight": 101}) == 400
        assert admin(r, {"weight": 50}) == 200
        hits = [r.post(short())[2] for _ in range(20)]
        assert hits.count(b.base) == 10
        for who in ("s1", "s2", "s3", "s4", "s5", "s6"):
            assert len({r.post(short(), {"X-Session-Id": who})[2] for _ in range(3)}) == 1
        m = r.metrics()
        assert m[("llm_router_canary_weight", ())] == 50
        assert m[("llm_router_revision_requests_total", (("code", "2xx"), ("revision", "canary")))] >= 20
        assert m[("llm_router_revision_ttfb_seconds_count", (("revision", "stable"),))] >= 50
        b.proc.send_signal(signal.SIGKILL)
        b.proc.wait()
        assert all(r.post(short())[:3:2] == (200, a.base) for _ in range(10))
    finally:
        assert r.stop() == 0
    r = Router("--backend", a.base)
    try:
        assert admin(r, {"weight": 10}) == 404  # no --admin-token: no admin
    finally:
        assert r.stop() == 0


def test_failing_canary_is_masked_but_counted(models):
    """A canary that fails every request (fault_error_ratio 1): clients see
    no error - each failure is retried on stable before any byte went out -
    while the router counts the canary's 5xx for the analysis."""
    m = models("tiny", "Q8_0")
    good, bad = Server(m), Server(m, "--fault_error_ratio", 1)
    r = Router("--backend", good.base, "--canary-backend", bad.base, "--canary-weight", 50, "--eject-after", 100)
    try:
        results = [r.post(short()) for _ in range(20)]
        assert all(code == 200 and backend == good.base for code, _, backend in results)
        met = r.metrics()
        assert met[("llm_router_revision_requests_total", (("code", "5xx"), ("revision", "canary")))] == 10
        assert met[("llm_router_revision_requests_total", (("code", "2xx"), ("revision", "stable")))] == 20
    finally:
        assert r.stop() == 0
        good.stop()
        bad.stop()


def test_scale_from_zero_holds_requests(tmp_path, models):
    """No backend at all (replicas 0): requests are held (a stream gets its
    200 and keep-alive comments), at most --hold-max of them (beyond: 503
    with Retry-After); when a pod becomes ready they are served; a hold
    that outlasts --hold-seconds ends in 503."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    c = Cluster(tmp_path, models("tiny", "Q8_0"))
    r = quick = None
    try:
        c.controller()
        c.apply(replicas=0)
        wait_for(lambda: c.status().get("phase") == "Idle", 30)  # replicas 0
        svc = ["--service", "default/story", "--kubeconfig", c.dir / "kubeconfig"]
        quick = Router(*svc, "--hold-seconds", 1)
        t0 = time.time()
        code, body, _ = quick.post({"model": "story", "prompt": "Once", "max_tokens": 2})
        assert code == 503 and time.time() - t0 >= 1
        r = Router(*svc, "--hold-seconds", 60, "--hold-max", 2)
        out = {}

        def plain():
            out["plain"] = r.post({"model": "story", "prompt": "Once", "max_tokens": 2}, timeout=90)

        def stream():
            s = socket.create_connection(("127.0.0.1", r.port))
            body = json.dumps({"model": "story", "prompt": "Once", "max_tokens": 2, "stream": True}).encode()
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                      b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
            data = b""
            while chunk := s.recv(65536):
                data += chunk
            out["stream"] = data.decode(errors="replace")
        th = [threading.Thread(target=plain), threading.Thread(target=stream)]
        for t in th:
            t.start()
        wait_for(lambda: r.metrics()[("llm_router_held_requests", ())] == 2, 10)
        req = urllib.request.Request(r.base + "/v1/completions", b'{"model":"story","prompt":"x"}',
                                     {"Content-Type": "application/json"})
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(req, timeout=10)
        assert e.value.code == 503 and e.value.headers["Retry-After"] == "1"
        time.sleep(2.5)  # the held stream gets keep-alive comments meanwhile
        c.k("scale", "llmd/story", "--replicas=1")
        for t in th:
            t.join(timeout=90)
        assert out["plain"][0] == 200 and out["plain"][1]["usage"]["completion_tokens"] == 2
        assert out["stream"].startswith("HTTP/1.1 200") and ": waiting for a backend" in out["stream"]
        assert "data: [DONE]" in out["stream"] and '"text_completion"' in out["stream"]
        assert r.metrics()[("llm_router_held_total", ())] == 2
    finally:
        for x in (r, quick):
            if x:
                assert x.stop() == 0
        c.close()


def test_controller_runs_the_router(tmp_path, models):
    """spec.router.enabled: the controller runs llm-router pods (with their
    own ServiceAccount allowed to read EndpointSlices) behind the Service,
    following the llm-server pods through NAME-backends; a completion
    through the Service reaches a server pod via the router; turned off,
    the router's objects (its ServiceAccount, Role and RoleBinding too) go
    and the Service reaches the pods again."""
    with running(tmp_path, models("tiny", "Q8_0")) as c:
        c.controller()
        c.apply(replicas=2, extra="  router: {enabled: true, image: llm-router:test, replicas: 1}\n")
        wait_for(lambda: c.status().get("phase") == "Ready", 90)
        backends = wait_for(lambda: len(ips := c.ready_ips("story-backends")) == 2 and ips, 60)
        router_ip = wait_for(lambda: c.ready_ips("story"), 60)[0]
        assert router_ip not in backends
        ep = c.get("endpoints", "story")["subsets"][0]["ports"][0]["port"]
        assert ep == 8000
        sa = c.get("deployment", "story-router")["spec"]["template"]["spec"]["serviceAccountName"]
        assert sa == "story-router" and c.get("rolebinding", "story-router")["roleRef"]["name"] == "story-router"

        def through_router():
            req = urllib.request.Request(f"http://{router_ip}:8000/v1/completions",
                                         json.dumps({"model": "story", "prompt": "Once", "max_tokens": 2}).encode(),
                                         {"Content-Type": "application/json"})
            try:
                r = urllib.request.urlopen(req, timeout=30)
                # the router answered (X-Revision); it names no pod by default (no X-Backend, no address)
                return r.status == 200 and r.headers["X-Revision"] == "stable" and r.headers["X-Backend"] is None
            except OSError:
                return False
        assert all(wait_for(through_router, 30) for _ in range(6))
        c.k("patch", "llmd", "story", "--type", "merge", "-p", '{"spec":{"router":{"enabled":false}}}')
        wait_for(lambda: c.get("deployment", "story-router") is None and c.get("service", "story-backends") is None, 30)
        wait_for(lambda: sorted(c.ready_ips("story")) == sorted(backends), 30)
        # its identity goes too: no ServiceAccount left bound to a Role that reads EndpointSlices
        wait_for(lambda: all(c.get(kind, "story-router") is None for kind in ("rolebinding", "role", "serviceaccount")), 30)


def test_gateway_serves_every_model_from_one_endpoint(tmp_path, models):
    """llm-router --routes: two deployments behind one endpoint, through the official openai client. base-m
    (one pod) and tuned-m (a stable pod and a canary pod at weight 50, both with LoRA adapter ad): /v1/models lists
    base-m, tuned-m and ad; each model reaches its own pods; the adapter goes where it is loaded; the canary
    split holds per route (exactly half, by the smooth counter); a model no route serves gets 404 naming what
    is; a name with control characters is shown printable, one of 10 MB is refused with 400 and the gateway
    serves on; the metrics carry each route's label."""
    base = models("tiny", "Q8_0")
    ad = tmp_path / "ad.gguf"
    subprocess.run([tool("llm-mkmodel"), "--lora-of", str(base), "--rank", "4", "-o", str(ad)], check=True,
                   capture_output=True)
    b1 = Server(base, "--model_name", "base-m")
    t1, t2 = (Server(base, "--model_name", "tuned-m", "--lora", f"ad={ad}") for _ in range(2))
    table = tmp_path / "routes.json"
    table.write_text(json.dumps({"routes": [
        {"name": "base", "models": ["base-m"], "backends": [f"b1={b1.base}"]},
        {"name": "tuned", "models": ["tuned-m"], "backends": [f"t1={t1.base}"], "canaryBackends": [f"t2={t2.base}"],
         "weight": 50}]}))
    r = Router("--routes", table, "--max-body-bytes", 16 << 20)
    try:
        oa = r.client()
        wait_for(lambda: {m.id for m in oa.models.list().data} == {"base-m", "tuned-m", "ad"}, 30,
                 "the gateway listing the adapter its pods loaded")
        owners = {m.id: m.owned_by for m in oa.models.list().data}
        assert owners == {"base-m": "base", "tuned-m": "tuned", "ad": "tuned"}, owners

        def pod(model):
            raw = oa.completions.with_raw_response.create(model=model, prompt="Once upon a time", max_tokens=2)
            assert raw.parse().model == model
            return raw.headers["X-Backend"], raw.headers["X-Revision"]
        assert {pod("base-m") for _ in range(4)} == {("b1", "stable")}
        split = [pod("tuned-m") for _ in range(8)]
        assert sorted(split) == [("t1", "stable")] * 4 + [("t2", "canary")] * 4, split
        assert {pod("ad")[0] for _ in range(6)} <= {"t1", "t2"}
        with pytest.raises(openai.NotFoundError) as e:
            oa.completions.create(model="gpt-4", prompt="hi", max_tokens=1)
        assert "model 'gpt-4' is not served here; served: base-m, tuned-m" in str(e.value), e.value
        assert e.value.body["code"] == "model_not_found"
        code, body, _ = r.post({"model": "evil\n\x1b[31m", "prompt": "x"})
        assert code == 404 and "model 'evil??[31m' is not served" in body["error"]["message"], body
        code, body, _ = r.post({"model": "m" * (10 << 20), "prompt": "x"}, timeout=120)
        assert code == 400 and "at most 256 bytes" in body["error"]["message"], body
        # cut or NUL-ended names must not pass for a served one: 255 bytes + a 4-byte character, "base-m\0..."
        for sly in ("b" * 255 + "\U0001F600", "base-m\u0000x"):
            code, body, _ = r.post({"model": sly, "prompt": "x"})
            assert code == 400 and "no NUL" in body["error"]["message"], (sly[:8], body)
        code, body, _ = r.post({"prompt": "x", "max_tokens": 1})  # two routes: the model must choose
        assert code == 400 and "the body's \"model\" chooses one" in body["error"]["message"], body
        assert pod("base-m") == ("b1", "stable")
        m = r.metrics()
        assert m[("llm_router_routes", ())] == 2
        assert m[("llm_router_requests_total", (("backend", "t2"), ("code", "2xx"), ("route", "tuned")))] >= 4
        assert m[("llm_router_canary_weight", (("route", "tuned"),))] == 50
        # ?route=NAME (what the controller reads): that route's series alone, as on the whole page
        one = r.metrics("?route=tuned")
        assert one and {dict(k[1]).get("route") for k in one} == {"tuned"}, sorted(one)[:5]
        assert set(one) == {k for k in r.metrics() if dict(k[1]).get("route") == "tuned"}
        key = ("llm_router_requests_total", (("backend", "t2"), ("code", "2xx"), ("route", "tuned")))
        assert one[key] == m[key]  # (no request since)
        assert r.metrics("?route=nowhere") == {}
        with pytest.raises(urllib.error.HTTPError) as e:
            r.metrics("?route=" + "x" * 300)
        assert e.value.code == 400
        # without tenant keys the API port serves the same page (the health port is the harness's default)
        assert r.metrics("?route=tuned", api=True) == r.metrics("?route=tuned")
        assert ("llm_router_routes", ()) in r.metrics(api=True)
        assert [status_of(r.health + p) for p in ("/healthz", "/readyz", "/v1/models")] == [200, 200, 404]
    finally:
        assert r.stop() == 0
        for s in (b1, t1, t2):
            s.stop()
