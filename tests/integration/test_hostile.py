"""llm-server under hostile and overloaded clients (issue 17): probes on the
health port answer within 100 ms while 200 connections trickle their
headers a byte at a time and 64 streams run; header and body deadlines are
totals, not per read; connections above max_connections get 503 with
Retry-After at once; keep-alive is on and real clients (the openai package,
http.client) reuse their connections; 1,000 idle kept-alive connections are
held and stay usable. Each case prints what it measured."""
import http.client
import json
import socket
import subprocess
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import NAME, STORIES, FakeBackend, Router, Server, free_port, health_metrics, probe_ms, tool, wait_for


VLLM_LABELS = (("model_name", NAME),)  # vLLM's series carry the served model's name


def models_on(c):
    """GET /v1/models on connection c (kept open): the response, read."""
    c.request("GET", "/v1/models")
    r = c.getresponse()
    r.read()
    return r


class Tricklers:
    """n connections that send a request's header one byte per period;
    cut[i] is when connection i was found cut (None: still open)."""

    def __init__(self, port, n, period=0.3, body=False):
        self.socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        self.cut = [None] * n
        self.t0 = time.time()
        if body:  # whole headers, then the body a byte at a time
            head = "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 5000\r\n\r\n"
            for s in self.socks:
                s.sendall(head.encode())
            self.data = b"{" + b" " * 4998 + b"}"
        else:
            self.data = b"GET /v1/models HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 4000
        self.period, self.stop = period, threading.Event()
        self.th = threading.Thread(target=self.run, daemon=True)
        self.th.start()

    def run(self):
        i = 0
        while not self.stop.is_set() and i < len(self.data):
            for k, s in enumerate(self.socks):
                if self.cut[k] is None:
                    try:
                        s.send(self.data[i:i + 1])
                    except OSError:
                        self.cut[k] = time.time() - self.t0
            i += 1
            self.stop.wait(self.period)

    def open(self):
        return sum(c is None for c in self.cut)

    def close(self):
        self.stop.set()
        self.th.join()
        for s in self.socks:
            s.close()


