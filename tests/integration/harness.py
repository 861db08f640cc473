"""harness.py - what the black-box tests share: the built programs and
../shared, ports, waiting for a condition, llm-server and llm-router as
processes, kubesim and a cluster on it with llm-controller, probes and
metrics, the hostile bodies. Test files import from here, never from each
other; conftest.py holds the shared fixtures."""
import contextlib
import datetime
import http.client
import http.server
import json
import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import jinja2
import openai
import pytest
from jinja2 import nodes
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from prometheus_client.parser import text_string_to_metric_families

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = ROOT / os.environ.get("LLM_BUILD", "build")


SHARED = pathlib.Path(os.environ.get("LLM_SHARED", ROOT.parent / "shared"))


def tool(name):
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} is missing: run make first")
    return str(path)


_PORTS_GIVEN = set()


def free_port():
    """A loopback port free now and not handed out before in this process:
    the kernel may give a just-released port again, and a test that takes two
    (an API port and a health port) must not get the same one twice."""
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _PORTS_GIVEN:
            _PORTS_GIVEN.add(port)
            return port
    raise AssertionError("no loopback port left that this test run has not used")


def sanitized():
    """Whether the programs under test are built with AddressSanitizer (make
    asan): its allocator keeps freed memory in quarantine on purpose, so a
    process's memory does not come back after a burst there."""
    path = BUILD / "bin" / "llm-server"
    return path.exists() and b"__asan_init" in path.read_bytes()


def run(*args, check=True, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, errors="replace", timeout=300, **kw)
    if check and r.returncode != 0:
        raise AssertionError(f"{args} exited {r.returncode}: {r.stderr}")
    return r


def shared(rel):
    p = SHARED / rel
    if not p.exists():
        pytest.skip(f"../shared/{rel} not present")
    return p


class Endpoint:
    """An llm-server's HTTP API at 127.0.0.1:port, however it was started."""

    def __init__(self, port):
        self.port = port
        self.base = f"http://127.0.0.1:{port}"

    def request(self, method, path, body=None, headers=None, raw=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        data = raw if raw is not None else (json.dumps(body) if body is not None else None)
        c.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        r = c.getresponse()
        text = r.read().decode("utf-8", "replace")
        c.close()
        return r.status, text, r

    def get(self, path):
        return self.request("GET", path)

    def post(self, path, body):
        s, t, r = self.request("POST", path, body)
        return s, (json.loads(t) if t else None), r

    def client(self, key="none"):
        return openai.OpenAI(base_url=self.base + "/v1", api_key=key, max_retries=0)


class Server(Endpoint):
    def __init__(self, model, *args, env=None, wait=True, binary=None):
        super().__init__(free_port())
        name = ["--model_name", NAME]
        self.proc = subprocess.Popen([binary or tool("llm-server"), "-m", str(model), "--host", "127.0.0.1", "--port",
                                      str(self.port), "--threads", "2", *name, *map(str, args)],
                                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, **(env or {})})
        self.key = self.first_key(args, env or {})  # /metrics on the API port needs one when keys are set
        if wait:
            self.wait_ready()

    @staticmethod
    def first_key(args, env):
        args = [str(a) for a in args]
        if "--api_keys_file" in args:
            return pathlib.Path(args[args.index("--api_keys_file") + 1]).read_text().split()[0]
        if env.get("LLM_SERVER_API_KEYS"):
            return env["LLM_SERVER_API_KEYS"].split(",")[0].split()[0]
        return None

    def wait_ready(self, timeout=60):
        end = time.time() + timeout
        while time.time() < end:
            if self.proc.poll() is not None:
                raise AssertionError(f"llm-server exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                if self.get("/readyz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.05)
        raise AssertionError("llm-server did not become ready")

    def metrics(self):
        s, text, _ = self.request("GET", "/metrics", headers={"Authorization": f"Bearer {self.key}"} if self.key else None)
        assert s == 200
        out = {}
        for fam in text_string_to_metric_families(text):
            for smp in fam.samples:
                out[(smp.name, tuple(sorted(smp.labels.items())))] = smp.value
        return out

    def stop(self, sig=signal.SIGTERM, timeout=60):
        if self.proc.stderr.closed:  # stopped already
            return self.proc.returncode
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        rc = self.proc.wait(timeout)
        self.log = self.proc.stderr.read()
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc


