"""Every request bounded (issue 40): the bodies that killed llm-server and
llm-router (deep JSON in the body, a schema's const or enum, a pattern,
tool-call arguments, a tool call the model itself nests), the router
carrying one killer to every replica, one client's errors turning the
router away from a healthy backend, JSON that costs 70x its bytes, a
health port held by idle connections, the tokenizer's cost, and the
smaller points (framing, CORS, content types, headers, metrics access).
Each test fails on the binaries before the fix and prints what it
measured; each checks afterwards that no process died."""
import http.client
import json
import socket
import threading
import time

import subprocess

from harness import (
    CHAT, Cluster, FakeBackend, KILLERS, Router, Server, alive, free_port, health_metrics, metrics, nest, post,
    probe_ms, raw, rss_mb, sanitized, schema_body, tool, wait_for)


def test_deep_bodies_get_400_naming_the_limit(models):
    """The bodies that crashed llm-server (52 groups: 246 bytes; 250 deep:
    706 bytes; 1,000 deep: 2 KB) get a 400 naming the limit, the server
    lives on, and a pattern at 52 groups (below the limit of 64) works."""
    srv = Server(models("tiny", "Q8_0"))
    try:
        for what, path, body, needle in KILLERS:
            code, got, _ = post(srv.port, path, body)
            print(f"{what} ({len(body)} bytes): {code} {got['error']['message'][:90]}")
            assert code == 400 and needle in got["error"]["message"], (what, code, got)
            alive(srv)
        code, got, _ = post(srv.port, "/v1/chat/completions",
                            {**schema_body({"type": "string", "pattern": "^" + "(" * 52 + "a" + ")" * 52 + "$"}),
                             "max_tokens": 40})
        assert code == 200 and got["choices"][0]["message"]["content"].strip() == '"a"', got
    finally:
        assert srv.stop() == 0