def stream(port, prompt, out, idx):
    """A long streamed completion; out[idx] is set at its first token and
    the stream is read until the socket is closed under it."""
    s = socket.create_connection(("127.0.0.1", port))
    body = json.dumps({"prompt": prompt, "ignore_eos": True, "stream": True, "temperature": 0.8,
                       "max_tokens": 1000})  # to n_ctx (1024; completions stop at 16 by default)
    s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
    out[idx] = s
    got = b""
    try:
        while b"data:" not in got and b"\r\n\r\n{" not in got and (part := s.recv(4096)):
            got += part
    except OSError:
        pass
    out[idx + len(out) // 2] = got


@pytest.fixture(scope="module")
def model(models):
    return STORIES if STORIES.exists() else models("tiny", "Q8_0")


@pytest.fixture(scope="module")
def big(models):
    return models("llama-110m", "Q8_0")


def test_probes_answer_under_trickle_and_streams(big):
    """200 trickling connections and 64 long streams at once: /livez and
    /readyz on the health port answer within 100 ms (p95; max printed),
    and the API port still answers a plain request."""
    hp = free_port()
    srv = Server(big, "--health_port", hp, "--threads", 1, "--max_connections", 400, "--header_timeout_s", 900)
    try:
        tr = Tricklers(srv.port, 200, period=0.5)
        socks = [None] * 128
        ths = [threading.Thread(target=stream, args=(srv.port, f"Story {i}:", socks, i), daemon=True) for i in range(64)]
        for t in ths:
            t.start()
        wait_for(lambda: all(x is not None for x in socks[64:]), timeout=240, what="64 streams at their first token")
        assert all(b"data:" in x for x in socks[64:]), [x[:300] for x in socks[64:] if b"data:" not in x][:1]
        assert tr.open() == 200
        assert health_metrics(hp)["llm_http_connections"] >= 264
        times = []
        for i in range(60):
            st, ms = probe_ms(hp, "/livez" if i % 2 else "/readyz")
            assert st == 200
            times.append(ms)
        api_status, api_ms = probe_ms(srv.port, "/v1/models")
        times.sort()
        p95 = times[int(0.95 * len(times)) - 1]
        print(f"probes under 200 tricklers + 64 streams: median {times[len(times) // 2]:.1f} ms, p95 {p95:.1f} ms, "
              f"max {times[-1]:.1f} ms; API /v1/models {api_ms:.1f} ms")
        assert p95 < 100, times
        assert api_status == 200
        assert tr.open() == 200  # nobody was cut early: the deadline is 900 s
        tr.close()
        for s in socks[:64]:
            s.close()
        for t in ths:
            t.join(30)
    finally:
        assert srv.stop() == 0


def test_health_port_survives_a_saturated_api_port(big):
    """More trickling connections than max_connections and its reserve:
    the API port is saturated, the health port still answers at once."""
    hp = free_port()
    srv = Server(big, "--health_port", hp, "--threads", 1, "--max_connections", 20, "--header_timeout_s", 120)
    try:
        tr = Tricklers(srv.port, 120, period=0.5)
        wait_for(lambda: health_metrics(hp)["llm_http_connections"] >= 52, timeout=60, what="every worker thread held")
        times = sorted(probe_ms(hp, "/livez")[1] for _ in range(20))
        print(f"health port with the API port saturated: median {times[10]:.1f} ms, max {times[-1]:.1f} ms")
        assert times[18] < 100
        tr.close()
    finally:
        assert srv.stop() == 0


def test_header_and_body_deadlines_are_totals(big):
    """Clients that trickle a byte every 0.3 s never let a read time out;
    they are cut when header_timeout_s / body_timeout_s run out in all."""
    hp = free_port()
    srv = Server(big, "--health_port", hp, "--header_timeout_s", 2, "--body_timeout_s", 3)
    try:
        heads, bodies = Tricklers(srv.port, 20), Tricklers(srv.port, 5, body=True)
        wait_for(lambda: heads.open() == 0 and bodies.open() == 0, timeout=30, what="every trickler cut")
        print(f"header tricklers cut at {min(heads.cut):.1f}-{max(heads.cut):.1f} s (deadline 2 s), "
              f"body tricklers at {min(bodies.cut):.1f}-{max(bodies.cut):.1f} s (deadline 3 s)")
        assert 1.5 <= min(heads.cut) and max(heads.cut) <= 4.5
        assert 2.5 <= min(bodies.cut) and max(bodies.cut) <= 5.5
        assert health_metrics(hp)["llm_http_connections_cut_total"] == 5  # the bodies; civetweb cuts headers itself
        heads.close()
        bodies.close()
        assert srv.get("/v1/models")[0] == 200
    finally:
        assert srv.stop() == 0


def test_connection_limit_refuses_at_once(big):
    """max_connections held by idle kept-alive clients: the next connection
    gets 503 with Retry-After at once; a freed slot is usable again."""
    hp = free_port()
    srv = Server(big, "--health_port", hp, "--max_connections", 6)
    try:
        held = []
        for _ in range(6):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
            r = models_on(c)
            assert r.status == 200 and r.getheader("Connection") == "keep-alive"
            held.append(c)
        t = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        c.request("GET", "/v1/models")
        r = c.getresponse()
        body = json.loads(r.read())
        ms = (time.perf_counter() - t) * 1e3
        print(f"connection 7 of 6 refused in {ms:.1f} ms")
        assert r.status == 503 and r.getheader("Retry-After") == "1" and ms < 1000
        assert body["error"]["code"] == "too_many_connections"
        for c in held[:3]:
            c.close()
        wait_for(lambda: health_metrics(hp)["llm_http_connections"] <= 3, timeout=30, what="three connections closed")
        assert srv.get("/v1/models")[0] == 200
        assert health_metrics(hp)["llm_http_connections_refused_total"] == 1
    finally:
        assert srv.stop() == 0


def test_clients_reuse_connections(model):
    """Keep-alive: the openai client's pool and one http.client connection
    serve many requests (streamed, whole, refused with 4xx) on one
    connection each; after SIGTERM answers say Connection: close."""
    hp = free_port()
    srv = Server(model, "--health_port", hp, "--shutdown_delay_s", 30)
    try:
        before = health_metrics(hp)["llm_http_connections_accepted_total"]
        cl = srv.client()
        for i in range(8):  # (the openai client drops a stream's connection at [DONE]: whole answers here)
            if i % 2:
                cl.completions.create(model=NAME, prompt="Once", max_tokens=4)
            else:
                cl.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert health_metrics(hp)["llm_http_connections_accepted_total"] - before == 1
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=10)
        ports = set()
        stream = {"prompt": "Once", "max_tokens": 4, "stream": True}
        for path, body in [("/v1/models", None), ("/nope", None), ("/v1/completions", {"prompt": 5}),
                           ("/v1/completions", stream), ("/tokenize", {"content": "hi"}), ("/v1/completions", stream),
                           ("/v1/models", None)]:
            c.request("POST" if body else "GET", path, body=json.dumps(body) if body else None,
                      headers={"Content-Type": "application/json"})
            r = c.getresponse()
            text = r.read()
            assert r.getheader("Connection") == "keep-alive", (path, r.status)
            assert not body or "stream" not in body or text.endswith(b"data: [DONE]\n\n")
            ports.add(c.sock.getsockname()[1])
        assert len(ports) == 1
        srv.proc.send_signal(15)
        wait_for(lambda: srv.get("/readyz")[0] == 503, timeout=30, what="not ready after SIGTERM")
        r = models_on(c)
        assert r.status == 200 and r.getheader("Connection") == "close"
    finally:
        srv.proc.kill()
        srv.stop()