NAME = "test-model"  # every server here serves its model under this name
STORIES = SHARED / "models" / "stories260K.gguf"


def metric(m, name, **labels):
    return m.get((name, tuple(sorted(labels.items()))), 0.0)


def failed_detail(s, timeout=60):
    """The load failure /startupz reports (the server stays up to say so);
    s an Endpoint."""
    end, body = time.time() + timeout, {}
    while time.time() < end and body.get("phase") != "failed":
        time.sleep(0.05)
        try:
            body = json.loads(s.get("/startupz")[1])
        except OSError:
            pass  # not listening yet
    assert body.get("phase") == "failed", body
    return body["detail"]


class Router:
    """llm-router on a free port, with its health port (/healthz, /readyz, /metrics without a key) on
    another: metrics() reads that one unless told to read the API port's."""

    def __init__(self, *args):
        self.port = self.health_port = free_port()
        while self.health_port == self.port:
            self.health_port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.health = f"http://127.0.0.1:{self.health_port}"
        self.proc = subprocess.Popen([tool("llm-router"), "--host", "127.0.0.1", "--port", str(self.port),
                                      "--health-port", str(self.health_port),
                                      "--poll-ms", "100", "--expose-backend", "true", *map(str, args)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wait_for(lambda: self.code("/healthz") == 200, 10)

    def code(self, path):
        try:
            return urllib.request.urlopen(self.base + path, timeout=5).status
        except urllib.error.HTTPError as e:
            return e.code
        except OSError:
            return None

    def post(self, body, headers=None, timeout=60, path="/v1/completions"):
        req = urllib.request.Request(self.base + path, json.dumps(body).encode(),
                                     {"Content-Type": "application/json", **(headers or {})})
        try:
            r = urllib.request.urlopen(req, timeout=timeout)
            return r.status, json.loads(r.read()), r.headers.get("X-Backend")
        except urllib.error.HTTPError as e:
            return e.code, json.loads(e.read() or b"null"), e.headers.get("X-Backend")

    def metrics(self, query="", api=False, headers=None):
        req = urllib.request.Request((self.base if api else self.health) + "/metrics" + query, headers=headers or {})
        text = urllib.request.urlopen(req, timeout=5).read().decode()
        return {(s.name, tuple(sorted(s.labels.items()))): s.value
                for fam in text_string_to_metric_families(text) for s in fam.samples}

    def client(self):
        return openai.OpenAI(base_url=self.base + "/v1", api_key="none", max_retries=0)

    def stop(self):
        self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=30)
        self.log = self.proc.stderr.read()
        return rc


KUBESIM = ROOT / "tests" / "kubesim" / "kubesim"


def start(tmp_path, *extra):
    """kubesim serving from tmp_path/kubesim: (process, that folder). Its output goes to a file (p.log_path),
    never to a pipe no one reads: a full pipe would stop its loop at its next message. Stop it with stop_sim."""
    d = tmp_path / "kubesim"
    env = dict(os.environ, KUBESIM_BOOKMARK_SECONDS="1")
    log_path = tmp_path / "kubesim.log"
    with open(log_path, "w") as log:
        p = subprocess.Popen([str(KUBESIM), "--data-dir", str(d), "--tls", *extra],
                             stdout=log, stderr=subprocess.STDOUT, text=True, env=env)
    p.log_path = log_path
    for _ in range(100):
        if (d / "port").exists() and (d / "kubeconfig").exists():
            return p, d
        if p.poll() is not None:
            pytest.fail(f"kubesim exited: {log_path.read_text()}")
        time.sleep(0.1)
    p.kill()
    pytest.fail("kubesim did not start")


def stop_sim(p, timeout=30, check=True):
    """Stops a kubesim from start(); with check, a traceback in its output (one of its loops met an object it
    could not handle, and skipped it) fails the test that ran it: a stand-in that errs quietly would pass wrong
    tests (sim_clean checks later)."""
    p.terminate()
    p.wait(timeout=timeout)
    if check:
        sim_clean(p)


def sim_clean(p):
    text = p.log_path.read_text(errors="replace")
    assert "Traceback" not in text, f"kubesim failed inside:\n{text[-4000:]}"


def wait_for(pred, timeout=30, what="the condition", interval=0.2):
    """pred's first true value, polled every interval seconds (a pred may run
    kubectl) until timeout seconds pass."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        v = pred()
        if v:
            return v
        time.sleep(interval)
    raise AssertionError(f"{what}: not met within {timeout} s")


def health_metrics(port):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if not s.labels or set(s.labels) == {"model_name"}:  # vLLM's series carry the model's name
                out[s.name] = s.value
    return out


def probe_ms(port, path):
    """One probe on a fresh connection (as kubelet does): status, ms."""
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        got = b""
        while part := s.recv(4096):
            got += part
    return int(got.split()[1]), (time.perf_counter() - t) * 1e3


CRD = ROOT / "manifests" / "crd" / "llmdeployments.yaml"
GATEWAY_CRD = ROOT / "manifests" / "crd" / "llmgateways.yaml"
LLMD = """apiVersion: llmk8s.io/v1alpha1
kind: LLMDeployment
metadata: {{name: {name}}}
spec:
  image: {image}
  replicas: {replicas}
  model:
    path: {model}
    name: story
    volume: {{hostPath: {{path: {dir}}}}}
  engine: {{threads: 1, contextLength: 128, maxSeqs: {seqs}}}
  probes: {{shutdownDelaySeconds: 2, drainSeconds: 20}}
{extra}"""


# an LLMGateway of one pod in front of every LLMDeployment of the namespace
GATEWAY_OF_ALL = """apiVersion: llmk8s.io/v1alpha1
kind: LLMGateway
metadata: {name: front}
spec:
  selector: {}
  replicas: 1
  image: llm-router:test
"""


class Cluster:
    """kubesim with the CRD, the real llm-server image, and controllers."""

    def __init__(self, tmp_path, model, env=None, images=None):
        self.tmp, self.model = tmp_path, model
        extra, images = images, tmp_path / "images.yaml"
        crash = [sys.executable, "-c", "import sys; sys.stderr.write('boom'); sys.exit(3)"]
        images.write_text(f"llm-server:test: {json.dumps([tool('llm-server')])}\n"
                          f"llm-router:test: {json.dumps([tool('llm-router')])}\n"
                          f"crash:test: {json.dumps(crash)}\n" +
                          "".join(f"{k}: {json.dumps(v)}\n" for k, v in (extra or {}).items()))
        saved = {k: os.environ.get(k) for k in env or {}}
        os.environ.update(env or {})
        try:
            self.ks, self.dir = start(tmp_path, "--image-map", str(images))
        finally:
            for k, v in saved.items():
                os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
        self.env = {**os.environ, "KUBECONFIG": str(self.dir / "kubeconfig")}
        self.ctls = []
        self.k("apply", "-f", str(CRD), "-f", str(GATEWAY_CRD))
        self.k("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "crd/llmgateways.llmk8s.io",
               "--timeout=10s")

    def k(self, *args, check=True, stdin=None):
        r = subprocess.run(["kubectl", *args], env=self.env, capture_output=True, text=True, input=stdin, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r

    def controller(self, *args):
        """Starts llm-controller; returns (process, its HTTP base URL)."""
        port = free_port()
        log = open(self.tmp / f"controller-{len(self.ctls)}.log", "w")
        p = subprocess.Popen([tool("llm-controller"), "--kubeconfig", str(self.dir / "kubeconfig"), "--http-addr",
                              f"127.0.0.1:{port}", *args], stdout=subprocess.DEVNULL, stderr=log)
        self.ctls.append((p, log))
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: http_code(url + "/readyz") == 200, 20)
        return p, url

    def apply(self, name="story", replicas=1, model=None, image="llm-server:test", seqs=8, extra=""):
        model = model or self.model
        self.k("apply", "-f", "-", stdin=LLMD.format(name=name, replicas=replicas, model=model, dir=model.parent,
                                                     image=image, seqs=seqs, extra=extra))

    def get(self, kind, name):
        r = self.k("get", kind, name, "-o", "json", check=False)
        return json.loads(r.stdout) if not r.returncode else None

    def status(self, name="story"):
        return (self.get("llmd", name) or {}).get("status") or {}

    def cond(self, type_, name="story"):
        return next((c for c in self.status(name).get("conditions") or [] if c["type"] == type_), {})

    def ready_ips(self, name="story"):
        subsets = (self.get("endpoints", name) or {}).get("subsets") or []
        return sorted(a["ip"] for s in subsets for a in s.get("addresses", []))

    def fault(self, body):
        f = self.tmp / "fault.json"
        f.write_text(json.dumps(body))
        self.k("create", "--raw", "/kubesim/faults", "-f", str(f))

    def close(self):
        rcs = []
        for p, log in self.ctls:
            if p.poll() is None:
                p.terminate()
            rcs.append(p.wait(timeout=30))
            log.close()
        stop_sim(self.ks, check=False)
        return rcs


@contextlib.contextmanager
def running(tmp_path, model, env=None, quiet=False, images=None):
    """A Cluster for one test (skipped without kubectl), closed afterwards:
    when the test passed, every controller must have exited 0 and (quiet)
    logged no error - checked after the close, so a failing test's own
    error is what pytest shows."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    c = Cluster(tmp_path, model, env=env, images=images)
    try:
        yield c
    finally:
        rcs = c.close()
    logs = "".join((tmp_path / f"controller-{i}.log").read_text() for i in range(len(rcs)))
    assert all(rc == 0 for rc in rcs), logs
    assert not quiet or '"level":"error"' not in logs, logs
    sim_clean(c.ks)


def http_code(url, timeout=2):
    try:
        return urllib.request.urlopen(url, timeout=timeout).status
    except urllib.error.HTTPError as e:
        return e.code
    except OSError:
        return None


def metrics(url):
    text = urllib.request.urlopen(url + "/metrics", timeout=5).read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def api_requests(url, method=None):
    """llm-controller's own count of requests to the API server."""
    return sum(v for (name, labels), v in metrics(url).items() if name == "llm_controller_api_requests_total"
               and (method is None or dict(labels)["method"] == method))


def nest(n, inner="1"):
    return "[" * n + inner + "]" * n


def post(port, path, body, headers=None, timeout=120):
    """POST a body (str, bytes, or a value dumped as JSON): (status, parsed JSON or text, response)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    data = body if isinstance(body, (str, bytes)) else json.dumps(body)
    c.request("POST", path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
    r = c.getresponse()
    text = r.read().decode("utf-8", "replace")
    c.close()
    try:
        return r.status, json.loads(text), r
    except ValueError:
        return r.status, text, r


def alive(*procs):
    for p in procs:
        assert p.proc.poll() is None, f"a process died: exit {p.proc.returncode}"


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


def schema_body(schema):
    return {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}}


# (what, path, body, the text the 400 names): each killed llm-server before
KILLERS = [
    ("a body nested 1,000 deep", "/v1/completions", "[" * 1000 + "]" * 1000, "deeper than 64"),
    ("a const nested 250 deep", "/v1/chat/completions",
     '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":'
     '{"name":"x","schema":{"const":%s}}}}' % nest(250), "deeper than 64"),
    ("an enum nested 250 deep", "/v1/chat/completions",
     '{"messages":[{"role":"user","content":"hi"}],"response_format":{"type":"json_schema","json_schema":'
     '{"name":"x","schema":{"enum":[%s]}}}}' % nest(250), "deeper than 64"),
    ("a pattern of 65 nested groups", "/v1/chat/completions",
     json.dumps(schema_body({"type": "string", "pattern": "^" + "(" * 65 + "a" + ")" * 65 + "$"})), "deeper than 64"),
    ("tool-call arguments nested 1,000 deep", "/v1/chat/completions",
     json.dumps({"messages": [{"role": "user", "content": "hi"},
                              {"role": "assistant", "content": None, "tool_calls": [
                                  {"id": "c1", "type": "function", "function": {"name": "f", "arguments": nest(1000)}}]},
                              {"role": "tool", "tool_call_id": "c1", "content": "ok"}], "max_tokens": 2}),
     "arguments: JSON nested deeper than 64"),
]


def rss_mb(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) // 1024


def raw(port, data, timeout=10):
    """Sends raw bytes, reads to the close: (status, the whole answer)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        got = b""
        try:
            while part := s.recv(65536):
                got += part
        except socket.timeout:
            pass
    return int(got.split()[1]) if got else None, got


def kl_summary(out):
    """llm-perplexity --kl-divergence's summary line: (mean KL, p99 KL, top-1 agreement %, samples)."""
    m = re.search(r"mean ([\d.]+), p99 ([\d.]+).*agreement ([\d.]+)% \((\d+) samples", out)
    assert m, f"no KL summary in: {out}"
    return float(m.group(1)), float(m.group(2)), float(m.group(3)), int(m.group(4))


def parse_ids(stderr, what):
    m = re.search(rf"^{what}:(.*)$", stderr, re.M)
    assert m, f"no '{what}' line in: {stderr}"
    return [int(x) for x in m.group(1).split()]


TOOL = BUILD / "tests" / "grammar_match"


def run_matcher(grammar, strings, tmp_path):
    gf = tmp_path / "g.gbnf"
    if grammar.startswith("@"):
        arg = grammar
    else:
        gf.write_text(grammar, encoding="utf-8")
        arg = str(gf)
    data = "".join(s.hex() + "\n" for s in strings)
    r = subprocess.run([str(TOOL), arg], input=data, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    out = r.stdout.split("\n")[:-1]
    assert len(out) == len(strings)
    return out


NOW = 1764720000  # 2025-12-03, what strftime_now reads on both sides


class Generation(Extension):
    """transformers' {% generation %}: a call block that renders its body."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller):
        return caller()


def oracle_env():
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[Generation, loopcontrols])

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.datetime.fromtimestamp(NOW).strftime(fmt)
    return env


ENV = oracle_env()


def story():
    """stories260K's path; skips the test when ../shared lacks it."""
    if not STORIES.exists():
        pytest.skip("../shared/models/stories260K.gguf not present")
    return STORIES


CHART = ROOT / "charts" / "llm-operator"


def render(*args):
    """The chart as `helm template` renders it (tests/helm/render.go)."""
    exe = BUILD / "bin" / "helm-render"
    exe = exe if exe.exists() else pytest.skip("build/bin/helm-render missing (needs golang-go and sprig)")
    r = subprocess.run([str(exe), *args, str(CHART)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


class FakeBackend:
    """A stand-in llm-server for the router's tests: GET (/metrics, the
    health port's routes) answers metrics; the API answers by a function of
    (path, body, headers):
    (status, body bytes, extra headers), or None to drop the connection
    without an answer (as a backend that dies of the request would);
    self.seen holds what it was sent."""

    def __init__(self, answer, metrics=b"llm_requests_waiting 0\n"):
        outer = self
        self.seen = []

        class H(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self):
                body = metrics
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_POST(self):
                data = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                outer.seen.append((self.path, data, dict(self.headers)))
                got = answer(self.path, data, self.headers)
                if got is None:
                    self.connection.shutdown(socket.SHUT_RDWR)
                    self.close_connection = True
                    return
                status, body, extra = got
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for k, v in extra.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *a):
                pass
        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()
