"""Traces across the gateway and the server (OTLP/HTTP, protobuf), read
back with the official opentelemetry-proto package: one trace per request,
the router's span the parent of the server's, the server's of its queue,
prefill and decode, with model, tenant and token counts; a client's
traceparent continued, a malformed one replaced by a new trace; and with
the collector stalled, serving time does not move (the spans are dropped
and counted instead)."""
import http.server
import statistics
import threading
import time
import urllib.request

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import NAME, Router, Server, free_port, wait_for

trace_pb2 = pytest.importorskip("opentelemetry.proto.collector.trace.v1.trace_service_pb2",
                                reason="opentelemetry-proto missing (make deps installs it)")


class Collector:
    """An OTLP/HTTP traces receiver: every span it is sent, decoded; with
    stall set, it holds each request (a collector that does not answer)."""

    def __init__(self):
        outer = self
        self.spans, self.bodies, self.stalled, self.stall = [], 0, 0, threading.Event()
        self.release = threading.Event()

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if outer.stall.is_set():
                    outer.stalled += 1
                    outer.release.wait(60)
                    self.close_connection = True
                    return
                assert self.path == "/v1/traces" and self.headers["Content-Type"] == "application/x-protobuf"
                req = trace_pb2.ExportTraceServiceRequest.FromString(data)
                for rs in req.resource_spans:
                    svc = next(a.value.string_value for a in rs.resource.attributes if a.key == "service.name")
                    for ss in rs.scope_spans:
                        outer.spans.extend((svc, s) for s in ss.spans)
                outer.bodies += 1
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1/traces"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.release.set()
        self.httpd.shutdown()
        self.httpd.server_close()


def attrs(span):
    return {a.key: (a.value.string_value if a.value.HasField("string_value") else a.value.int_value)
            for a in span.attributes}


@pytest.fixture()
def traced(tmp_path, models):
    col = Collector()
    (tmp_path / "pod-keys").write_text("sk-gw tenant=gateway gateway=1\n")
    (tmp_path / "keys").write_text("sk-a tenant=A\n")
    (tmp_path / "up").write_text("sk-gw\n")
    hp = free_port()
    pod = Server(models("llama-110m", "Q8_0"), "--api_keys_file", tmp_path / "pod-keys", "--health_port", hp,
                 "--otlp_endpoint", col.url)
    r = Router("--backend", pod.base, "--metrics-port", hp, "--api-keys-file", tmp_path / "keys", "--upstream-key-file",
               tmp_path / "up", "--otlp-endpoint", col.url)
    wait_for(lambda: r.metrics().get(("llm_router_backend_up", (("backend", pod.base),))) == 1, 30, "the router polling")
    yield col, pod, r, hp
    r.stop()
    pod.stop()
    col.close()


def test_one_trace_per_request_across_router_and_server(traced):
    col, pod, r, _ = traced
    oa = openai.OpenAI(base_url=r.base + "/v1", api_key="sk-a", max_retries=0, timeout=60)
    given = {}
    for i in range(4):
        trace_id, parent = f"{i + 1:032x}", f"{i + 17:016x}"
        out = oa.completions.create(model=NAME, prompt=f"Once upon a time {i}", max_tokens=5, temperature=0,
                                    extra_headers={"traceparent": f"00-{trace_id}-{parent}-01"})
        given[trace_id] = (parent, out.usage)
    oa.completions.create(model=NAME, prompt="garbage", max_tokens=2, extra_headers={"traceparent": "00-zz-12-01"})
    # 5 requests: a router span, a server span and its three parts each
    wait_for(lambda: len(col.spans) >= 25, 30, "every span at the collector")
    by_trace = {}
    for svc, s in col.spans:
        by_trace.setdefault(s.trace_id.hex(), []).append((svc, s))
    assert len(by_trace) == 5, {t: len(v) for t, v in by_trace.items()}
    for trace_id, spans in by_trace.items():
        router = [s for svc, s in spans if svc == "llm-router"]
        server = [s for svc, s in spans if svc == "llm-server"]
        assert len(router) == 1 and len(server) == 4, [(svc, s.name) for svc, s in spans]
        rs = router[0]
        req = next(s for s in server if s.name == "llm-server request")
        assert req.parent_span_id == rs.span_id  # the server continues the router's span
        parts = {s.name: s for s in server if s is not req}
        assert set(parts) == {"queue", "prefill", "decode"} and all(p.parent_span_id == req.span_id for p in parts.values())
        assert parts["queue"].end_time_unix_nano <= parts["prefill"].end_time_unix_nano <= parts["decode"].end_time_unix_nano
        assert rs.start_time_unix_nano <= req.start_time_unix_nano <= req.end_time_unix_nano <= rs.end_time_unix_nano
        assert attrs(rs)["llm.tenant"] == "A" and attrs(req)["llm.tenant"] == "A"  # the gateway told the pod
        assert attrs(rs)["gen_ai.request.model"] == NAME and attrs(rs)["http.response.status_code"] == 200
        if trace_id in given:
            parent, usage = given[trace_id]
            assert rs.parent_span_id.hex() == parent  # the client's trace, continued
            a = attrs(req)
            assert (a["gen_ai.usage.input_tokens"], a["gen_ai.usage.output_tokens"]) == (usage.prompt_tokens,
                                                                                     usage.completion_tokens)
            assert a["gen_ai.usage.cached_tokens"] == usage.prompt_tokens_details.cached_tokens
        else:  # the malformed traceparent: a trace of its own, the router's span its root
            assert rs.parent_span_id == b""
    m = r.metrics()
    assert m[("llm_traces_exported_total", ())] >= 5 and m[("llm_traces_dropped_total", ())] == 0


def test_a_stalled_collector_does_not_slow_serving(traced):
    col, pod, r, hp = traced
    oa = openai.OpenAI(base_url=r.base + "/v1", api_key="sk-a", max_retries=0, timeout=60)

    def timings(n):
        out = []
        for i in range(n):
            t0 = time.monotonic()
            oa.completions.create(model=NAME, prompt=f"Once upon a time {i}", max_tokens=4, temperature=0)
            out.append(time.monotonic() - t0)
        return out
    timings(2)  # warm
    before = timings(8)
    col.stall.set()
    timings(1)
    wait_for(lambda: col.stalled >= 1, 30, "an export held by the collector")  # the exporter is stuck from here on
    during = timings(8)
    print(f"median request time: {statistics.median(before) * 1e3:.1f} ms with the collector answering, "
          f"{statistics.median(during) * 1e3:.1f} ms stalled (slowest {max(during) * 1e3:.1f} ms)")
    # a request that waited on the exporter would wait for its batch's 2 s timeout; the bounds leave room
    # for a loaded machine's noise, not for that
    assert max(during) < 1.5 and statistics.median(during) <= 3 * statistics.median(before) + 0.1, (before, during)
    # the stalled batches are dropped (after their 2 s timeout) and counted, at both hops
    wait_for(lambda: r.metrics()[("llm_traces_dropped_total", ())] >= 1, 30, "the router's dropped spans counted")

    def pod_dropped():
        text = urllib.request.urlopen(f"http://127.0.0.1:{hp}/metrics", timeout=5).read().decode()
        return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples
                   if s.name == "llm_traces_dropped_total")
    wait_for(lambda: pod_dropped() >= 1, 30, "the server's dropped spans counted")