def test_thousand_idle_keepalive_connections(model):
    """1,000 clients each holding an idle kept-alive connection: all are
    held (a thread each), the server still answers, and every one of them
    is still usable afterwards."""
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 2600:
        pytest.skip(f"the open files limit ({hard}) is below 2,600: 1,000 sockets on each side")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 2600), hard))  # ours; the server raises its own
    hp = free_port()
    srv = Server(model, "--health_port", hp, "--max_connections", 1100, "--keep_alive_s", 120)
    try:
        rss0 = health_metrics(hp)["process_resident_memory_bytes"]
        conns = []
        for _ in range(1000):
            c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
            assert models_on(c).status == 200
            conns.append(c)
        m = health_metrics(hp)
        assert m["llm_http_connections"] >= 1000
        t = time.perf_counter()
        assert srv.client().completions.create(model=NAME, prompt="Once", max_tokens=4).choices
        ms = (time.perf_counter() - t) * 1e3
        probes = sorted(probe_ms(hp, "/readyz")[1] for _ in range(10))
        print(f"1000 idle kept-alive connections: RSS +{(m['process_resident_memory_bytes'] - rss0) / 2**20:.1f} MiB, "
              f"a completion beside them {ms:.1f} ms, probes max {probes[-1]:.1f} ms")
        ports = {c.sock.getsockname()[1] for c in conns}
        for c in conns:  # each still open and served on the same socket
            assert models_on(c).status == 200
        assert {c.sock.getsockname()[1] for c in conns} == ports
        for c in conns:
            c.close()
    finally:
        assert srv.stop() == 0


# ---- llm-router ---------------------------------------------------------------

def router(*args):
    return Router(*args)


def test_router_keeps_alive_and_drains(big):
    """Through the router: one client connection serves whole and streamed
    answers (chunked, keep-alive). On SIGTERM /readyz fails at once while
    requests are still served for the shutdown delay; a stream running
    then finishes whole (the drain), and the router exits 0."""
    backend = Server(big, "--threads", 1)
    r = router("--backend", backend.base, "--shutdown-delay-s", 1, "--drain-timeout-s", 60)
    try:
        c = http.client.HTTPConnection("127.0.0.1", r.port, timeout=30)
        ports = set()
        for body in ({"prompt": "Once", "max_tokens": 4}, {"prompt": "Once", "max_tokens": 4, "stream": True},
                     {"prompt": 7}, {"prompt": "Once", "max_tokens": 3}):
            c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
            resp = c.getresponse()
            text = resp.read()
            assert resp.getheader("Connection") == "keep-alive", (body, resp.status, text[:200])
            assert resp.status == (400 if body["prompt"] == 7 else 200)
            assert not body.get("stream") or text.endswith(b"data: [DONE]\n\n")
            ports.add(c.sock.getsockname()[1])
        assert len(ports) == 1
        long = {"prompt": "Once", "max_tokens": 500, "stream": True, "ignore_eos": True}
        s = http.client.HTTPConnection("127.0.0.1", r.port, timeout=60)
        s.request("POST", "/v1/completions", body=json.dumps(long), headers={"Content-Type": "application/json"})
        sresp = s.getresponse()
        first = sresp.read(6)  # the stream is under way
        assert first == b"data: "
        r.proc.send_signal(15)
        wait_for(lambda: r.code("/readyz") == 503, timeout=10, what="router not ready after SIGTERM")
        assert r.post({"prompt": "Once", "max_tokens": 2})[0] == 200  # still served during the delay
        rest = sresp.read()
        assert rest.count(b"data: ") >= 500 and rest.endswith(b"data: [DONE]\n\n"), rest[-200:]
        assert r.proc.wait(30) == 0
        log = r.proc.stderr.read()
        assert "draining: 1 requests in flight" in log, log  # the stream outlived the delay: the drain carried it
    finally:
        r.proc.kill()
        r.proc.wait()
        assert backend.stop() == 0


def long_stream(port):
    """A stream to n_ctx, under way: (connection, response)."""
    s = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    s.request("POST", "/v1/completions", body=json.dumps({"prompt": "Once", "stream": True, "ignore_eos": True,
                                                          "max_tokens": 1000}),
              headers={"Content-Type": "application/json"})
    resp = s.getresponse()
    assert resp.status == 200 and resp.read(6) == b"data: "
    return s, resp