def test_model_output_nested_too_deep_ends_the_request(models):
    """A tool call the model writes 300 deep (a grammar makes it) ends that
    request with a 400 saying so; it crashed llm-server while it parsed the
    call."""
    srv = Server(models("llama-110m", "Q8_0"))
    try:
        grammar = ('root ::= "{\\"tool_calls\\":[{\\"name\\":\\"f\\",\\"arguments\\":{\\"a\\":' + nest(300) + '}}]}"')
        body = {**CHAT, "max_tokens": 700, "grammar": grammar,
                "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]}
        for stream in (False, True):
            code, got, _ = post(srv.port, "/v1/chat/completions", {**body, "stream": stream})
            text = got if stream else got["error"]["message"]
            print(f"stream {stream}: {code} {str(text)[-160:]}")
            if stream:  # the head went out: the error is the stream's last event
                assert code == 200 and "nests JSON deeper than 64" in text and "[DONE]" in text
            else:
                assert code == 400 and "nests JSON deeper than 64" in text
            alive(srv)
    finally:
        assert srv.stop() == 0


def ok_answer(path, data, headers):
    return 200, b'{"ok":true}', {}


def router_metric(r, name, backend=None):
    return sum(v for (n, lab), v in r.metrics().items() if n == name and (backend is None or ("backend", backend) in lab))


def test_router_never_carries_a_killer_to_a_second_backend():
    """A backend that drops the connection once it has the whole request
    (it died of it) is not replaced by another: the client gets 502, the
    other backend never sees the request, the drop is counted. A backend
    that could not be reached at all still hands the request on."""
    ok, dies = FakeBackend(ok_answer), FakeBackend(lambda p, d, h: None)
    r = Router("--backend", dies.base, "--backend", ok.base, "--policy", "round-robin", "--eject-after", 100)
    try:
        codes = [post(r.port, "/v1/completions", {"prompt": "x"})[0] for _ in range(6)]
        print(f"codes {codes}; the dying backend saw {len(dies.seen)}, the other {len(ok.seen)}")
        assert sorted(codes) == [200] * 3 + [502] * 3, codes
        assert len(dies.seen) == 3 and len(ok.seen) == 3  # never the dying one's request on the other
        assert router_metric(r, "llm_router_backend_dropped_total", dies.base) == 3
    finally:
        r.stop()
        dies.close()
    gone = free_port()  # nothing listens there: unreached, so the request goes on
    r = Router("--backend", f"http://127.0.0.1:{gone}", "--backend", ok.base, "--policy", "round-robin")
    try:
        assert [post(r.port, "/v1/completions", {"prompt": "x"})[0] for _ in range(4)] == [200] * 4
    finally:
        r.stop()
        ok.close()


def test_deep_bodies_through_the_router_kill_nothing(models):
    """The killers through the router in front of two servers: each is
    refused at the router (too deep to carry) or by the backend it reached,
    and all three processes live on."""
    m = models("tiny", "Q8_0")
    a, b = Server(m), Server(m)
    r = Router("--backend", a.base, "--backend", b.base)
    try:
        for what, path, body, needle in KILLERS:
            code, got, _ = post(r.port, path, body)
            assert code == 400 and "deeper than 64" in got["error"]["message"], (what, code, got)
            alive(a, b, r)
        assert post(r.port, "/v1/completions", {"prompt": "Once", "max_tokens": 2})[0] == 200
    finally:
        r.stop()
        a.stop()
        b.stop()


def test_one_clients_errors_do_not_turn_the_router_away(models):
    """A backend's 503 without Retry-After is that one request's error: the
    client gets it, the backend is not passed by. Before, the router took
    any 503 as "busy", and two such requests a second made it refuse
    everyone. Also /detokenize of a lone byte token answers 200 (it was a
    503 "out of memory")."""
    fake = FakeBackend(lambda p, d, h: (503, b'{"error":{"message":"no"}}', {}) if p == "/detokenize"
                else (200, b'{"ok":true}', {}))
    r = Router("--backend", fake.base)
    stop, bad = threading.Event(), []

    def attacker():
        while not stop.is_set():
            bad.append(post(r.port, "/detokenize", {"tokens": [229]})[0])
            stop.wait(0.2)
    th = threading.Thread(target=attacker, daemon=True)
    th.start()
    try:
        wait_for(lambda: len(bad) >= 2, what="the attacker's first requests")
        codes = [post(r.port, "/v1/completions", {"prompt": "x"})[0] for _ in range(40)]
        stop.set()
        th.join()
        print(f"others: {codes.count(200)} of {len(codes)} answered 200 while one client drew {len(bad)} 503s")
        assert codes == [200] * 40 and set(bad) == {503}
    finally:
        stop.set()
        r.stop()
        fake.close()
    srv = Server(models("tiny", "Q8_0"))
    try:
        code, got, _ = post(srv.port, "/detokenize", {"tokens": [229]})  # a lone UTF-8 lead byte in this vocabulary
        assert code == 200 and got["content"] == "\ufffd", (code, got)
    finally:
        srv.stop()


def test_a_backends_own_deadline_is_not_retried_nor_a_fault(models):
    """A backend's 504 (its request_timeout_s) goes to the client: no other
    backend runs the request again, no breaker failure is counted. Three
    such requests ejected both backends before."""
    slow = FakeBackend(lambda p, d, h: (504, b'{"error":{"message":"the request ran past its deadline"}}', {}))
    other = FakeBackend(ok_answer)
    r = Router("--backend", slow.base, "--backend", other.base, "--policy", "round-robin", "--eject-after", 1)
    try:
        codes = [post(r.port, "/v1/completions", {"prompt": "x"})[0] for _ in range(6)]
        fails = router_metric(r, "llm_router_backend_failures_total")
        up = [v for (n, _), v in r.metrics().items() if n == "llm_router_backend_up"]
        print(f"codes {codes}, breaker failures {fails}, up {up}")
        assert sorted(codes) == [200] * 3 + [504] * 3 and len(other.seen) == 3 and fails == 0 and up == [1.0, 1.0]
    finally:
        r.stop()
        slow.close()
        other.close()


def burst(port, body, n, path="/v1/completions"):
    """n connections sending body at once; their status lines."""
    out = []

    def one():
        try:
            out.append(post(port, path, body, timeout=300)[0])
        except OSError as e:
            out.append(repr(e))
    ths = [threading.Thread(target=one) for _ in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return out


def test_json_costs_are_bounded_and_memory_goes_back(models):
    """1 MiB of [{},{},...] costs ~70 bytes per byte to parse: refused at
    32x (or 429 while 256 MiB of parses run at once); after 32 of them at
    once, through the router and straight to the server, both come back
    near their starting memory (they were at 2-4 GB)."""
    srv = Server(models("tiny", "Q8_0"))
    r = Router("--backend", srv.base)
    body = "[" + "{}," * ((1 << 20) // 3 - 2) + "{}]"
    try:
        for who, proc, port in (("llm-router", r, r.port), ("llm-server", srv, srv.port)):
            post(port, "/v1/completions", {"prompt": "Once", "max_tokens": 1})
            before = rss_mb(proc.proc.pid)
            codes = burst(port, body, 32)
            if not sanitized():  # (ASan's quarantine keeps freed memory on purpose)
                wait_for(lambda: rss_mb(proc.proc.pid) < before + 48, timeout=30, what=f"{who}'s memory back")
            print(f"{who}: {before} MB before 32 x 1 MiB [{{}},...], {rss_mb(proc.proc.pid)} MB after; {sorted(set(codes))}")
            assert set(codes) <= {400, 429}, codes
            alive(srv, r)
        code, got, _ = post(srv.port, "/v1/completions", "[" + "{}," * 300000 + "{}]")
        assert code == 400 and "bytes of memory" in got["error"]["message"], got
    finally:
        r.stop()
        srv.stop()


def test_health_port_cannot_be_held(models):
    """200 connections that never finish their headers (half of them
    trickling a byte every half second) are open against the health port:
    every probe and /metrics still answers, within 100 ms (p95). Before,
    they held every thread of that port and probes timed out."""
    hp = free_port()
    srv = Server(models("tiny", "Q8_0"), "--health_port", hp)
    socks = []
    try:
        for i in range(200):
            s = socket.create_connection(("127.0.0.1", hp))
            if i % 2:
                s.send(b"GET /livez HTTP/1.1\r\n")
            socks.append(s)
        stop = threading.Event()

        def trickle():
            while not stop.is_set():
                for s in socks[1::2]:
                    try:
                        s.send(b"X")
                    except OSError:
                        pass
                stop.wait(0.5)
        threading.Thread(target=trickle, daemon=True).start()
        times, codes = [], []
        for _ in range(10):
            for path in ("/livez", "/readyz", "/startupz", "/metrics"):
                code, ms = probe_ms(hp, path)
                codes.append(code)
                times.append(ms)
            time.sleep(0.3)
        stop.set()
        times.sort()
        print(f"probes under 200 held connections: p95 {times[int(len(times) * 0.95)]:.1f} ms, max {times[-1]:.1f} ms")
        assert codes == [200] * len(codes) and times[int(len(times) * 0.95)] < 100
        alive(srv)
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_tokenizer_cost_is_linear(gemma):
    """1 MB of '<' (each one the start of thousands of Gemma 3's special
    tokens) costs the tokenizer well under a second on /tokenize, and a
    prompt whose bytes cannot fit the context is refused before it is
    tokenized. It took 18 s of CPU."""
    srv = Server(gemma, "--threads", 1)
    try:
        for path, body in (("/tokenize", {"content": "<" * 1000000}),
                           ("/v1/completions", {"prompt": "<" * 1000000, "max_tokens": 1}),
                           ("/v1/chat/completions", {"messages": [{"role": "user", "content": "<" * 1000000}]})):
            t = time.perf_counter()
            code, got, _ = post(srv.port, path, body)
            took = time.perf_counter() - t
            print(f"{path}, 1 MB of '<': {code} in {took:.2f} s")
            assert took < 2 and code == (200 if path == "/tokenize" else 400), (code, got)
    finally:
        srv.stop()


def test_framing_cors_and_content_type(models):
    """Two differing Content-Length headers, and Content-Length with
    Transfer-Encoding, are refused with 400 and the connection closed; a
    chunk extension gets a 400 that says so (not a misleading 408); no CORS
    preflight is answered unless cors_origin is set; a POST body must be
    application/json (a web page can send text/plain without asking)."""
    srv = Server(models("tiny", "Q8_0"))
    cors = Server(models("tiny", "Q8_0"), "--cors_origin", "https://app.example")
    r = Router("--backend", srv.base)
    body = b'{"prompt": "Once", "max_tokens": 1}'
    try:
        for port in (srv.port, r.port):
            code, got = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nContent-Length: 5\r\n\r\n%s" % (len(body), body))
            assert code == 400 and b"Content-Length headers that differ" in got and b"Connection: close" in got
            code, got = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Content-Length: %d\r\nTransfer-Encoding: chunked\r\n\r\n%x\r\n%s\r\n0\r\n\r\n"
                                  % (len(body), len(body), body))
            assert code == 400 and b"both Content-Length and Transfer-Encoding" in got
            code, got = raw(port, b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                  b"Transfer-Encoding: chunked\r\nConnection: close\r\n\r\n%x;ext=1\r\n%s\r\n0\r\n\r\n"
                                  % (len(body), body))
            assert code == 400 and b"chunk" in got, got[:300]
            code, got = raw(port, b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://evil.example\r\n"
                                  b"Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n")
            assert b"Access-Control-Allow-Origin" not in got, got[:300]
            code, got, _ = post(port, "/v1/completions", body, headers={"Content-Type": "text/plain"})
            assert code == 415, (code, got)
        code, got = raw(cors.port, b"OPTIONS /v1/completions HTTP/1.1\r\nHost: x\r\nOrigin: https://app.example\r\n"
                                   b"Access-Control-Request-Method: POST\r\nConnection: close\r\n\r\n")
        assert b"Access-Control-Allow-Origin: https://app.example" in got, got[:300]
        code, got, resp = post(cors.port, "/v1/completions", body)
        assert code == 200 and resp.headers["Access-Control-Allow-Origin"] == "https://app.example"
        alive(srv, cors, r)
    finally:
        r.stop()
        srv.stop()
        cors.stop()


def test_small_points(models, tmp_path):
    """/metrics on the API port needs a key when keys are set (the health
    port serves it); X-Backend is off by default and names no address;
    X-Session-Id reaches the backend; HTTP/1.0 clients get no chunked
    body; logprob bytes are the token's raw bytes; top_p 1e-320 is refused
    naming top_p."""
    keys = tmp_path / "keys"
    keys.write_text("k1 tenant=a\n")
    hp = free_port()
    srv = Server(models("tiny", "Q8_0"), "--api_keys_file", keys, "--health_port", hp)
    seen = FakeBackend(ok_answer)
    rp = free_port()
    r = subprocess.Popen([tool("llm-router"), "--host", "127.0.0.1", "--port", str(rp), "--backend", seen.base],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", "/metrics")
        assert c.getresponse().status == 401
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", "/metrics", headers={"Authorization": "Bearer k1"})
        assert c.getresponse().status == 200
        assert "llm_http_connections" in health_metrics(hp)
        code, got, _ = post(srv.port, "/v1/completions", {"prompt": "x", "top_p": 1e-320},
                            headers={"Authorization": "Bearer k1"})
        assert code == 400 and got["error"]["param"] == "top_p", got
        # token 229 of this vocabulary is a lone UTF-8 lead byte: its text reads U+FFFD, its bytes are the byte
        code, got, _ = post(srv.port, "/v1/chat/completions", {**CHAT, "max_tokens": 1, "logprobs": True,
                                                               "logit_bias": {"229": 100}},
                            headers={"Authorization": "Bearer k1"})
        entry = got["choices"][0]["logprobs"]["content"][0]
        assert entry["token"] == "\ufffd" and entry["bytes"] == [229], entry
        wait_for(lambda: raw(rp, b"GET /readyz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")[0] == 200)
        code, got, resp = post(rp, "/v1/completions", {"prompt": "x"}, headers={"X-Session-Id": "s-42"})
        assert code == 200 and resp.headers.get("X-Backend") is None
        assert seen.seen[-1][2].get("X-Session-Id") == "s-42"
        code, got = raw(rp, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                            b"Content-Length: 2\r\n\r\n{}")
        assert code == 200 and b"chunked" not in got.lower() and got.endswith(b'{"ok":true}'), got
        body = b'{"prompt": "Once", "max_tokens": 3, "stream": true}'
        code, got = raw(srv.port, b"POST /v1/completions HTTP/1.0\r\nContent-Type: application/json\r\n"
                                  b"Authorization: Bearer k1\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
        head, _, events = got.partition(b"\r\n\r\n")
        assert code == 200 and b"chunked" not in head.lower() and events.startswith(b"data: {"), got[:300]
        assert events.endswith(b"data: [DONE]\n\n") and events.count(b"data: ") == 5, events
        alive(srv)
    finally:
        r.terminate()
        r.wait()
        seen.close()
        srv.stop()


def test_a_pods_own_load_figures_are_held_to_sense():
    """A pod that reports a waiting count of -1e9 (or 1e308 twice) does not
    draw every session to itself: reported load is clamped to 0..100,000
    before it steers the choice."""
    liar = FakeBackend(ok_answer, metrics=b"llm_requests_waiting -1000000000\nllm_requests_running 1e308\n")
    honest = FakeBackend(ok_answer)
    r = Router("--backend", liar.base, "--backend", honest.base)
    try:
        wait_for(lambda: router_metric(r, "llm_router_backend_up") == 2, what="both backends polled")
        for i in range(40):
            assert post(r.port, "/v1/completions", {"prompt": "x"}, headers={"X-Session-Id": f"s{i}"})[0] == 200
        print(f"40 sessions: the lying pod took {len(liar.seen)}, the other {len(honest.seen)}")
        assert len(honest.seen) >= 8, (len(liar.seen), len(honest.seen))
    finally:
        r.stop()
        liar.close()
        honest.close()


def test_affinity_has_bounded_load():
    """Every request of one session at once: its backend takes them until
    it carries 1.25x the average, then the next one on the ring does. All
    went to one backend before."""
    hold = threading.Event()
    slow = lambda p, d, h: (hold.wait(30), (200, b'{"ok":true}', {}))[1]
    a, b = FakeBackend(slow), FakeBackend(slow)
    r = Router("--backend", a.base, "--backend", b.base)
    try:
        ths = [threading.Thread(target=post, args=(r.port, "/v1/completions", {"prompt": "x"}, {"X-Session-Id": "s1"}))
               for _ in range(12)]
        for t in ths:
            t.start()
        wait_for(lambda: len(a.seen) + len(b.seen) == 12, what="all 12 requests at a backend")
        print(f"one session, 12 at once: {len(a.seen)} and {len(b.seen)}")
        assert min(len(a.seen), len(b.seen)) >= 2
        hold.set()
        for t in ths:
            t.join()
    finally:
        hold.set()
        r.stop()
        a.close()
        b.close()


def test_a_tenants_deep_custom_resource_stops_no_one(tmp_path, models):
    """One LLMDeployment whose affinity (a field the CRD leaves open) nests
    200 levels deep - the API server takes 10,000 - is left out of the
    controller's lists and watches, counted in
    llm_controller_unreadable_objects_total; every other deployment is
    still reconciled (a scale-up is carried out). With the depth limit and
    no such reading, a list holding it would fail whole and the controller
    would sync nothing (a review found it in this issue's first version)."""
    import shutil
    if not shutil.which("kubectl"):
        import pytest
        pytest.skip("kubectl not installed")
    c = Cluster(tmp_path, models("tiny", "Q8_0"))
    try:
        c.apply(replicas=1)
        deep = json.dumps({"apiVersion": "llmk8s.io/v1alpha1", "kind": "LLMDeployment", "metadata": {"name": "evil"},
                           "spec": {"image": "llm-server:test", "replicas": 1,
                                    "model": {"path": "/m.gguf", "name": "evil", "volume": {"hostPath": {"path": "/"}}},
                                    "affinity": json.loads('{"a":' * 200 + "1" + "}" * 200)}})
        created = c.k("apply", "-f", "-", stdin=deep, check=False)
        print(f"kubectl apply of a 200-deep affinity: exit {created.returncode} {created.stderr.strip()[:120]}")
        _, url = c.controller()
        wait_for(lambda: c.status().get("readyReplicas") == 1, 90)
        c.k("scale", "llmd/story", "--replicas=2")
        wait_for(lambda: c.status().get("readyReplicas") == 2, 90)
        if created.returncode == 0:  # the API server took it: the controller read past it and counted it
            unreadable = metrics(url).get(("llm_controller_unreadable_objects_total", ()), 0)
            print(f"objects left out: {unreadable}")
            assert unreadable >= 1
    finally:
        c.close()