def test_drain_timeout_ends_streams_with_an_error(big):
    """Past drain_timeout_s (0 here: the stream, to n_ctx, outlives it) a
    stream still running ends with an error event naming the cause
    (server) or the router's cut event, never a reset at the grace
    period's SIGKILL; both exit 0 within seconds."""
    srv = Server(big, "--threads", 1, "--shutdown_delay_s", 0, "--drain_timeout_s", 0)
    _, resp = long_stream(srv.port)
    t = time.monotonic()
    srv.proc.send_signal(15)
    rest = resp.read()
    assert b"the server is shutting down and drain_timeout_s (0 s) has passed" in rest, rest[-300:]
    assert srv.stop() == 0 and time.monotonic() - t < 10, time.monotonic() - t
    backend = Server(big, "--threads", 1)
    r = router("--backend", backend.base, "--shutdown-delay-s", 0, "--drain-timeout-s", 0)
    try:
        _, resp = long_stream(r.port)
        t = time.monotonic()
        r.proc.send_signal(15)
        with pytest.raises(http.client.IncompleteRead) as cut:  # no last chunk: the client sees it cut
            resp.read()
        rest = cut.value.partial
        assert b"the backend failed midway" in rest and b"[DONE]" not in rest, rest[-300:]
        assert r.proc.wait(10) == 0 and time.monotonic() - t < 10, time.monotonic() - t
        assert "cut off" in r.proc.stderr.read()
    finally:
        r.proc.kill()
        r.proc.wait()
        assert backend.stop() == 0


def test_router_polls_the_health_port(model):
    """A backend whose API port is saturated (every worker held by a
    trickler) stays up in a router that polls its load on the health port
    (--metrics-port, as the controller sets it); a router polling the API
    port - the control - cannot connect and ejects it. (A router that
    polled before keeps its kept-alive connection, so the routers start
    after the tricklers.)"""
    hp = free_port()
    srv = Server(model, "--health_port", hp, "--max_connections", 2, "--header_timeout_s", 120)
    tr = Tricklers(srv.port, 40, period=0.5)
    health = api = None
    try:
        wait_for(lambda: health_metrics(hp)["llm_http_connections"] >= 34, what="every worker thread held")
        health, api = router("--backend", srv.base, "--metrics-port", hp), router("--backend", srv.base)
        up = lambda r: r.metrics().get(("llm_router_backend_up", (("backend", srv.base),)))
        wait_for(lambda: up(api) == 0, what="the API-port poller ejecting the backend")
        assert up(health) == 1 and health.metrics()[("llm_router_backend_failures_total", (("backend", srv.base),))] == 0
    finally:
        tr.close()
        for r in (health, api):
            if r:
                r.proc.kill()
                r.proc.wait()
        assert srv.stop() == 0


def refuser(status, retry_after=True):
    """A backend answering every API request with status (503 with
    Retry-After: "not now"; 503 without: that request's own error; 500:
    broken)."""
    extra = {"Retry-After": "1"} if status == 503 and retry_after else {}
    return FakeBackend(lambda p, d, h: (status, b'{"error":{"message":"no"}}', extra))


def test_router_passes_a_busy_backend_by(model):
    """A backend answering 503 ("not now": its connections full, loading,
    draining) is passed by: every request is answered by the other one,
    and the breaker never ejects it. The control: one answering 500 is
    ejected."""
    srv = Server(model)
    try:
        for status, ejected in ((503, False), (500, True)):
            bad = refuser(status)
            r = router("--backend", bad.base, "--backend", srv.base, "--eject-after", 1, "--eject-seconds", 60)
            try:
                codes = [r.post({"prompt": "Once", "max_tokens": 1})[0] for _ in range(10)]
                assert codes == [200] * 10, (status, codes)
                m = r.metrics()
                up = m[("llm_router_backend_up", (("backend", bad.base),))]
                fails = m[("llm_router_backend_failures_total", (("backend", bad.base),))]
                assert (up, fails > 0) == ((0, True) if ejected else (1, False)), (status, up, fails)
            finally:
                r.proc.kill()
                r.proc.wait()
                bad.close()
    finally:
        assert srv.stop() == 0


def test_router_does_not_retry_or_eject_on_a_request_timeout(model):
    """A request that runs past the router's --timeout-s is the request's
    own doing: 504 once, no retry on the other backend, and no breaker
    failure counted (both backends stay up)."""
    a, b = Server(model, "--fault_delay_ms", 3000), Server(model, "--fault_delay_ms", 3000)
    r = router("--backend", a.base, "--backend", b.base, "--timeout-s", 1, "--eject-after", 1)
    try:
        code, body, _ = r.post({"prompt": "Once", "max_tokens": 2})
        assert code == 504 and "timeout" in body["error"]["message"]
        m = r.metrics()
        tried = sum(v for (n, lab), v in m.items() if n == "llm_router_requests_total")
        failures = sum(v for (n, lab), v in m.items() if n == "llm_router_backend_failures_total")
        up = [v for (n, lab), v in m.items() if n == "llm_router_backend_up"]
        print(f"a 1 s request timeout: {tried:.0f} attempt(s), {failures:.0f} breaker failures, backends up {up}")
        assert tried == 1 and failures == 0 and up == [1.0, 1.0]
    finally:
        r.stop()
        a.stop()
        b.stop()


# ---- answers: size and abandoned requests -----------------------------------------

def test_a_client_that_stops_reading_is_cut(big):
    """A stream whose client stops reading (a small receive buffer, never
    read) fills the socket buffers (16 choices x 1000 tokens x 20 logprobs,
    tens of MB); past send_timeout_s on one write the connection is cut and
    the request cancelled, so it holds neither a worker nor its sequences
    (measured: cut about 7 s in, llama-110m, 2 cores)."""
    srv = Server(big, "--send_timeout_s", 2, "--max_seqs", 16, "--n_ctx", 1024)
    try:
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        s.connect(("127.0.0.1", srv.port))
        body = json.dumps({"prompt": "Once", "n": 16, "logprobs": 20, "ignore_eos": True, "stream": True,
                           "max_tokens": 1000})
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        cut = lambda: srv.metrics().get(("llm_http_connections_cut_total", ()), 0)
        wait_for(lambda: cut() >= 1, timeout=120, what="the stalled stream cut")
        wait_for(lambda: srv.metrics().get(("vllm:num_requests_running", VLLM_LABELS), 0) == 0, what="its request cancelled")
        s.close()
        assert srv.request("POST", "/v1/completions", {"prompt": "Once", "max_tokens": 2})[0] == 200
    finally:
        assert srv.stop() == 0


def test_huge_whole_answer_refused(model):
    """n 16 x top_logprobs 20 x the whole context, not streamed, could build
    hundreds of MB of JSON: 400 naming the field; streamed it is fine (the
    answer goes out as it is made), and so is a modest whole one."""
    srv = Server(model)
    try:
        huge = {"model": NAME, "messages": [{"role": "user", "content": "hi"}], "n": 16, "logprobs": True,
                "top_logprobs": 20, "ignore_eos": True}
        st, body, _ = srv.post("/v1/chat/completions", huge)
        assert st == 400 and body["error"]["param"] == "top_logprobs" and "max_answer_bytes" in body["error"]["message"]
        st, text, _ = srv.request("POST", "/v1/chat/completions", {**huge, "stream": True, "max_tokens": 8})
        assert st == 200 and text.endswith("data: [DONE]\n\n")
        st, body, _ = srv.post("/v1/chat/completions", {**huge, "n": 2, "top_logprobs": 2, "max_tokens": 8})
        assert st == 200 and len(body["choices"]) == 2
    finally:
        assert srv.stop() == 0


def test_client_gone_cancels_a_whole_request(big):
    """A non-streamed request whose client leaves is cancelled at once (it
    used to run to the end: nothing is written until then)."""
    hp = free_port()
    srv = Server(big, "--health_port", hp, "--threads", 1)
    try:
        def running():
            return health_metrics(hp).get("vllm:num_requests_running", 0)
        body = json.dumps({"prompt": "Once", "max_tokens": 400, "ignore_eos": True})
        s = socket.create_connection(("127.0.0.1", srv.port))
        s.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\n\r\n{body}".encode())
        wait_for(lambda: running() == 1, timeout=30, what="the request running")
        t = time.time()
        s.close()
        wait_for(lambda: running() == 0, timeout=30, what="the request cancelled")
        ms = (time.time() - t) * 1e3
        print(f"whole request cancelled {ms:.0f} ms after its client left")
        assert ms < 2000
        m = text_string_to_metric_families(srv.get("/metrics")[1])
        abort = [s.value for f in m for s in f.samples
                 if s.name == "llm_request_success_total" and s.labels.get("finished_reason") == "abort"]
        assert abort == [1.0], abort
    finally:
        assert srv.stop() == 0


# ---- the admin route -------------------------------------------------------------

ADMIN = "s3cret-admin-token"


def admin(srv, body=None, token=ADMIN):
    headers = {"Content-Type": "application/json"}
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    st, text, _ = srv.request("POST" if body is not None else "GET", "/admin/canary", body, headers)
    return st, json.loads(text)


def test_admin_route_cannot_be_abused(tmp_path, models):
    """The admin token comes from a file; the old derivable token and
    near misses are refused; a canary model must be a regular file inside
    the model directory (not /dev/zero, a FIFO, a path or symbolic link
    leading out); errors never echo a file's digest or bytes; a load in
    progress is abandoned on unload and does not hold up SIGTERM."""
    import hashlib
    import os
    import shutil
    mdir = tmp_path / "models"
    mdir.mkdir()
    stable = mdir / "stable.gguf"
    shutil.copy(models("tiny", "Q8_0"), stable)
    (tmp_path / "token").write_text(ADMIN + "\n")
    srv = Server(stable, "--admin_token_file", tmp_path / "token")
    try:
        assert admin(srv)[0] == 200
        derived = hashlib.sha256(b"some-uid/").hexdigest()
        for bad in (None, derived, ADMIN[:-1], ADMIN + "x", "", ADMIN.upper()):
            assert admin(srv, token=bad)[0] == 401, bad
        os.mkfifo(mdir / "fifo.gguf")
        (mdir / "link.gguf").symlink_to("/etc/passwd")
        (mdir / "empty.gguf").write_bytes(b"")
        junk = mdir / "junk.gguf"
        junk.write_bytes(b"SECRETBYTES" + os.urandom(64))
        digest = hashlib.sha256(junk.read_bytes()).hexdigest()
        for path in ("/dev/zero", str(mdir / "fifo.gguf"), str(mdir / "link.gguf"), str(mdir / "../token"),
                     "/etc/passwd", str(mdir / "empty.gguf"), str(mdir / "nope.gguf")):
            t = time.time()
            st, body = admin(srv, {"model": path, "weight": 10})
            assert st == 400 and body["error"]["param"] == "model" and path in body["error"]["message"], (path, body)
            assert time.time() - t < 5, path  # answered at once: nothing was opened that blocks
        # a wrong digest, then not a model: the caller learns neither the digest nor the bytes
        st, _ = admin(srv, {"model": str(junk), "sha256": "0" * 64, "weight": 10})
        assert st == 200
        deadline = time.time() + 30
        while (state := admin(srv)[1])["state"] == "loading" and time.time() < deadline:
            time.sleep(0.05)
        assert state["state"] == "failed" and digest not in json.dumps(state), state
        admin(srv, {"model": None})
        admin(srv, {"model": str(junk), "weight": 10})
        while (state := admin(srv)[1])["state"] == "loading" and time.time() < deadline:
            time.sleep(0.05)
        text = json.dumps(state)
        assert state["state"] == "failed" and "SECRETBYTES" not in text and "0x" not in text, state
        # a big file being hashed: unload abandons it, SIGTERM does not wait on it
        big = mdir / "big.gguf"
        with open(big, "wb") as f:
            f.truncate(6 << 30)  # sparse: 6 GiB of zeros to hash
        admin(srv, {"model": None})
        assert admin(srv, {"model": str(big), "sha256": "1" * 64, "weight": 10})[1]["state"] == "loading"
        t = time.time()
        assert srv.stop() == 0
        print(f"SIGTERM with a 6 GiB digest check under way: exited in {time.time() - t:.2f} s")
        assert time.time() - t < 10
        assert "the sha256 check was abandoned" in srv.log, srv.log[-2000:]  # it was under way, and stopped
    finally:
        if srv.proc.poll() is None:
            srv.proc.kill()


# ---- tenants: keys, priorities, rates, cache partitions ----------------------------

def keyed(model, tmp_path, text, *args):
    (tmp_path / "keys").write_text(text)
    return Server(model, "--api_keys_file", tmp_path / "keys", *args)


def ask(srv, key, body, path="/v1/completions"):
    return srv.request("POST", path, body, {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})


def test_keys_file_tenants_rates_and_cache(model, tmp_path):
    """Keys of one tenant share its prefix cache, another tenant's key sees
    none of it; a tenant over its rate gets 429 naming it; a bad keys file
    stops the server with the line and setting named."""
    srv = keyed(model, tmp_path, "# tenants\na1 tenant=A\na2 tenant=A max_priority=3\nb1 tenant=B rate=0.2\n")
    try:
        prompt = {"prompt": "Once upon a time there was a little girl who lived in a village near the forest. " * 2,
                  "max_tokens": 2, "temperature": 0}
        assert srv.request("POST", "/v1/completions", prompt)[0] == 401
        cached = lambda st_text: json.loads(st_text[1])["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert cached(ask(srv, "a1", prompt)) == 0
        assert cached(ask(srv, "a2", prompt)) > 0   # same tenant: shared
        assert cached(ask(srv, "b1", prompt)) == 0  # another tenant: its own partition
        codes = [ask(srv, "b1", {"prompt": "x", "max_tokens": 1}) for _ in range(3)]  # one per 5 s: the 2nd waits
        limited = [r for r in codes if r[0] == 429]
        assert limited and "tenant 'B'" in json.loads(limited[0][1])["error"]["message"]
        assert 1 <= int(limited[0][2].getheader("Retry-After")) <= 5
        assert all(ask(srv, "a1", {"prompt": "x", "max_tokens": 1})[0] == 200 for _ in range(6))  # no rate: A
    finally:
        assert srv.stop() == 0
    for bad, words in (("k1 tenant=\n", "line 1"), ("k1\nk1\n", "twice"), ("k1 max_priority=big\n", "max_priority"),
                       ("k1 color=red\n", "word 1 after the key")):
        (tmp_path / "keys").write_text(bad)
        p = subprocess.run([tool("llm-server"), "-m", str(model), "--port", str(free_port()), "--api_keys_file",
                            str(tmp_path / "keys")], capture_output=True, text=True, timeout=60)
        assert p.returncode != 0 and words in p.stderr, (bad, p.stderr)


def open_streams(srv, key, n):
    """n streamed completions sent at once by key (each runs to n_ctx: 480
    tokens, many seconds here, so all n arrive while the first still run);
    [(status, connection or error text)]: a 200's connection is left
    open (its sequence stays in flight until it is closed)."""
    out = [None] * n

    def one(i):
        c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=60)
        body = json.dumps({"prompt": f"Story {i}", "ignore_eos": True, "stream": True, "max_tokens": 480})
        c.request("POST", "/v1/completions", body, {"Content-Type": "application/json", "Authorization": f"Bearer {key}"})
        r = c.getresponse()
        if r.status == 200:
            out[i] = (200, c)
        else:
            out[i] = (r.status, json.loads(r.read())["error"]["message"])
            c.close()
    th = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in th:
        t.start()
    for t in th:
        t.join(60)
    assert None not in out, out  # every request answered
    return out


def test_a_tenant_cannot_fill_the_queue(big, tmp_path):
    """Tenant A (max_inflight=3) sends 8 streams at once: 3 are taken, 5
    get 429 naming its max_inflight, and tenant B is still served. The
    control: tenant C without a cap fills max_seqs + max_waiting (6) and B
    is refused - what the cap prevents. (Phase A holds whatever the
    engine's pace: 3 + 1 fit in max_waiting alone.)"""
    srv = keyed(big, tmp_path, "a tenant=A max_inflight=3\nb tenant=B\nc tenant=C\n", "--max_seqs", 2,
                "--max_waiting", 4, "--n_ctx", 512)
    idle = lambda: srv.metrics().get(("vllm:num_requests_running", VLLM_LABELS), 0) + \
        srv.metrics().get(("vllm:num_requests_waiting", VLLM_LABELS), 0) == 0
    try:
        a = open_streams(srv, "a", 8)
        codes = sorted(st for st, _ in a)
        assert codes == [200] * 3 + [429] * 5, a
        assert all("tenant 'A' has its cap of 3 sequences" in m for st, m in a if st == 429), a
        for _ in range(3):
            st, text, _ = ask(srv, "b", {"prompt": "Hello", "max_tokens": 1})
            assert st == 200, text
        for st, c in a:
            if st == 200:
                c.close()  # the client leaves: the engine cancels
        wait_for(idle, what="the streams cancelled")
        again = open_streams(srv, "a", 3)  # every sequence taken was given back
        assert [st for st, _ in again] == [200] * 3, again
        for _, c in again:
            c.close()
        wait_for(idle, what="the streams cancelled")
        # (at its cap a tenant's request is refused before its body is read: 429; with room, n over the cap is a 400)
        n4 = lambda: ask(srv, "a", {"prompt": "Hello", "max_tokens": 1, "n": 4})
        wait_for(lambda: n4()[0] == 400, what="A's slots given back")  # (the handlers give them back as they end)
        st, text, _ = n4()
        assert st == 400 and "n 4 is over tenant 'A''s cap of 3" in text, text  # no retry would help
        cflood = []

        def fill():  # C adds streams until 2 run and 4 wait (how many fit at once depends on the engine's pace)
            m = srv.metrics()
            run, wait = m.get(("vllm:num_requests_running", VLLM_LABELS), 0), m.get(("vllm:num_requests_waiting", VLLM_LABELS), 0)
            if run + wait < 6:
                cflood.extend(open_streams(srv, "c", 1))
            return run == 2 and wait == 4
        wait_for(fill, what="tenant C holding max_seqs + max_waiting")
        st, text, _ = ask(srv, "b", {"prompt": "Hello", "max_tokens": 1})
        assert st == 429 and "sequences waiting" in text, text  # without a cap one tenant shuts others out
        for st, c in cflood:
            if st == 200:
                c.close()
        wait_for(idle, what="the streams cancelled")
    finally:
        assert srv.stop() == 0
    (tmp_path / "keys").write_text("a1 tenant=A max_inflight=2\na2 tenant=A max_inflight=5\n")
    p = subprocess.run([tool("llm-server"), "-m", str(big), "--port", str(free_port()), "--api_keys_file",
                        str(tmp_path / "keys")], capture_output=True, text=True, timeout=60)
    assert p.returncode != 0 and "tenant 'A' has max_inflight=2 on an earlier line, not 5" in p.stderr, p.stderr


def test_priority_flood_is_bounded(model, tmp_path):
    """A tenant flooding at priority 1,000,000 is capped at its key's
    max_priority (2); with aging at one level a second, another tenant's
    request is overtaken only by flood requests that arrived less than
    about 2 s after it, however long the flood lasts: none sent 3 s or more
    after it (a second for the requests' trips) finishes before it. Judged
    by order, not by time, so a loaded machine's slower steps change
    nothing."""
    srv = keyed(model, tmp_path, "flood tenant=F max_priority=2\nnorm tenant=N\n", "--max_seqs", 1)
    stop = threading.Event()
    done = []  # (sent, finished) of every flood request
    try:
        def flood():
            while not stop.is_set():
                sent = time.perf_counter()
                ask(srv, "flood", {"prompt": "Once", "max_tokens": 24, "ignore_eos": True, "priority": 1000000})
                done.append((sent, time.perf_counter()))
        th = [threading.Thread(target=flood, daemon=True) for _ in range(8)]
        for t in th:
            t.start()
        wait_for(lambda: srv.metrics().get(("vllm:num_requests_waiting", VLLM_LABELS), 0) >= 4, what="the flood queued")
        norms = []
        for i in range(8):
            t = time.perf_counter()
            st, _, _ = ask(srv, "norm", {"prompt": f"Tale {i}", "max_tokens": 1, "priority": 0})
            assert st == 200
            norms.append((t, time.perf_counter()))
        stop.set()
        for t in th:
            t.join(30)
        waits = sorted(t1 - t0 for t0, t1 in norms)
        print(f"behind a priority flood capped at 2: waits {', '.join(f'{w:.2f}' for w in waits)} s")
        late = [(round(s - t0, 2), round(f - t0, 2)) for t0, t1 in norms for s, f in done if s >= t0 + 3.0 and f < t1]
        assert not late, late  # the bound: flood requests sent after max_priority x aging never go first
        assert waits[len(waits) // 2] > 1.0, waits  # and the flood did come first (the test can fail)
    finally:
        stop.set()
        assert srv.stop() == 0


def test_router_refuses_odd_paths_without_blaming_backends(model):
    """civetweb decodes the path: '%20' once made curl refuse the URL, which
    counted against (and ejected) healthy backends, and '%252e%252e' reached
    the backend's other routes. Such paths are 400 now; the backend stays up."""
    backend = Server(model)
    r = router("--backend", backend.base, "--eject-after", 1)
    try:
        for path in ("/v1/%20", "/v1/%0a", "/v1/%252e%252e/admin/canary", "/v1/../admin/canary"):  # (civetweb cleans plain dot segments itself)
            c = http.client.HTTPConnection("127.0.0.1", r.port, timeout=10)
            c.request("GET", path)
            resp = c.getresponse()
            resp.read()
            assert resp.status in (400, 404), (path, resp.status)
            c.close()
        m = r.metrics()
        assert [v for (n, _), v in m.items() if n == "llm_router_backend_up"] == [1.0]
        assert sum(v for (n, _), v in m.items() if n == "llm_router_backend_failures_total") == 0
        assert r.post({"prompt": "Once", "max_tokens": 2})[0] == 200
    finally:
        r.stop()
        backend.stop()


def test_cap_is_taken_before_the_body_is_parsed(big, tmp_path):
    """A tenant at its max_inflight gets its 429 before its body is parsed:
    no chat template rendered, no prompt or embedding input tokenized (a
    malformed body shows it: 429, where another tenant gets the body's
    400). A's one slot is held by a 480-token completion, running before
    the checks; a round in which it ended first (A's malformed body then
    reaches the parser: 400) is run again."""
    srv = keyed(big, tmp_path, "a tenant=A max_inflight=1\nb tenant=B\n", "--n_ctx", 512)
    bodies = (("/v1/chat/completions", {"messages": [{"role": "Bad Role", "content": "x"}]}),
              ("/v1/completions", {"prompt": []}), ("/v1/embeddings", {"input": ""}), ("/generate", {"text": 5}))
    running = lambda: srv.metrics().get(("vllm:num_requests_running", VLLM_LABELS), 0) >= 1
    try:
        for _ in range(5):
            hold = threading.Thread(target=ask, args=(srv, "a", {"prompt": "Once", "ignore_eos": True,
                                                                 "max_tokens": 480}))
            hold.start()  # (probing A's cap here would race it for the one slot: the engine says when it runs)
            wait_for(running, what="A's completion running")
            refused = []
            for path, body in bodies:
                st, text, _ = ask(srv, "a", body, path)
                if st == 400:  # the completion ended first: the cap was free
                    break
                assert st == 429 and "tenant 'A' has its cap of 1 sequences" in text, (path, text)
                assert ask(srv, "b", body, path)[0] == 400, path
                refused.append(path)
            hold.join()
            if len(refused) == len(bodies):
                break
        else:
            raise AssertionError("the 480-token completion never outlasted the checks")
    finally:
        assert srv.stop() == 0
