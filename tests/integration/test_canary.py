"""Canary upgrades end to end on kubesim, with real llm-server pods, the
real llm-router in front (spec.canary turns it on) and a client looping
streamed completions through the official openai package:

- a good new revision advances through its steps - the split the client
  observes (X-Revision) is within 5 points of each step's weight - and is
  promoted: the stable Deployment then runs it and the canary is gone; the
  client never sees a failed request;
- a bad new revision (a share of its requests answered 500) is rolled back
  within an analysis interval, the condition naming the failing signal; the
  client never sees a failure (the router retries on stable) and the
  stable pods are never touched; the same spec does not start it again;
- kubectl's levers (the llmk8s.io/canary-action annotation): pause holds,
  resume continues, abort rolls back, promote promotes;
- mode colocated: a new model loads inside the stable pods and is promoted
  from their own per-revision metrics; when it does not fit the memory
  budget the canary falls back to pods of its own, saying why."""
import base64
import datetime
import hashlib
import json
import re
import shutil
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from harness import GATEWAY_OF_ALL, LLMD, running, wait_for


openai = pytest.importorskip("openai")

CANARY = """  router: {{image: llm-router:test, replicas: 1}}
  canary:
    steps: {steps}
    intervalSeconds: 2
    analysis: {{minRequests: 10}}
{server}"""


def spec(steps, server=""):
    return CANARY.format(steps=json.dumps(steps), server=server)


def router_weight(ip):
    text = urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5).read().decode()
    return next(int(float(line.split()[1])) for line in text.splitlines()
                if line.startswith("llm_router_canary_weight "))


class Client:
    """Streams completions through the router, one after another, noting
    for each the router's canary weight (read before and after: requests
    that straddle a change are not counted) and the revision that answered."""

    def __init__(self, router_ip):
        self.ip, self.seen, self.failures, self.stop = router_ip, [], [], threading.Event()
        self.oa = openai.OpenAI(base_url=f"http://{router_ip}:8000/v1", api_key="none", max_retries=0, timeout=30)
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while not self.stop.is_set():
            try:
                w0 = router_weight(self.ip)
                raw = self.oa.completions.with_raw_response.create(model="story", prompt="Once upon a time",
                                                                   max_tokens=6, stream=True, temperature=0)
                text = "".join(ch.choices[0].text for ch in raw.parse() if ch.choices)
                rev = raw.headers.get("x-revision")
                if not text or rev not in ("stable", "canary"):
                    self.failures.append(f"empty answer or revision {rev!r}")
                elif router_weight(self.ip) == w0:
                    self.seen.append((w0, rev))
            except Exception as e:  # noqa: BLE001 - any failure counts
                self.failures.append(repr(e))
                time.sleep(0.1)

    def finish(self):
        self.stop.set()
        self.th.join(timeout=60)

    def share(self, weight):
        revs = [r for w, r in self.seen if w == weight]
        return len(revs), (100.0 * revs.count("canary") / len(revs) if revs else None)


@pytest.fixture()
def cluster(tmp_path, models):
    with running(tmp_path, models("tiny", "Q8_0")) as c:
        yield c


def canary(c):
    return c.status().get("canary") or {}


def wait_phase(c, phases, timeout):
    """Waits for status.canary.phase in phases; on a timeout the error
    shows the whole status (the analysis says why)."""
    phases = (phases,) if isinstance(phases, str) else phases
    try:
        wait_for(lambda: canary(c).get("phase") in phases, timeout)
    except AssertionError:
        raise AssertionError(f"canary not {phases} in {timeout} s: {json.dumps(c.status(), indent=1)}") from None


def start(c, extra, replicas=1):
    c.controller()
    c.apply(replicas=replicas, extra=extra)
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    wait_for(lambda: c.ready_ips("story-backends"), 60)
    ip = wait_for(lambda: c.ready_ips("story"), 60)[0]
    wait_for(lambda: router_weight(ip) == 0, 30)
    return ip


def events(c):
    return c.k("describe", "llmd", "story").stdout


def test_good_canary_steps_and_promotes(cluster):
    c = cluster
    steps = [{"weight": 30, "pause": 8}, {"weight": 70, "pause": 8}]
    ip = start(c, spec(steps), replicas=2)
    stable_pods = c.ready_ips("story-backends")
    rev0 = c.status()["stableRevision"]
    client = Client(ip)
    pods = lambda: (c.get("deployment", "story")["spec"]["replicas"],  # noqa: E731
                    (c.get("deployment", "story-canary") or {}).get("spec", {}).get("replicas"))
    try:
        time.sleep(2)
        c.apply(replicas=2, seqs=9, extra=spec(steps))  # engine setting: a new revision
        wait_phase(c, ("Starting", "Progressing"), 30)
        assert c.status()["canaryRevision"] != rev0
        wait_for(lambda: c.status().get("canaryWeight") == 30, 60)
        assert c.cond("CanaryProgressing")["status"] == "True"
        assert pods() == (2, 1)  # 2 replicas split by 30%: each revision at least one pod
        wait_for(lambda: c.status().get("canaryWeight") == 70, 60)
        assert pods() == (1, 2)  # in proportion: 70% of 2 is 1.4 -> 2 canary, 1 stable
        wait_phase(c, "Promoted", 120)
        time.sleep(1)
    finally:
        client.finish()
    assert client.failures == [], client.failures[:5]
    for w in (30, 70):
        n, share = client.share(w)
        assert n >= 20 and abs(share - w) <= 5, (w, n, share)
    n0, share0 = client.share(0)
    assert n0 >= 5 and share0 == 0
    st = c.status()
    assert st["stableRevision"] != rev0 and st["stableRevision"] == st["canary"]["revision"][:10]
    assert st["canaryWeight"] == 0 and not st.get("canaryRevision")
    assert c.cond("CanaryPromoted")["status"] == "True" and c.cond("CanaryProgressing")["status"] == "False"
    assert c.cond("CanaryRolledBack")["status"] == "False"
    wait_for(lambda: c.get("deployment", "story-canary") is None, 30)
    dep = c.get("deployment", "story")
    assert dep["metadata"]["annotations"]["llmk8s.io/template-hash"] == st["canary"]["revision"]
    assert "max_seqs: 9" in c.get("configmap", "story-config")["data"]["config.yaml"]
    wait_for(lambda: set(c.ready_ips("story-backends")).isdisjoint(stable_pods) and c.ready_ips("story-backends"), 60)
    assert router_weight(ip) == 0
    ev = events(c)
    for reason in ("CanaryStarted", "CanaryStep", "CanaryPromoting", "CanaryPromoted"):
        assert reason in ev, ev


def canary_requests(ip):
    """The router's count of requests it sent to the canary revision (every
    status class: a canary 500 the router retried on stable counts too)."""
    text = urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5).read().decode()
    return sum(int(float(line.split()[1])) for line in text.splitlines()
               if line.startswith('llm_router_revision_requests_total{revision="canary"'))


class CanaryCount:
    """Notes, on this machine's clock (kubesim's controller shares it),
    when the router had first sent n requests to the canary: the evidence
    the analysis needs, whatever the machine's load made it cost."""

    def __init__(self, ip, n):
        self.ip, self.n, self.at, self.stop = ip, n, None, threading.Event()
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while self.at is None and not self.stop.is_set():
            try:
                if canary_requests(self.ip) >= self.n:
                    self.at = time.time()
            except OSError:
                pass
            time.sleep(0.05)

    def finish(self):
        self.stop.set()
        self.th.join(timeout=10)


@pytest.mark.parametrize("fault,signal", [
    ('["--fault-error-ratio", "0.5"]', "ErrorRatio"),  # half its requests answer 500
    ('["--fault-delay-ms", "300"]', "TimeToFirstToken"),  # each canary request 300 ms late
])
def test_bad_canary_rolls_back_on_its_signal(cluster, fault, signal):
    c = cluster
    steps = [{"weight": 50, "pause": 600}]
    ip = start(c, spec(steps))
    stable_pods = c.ready_ips("story-backends")
    rev0 = c.status()["stableRevision"]
    assert canary_requests(ip) == 0
    client, count = Client(ip), CanaryCount(ip, 10)
    try:
        time.sleep(1)
        c.apply(replicas=1, extra=spec(steps, f"  server: {{extraArgs: {fault}}}\n"))
        wait_phase(c, "RolledBack", 60)
        time.sleep(1)
    finally:
        client.finish()
        count.finish()
    # the rollback comes at the first analysis with the 10 canary requests
    # (minRequests) it needs: at most one 2 s interval after the router had
    # sent them, plus 1 s for the whole-second timestamp and 1 s for the
    # controller's turn to read the router on a loaded machine
    started = canary(c)["stepStartTime"]
    rolled = datetime.datetime.fromisoformat(c.cond("CanaryRolledBack")["lastTransitionTime"].replace("Z", "+00:00"))
    assert count.at is not None and started <= count.at + 1, (started, count.at)
    assert rolled.timestamp() - count.at <= 2 + 1 + 1, (count.at, rolled)
    assert client.failures == [], client.failures[:5]
    cond = c.cond("CanaryRolledBack")
    assert cond["status"] == "True" and cond["reason"] == signal, cond
    assert ("canary error ratio" if signal == "ErrorRatio" else "p99 time to first token") in cond["message"], cond
    st = c.status()
    assert st["stableRevision"] == rev0 and st["canary"]["rolledBackRevision"] == st["canary"]["revision"]
    assert st["canaryWeight"] == 0 and st["phase"] == "Ready"
    # Ready, but not what the spec asks: said until the spec changes
    served = c.cond("SpecServed")
    assert served["status"] == "False" and served["reason"] == "RolledBack", served
    assert st["canary"]["revision"][:10] in served["message"] and rev0 in served["message"], served
    assert c.cond("Progressing")["reason"] == "SpecRolledBack"
    wait_for(lambda: c.get("deployment", "story-canary") is None, 30)
    assert c.ready_ips("story-backends") == stable_pods  # the stable pods were never replaced
    assert c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"][:10] == rev0
    assert signal in events(c)
    time.sleep(5)  # the same spec does not start the rolled-back revision again
    assert canary(c).get("phase") == "RolledBack" and c.get("deployment", "story-canary") is None


def test_kubectl_levers(cluster):
    c = cluster
    steps = [{"weight": 20, "pause": 600}]
    ip = start(c, spec(steps))
    client = Client(ip)
    annotate = lambda v: c.k("annotate", "--overwrite", "llmd", "story", f"llmk8s.io/canary-action={v}")  # noqa: E731
    try:
        c.apply(replicas=1, seqs=9, extra=spec(steps))
        wait_phase(c, "Progressing", 60)
        annotate("pause")
        wait_phase(c, "Paused", 20)
        assert c.cond("CanaryProgressing")["reason"] == "Paused"
        annotate("resume")
        wait_phase(c, "Progressing", 20)
        wait_for(lambda: "llmk8s.io/canary-action" not in (c.get("llmd", "story")["metadata"].get("annotations") or {}), 20)
        annotate("abort")
        wait_phase(c, "RolledBack", 20)
        assert c.cond("CanaryRolledBack")["reason"] == "Aborted"
        c.apply(replicas=1, seqs=10, extra=spec(steps))  # a newer revision starts a new canary
        wait_phase(c, "Progressing", 60)
        annotate("promote")
        wait_phase(c, "Promoted", 90)
    finally:
        client.finish()
    assert client.failures == [], client.failures[:5]
    assert "max_seqs: 10" in c.get("configmap", "story-config")["data"]["config.yaml"]
    assert "llmk8s.io/canary-action" not in (c.get("llmd", "story")["metadata"].get("annotations") or {})


def colocated_spec(steps, server=""):
    return spec(steps, server).replace("  canary:\n", "  canary:\n    mode: colocated\n")


def apply_model(c, path, extra):
    """The LLMDeployment with another model file (a new revision that
    differs in the model only)."""
    c.k("apply", "-f", "-", stdin=LLMD.format(name="story", replicas=1, model=path, dir=path.parent,
                                              image="llm-server:test", seqs=8, extra=extra))


def admin_token_is_a_secret(c, ip):
    """The pods' /admin/canary token: 64 hex digits in the Secret
    story-admin-H that the controller made (owned by the LLMDeployment; H
    and the token derive from a random key in the controller's own Secret),
    mounted as a file; not in the ConfigMap, and the token the controller
    used to derive from the object's uid alone is refused. Returns the
    Secret's name."""
    pod = c.get("deployment", "story")["spec"]["template"]["spec"]
    vol = next(v for v in pod["volumes"] if v["name"] == "admin")
    name = vol["secret"]["secretName"]
    assert re.fullmatch("story-admin-[0-9a-f]{10}", name) and vol["secret"]["defaultMode"] == 0o440, vol
    assert "/etc/llm-admin/token" in pod["containers"][0]["args"], pod["containers"][0]["args"]
    sec = c.get("secret", name)
    assert sec["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment", sec["metadata"]
    token = base64.b64decode(sec["data"]["token"]).decode()
    assert re.fullmatch("[0-9a-f]{64}", token), token
    assert token not in c.get("configmap", "story-config")["data"]["config.yaml"]
    key = c.get("secret", "llm-controller-admin-key")
    assert len(base64.b64decode(key["data"]["key"])) == 32
    uid = c.get("llmd", "story")["metadata"]["uid"]

    def code(tok):
        req = urllib.request.Request(f"http://{ip}:8080/admin/canary", headers={"Authorization": f"Bearer {tok}"})
        try:
            return urllib.request.urlopen(req, timeout=5).status
        except urllib.error.HTTPError as e:
            return e.code
    assert code(token) == 200
    assert code(hashlib.sha256(f"{uid}/".encode()).hexdigest()) == 401
    return name


def test_colocated_canary_promotes_inside_the_stable_pods(cluster):
    """mode colocated, only the model changed: the new model loads inside
    the stable pods (no canary Deployment), they split the requests, the
    analysis reads the pods' per-revision metrics, and it is promoted."""
    c = cluster
    copy = c.model.parent / "canary-copy.gguf"
    shutil.copy(c.model, copy)
    steps = [{"weight": 50, "pause": 4}]
    ip = start(c, colocated_spec(steps))
    pods0 = wait_for(lambda: c.ready_ips("story-backends"), 60)  # (a loaded machine: the pod may still be turning ready)
    client = Client(ip)
    try:
        time.sleep(1)
        apply_model(c, copy, colocated_spec(steps))
        wait_phase(c, "Progressing", 60)
        assert canary(c)["mode"] == "colocated", canary(c)
        assert c.cond("CanaryColocated")["status"] == "True", c.status()
        assert c.get("deployment", "story-canary") is None
        assert c.ready_ips("story-backends") == pods0, (pods0, c.ready_ips("story-backends"))
        m = urllib.request.urlopen(f"http://{pods0[0]}:8080/metrics", timeout=5).read().decode()
        assert "llm_canary_loaded 1" in m and "llm_canary_weight 50" in m
        admin_token_is_a_secret(c, pods0[0])
        wait_phase(c, "Promoted", 90)
    finally:
        client.finish()
    assert client.failures == [], client.failures[:5]
    assert f"model: \"{copy}\"" in c.get("configmap", "story-config")["data"]["config.yaml"]
    assert c.cond("CanaryPromoted")["status"] == "True"
    analysis = canary(c)["lastAnalysis"]
    assert analysis["result"] == "Pass" and analysis["canaryRequests"] >= 10, analysis


def test_colocated_admin_secret_cannot_be_planted(cluster):
    """A Secret planted where the old controller kept the token (story-admin,
    with our managed-by label) is never used: the pods mount the Secret
    whose name the controller derives from its own key, which no one else
    can predict. A spoilt key is said in an event until it is mended."""
    c = cluster
    c.k("create", "secret", "generic", "story-admin", "--from-literal=token=" + "0" * 64)
    c.k("label", "secret", "story-admin", "app.kubernetes.io/managed-by=llm-controller")
    c.k("create", "secret", "generic", "llm-controller-admin-key", "--from-literal=key=short")
    c.k("label", "secret", "llm-controller-admin-key", "app.kubernetes.io/managed-by=llm-controller")
    c.controller()
    c.apply(extra=colocated_spec([{"weight": 50, "pause": 4}]))
    wait_for(lambda: "AdminKeyInvalid" in events(c), 30)
    assert "is not 32 bytes of base64" in events(c), events(c)
    assert c.get("deployment", "story") is None
    c.k("delete", "secret", "llm-controller-admin-key")  # retried with back-off: a new key, no edit needed
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    ip = wait_for(lambda: c.ready_ips("story-backends"), 60)[0]
    assert admin_token_is_a_secret(c, ip) != "story-admin"


def test_colocated_falls_back_to_pods_when_it_does_not_fit(cluster):
    c = cluster
    copy = c.model.parent / "canary-copy.gguf"
    shutil.copy(c.model, copy)
    steps = [{"weight": 50, "pause": 600}]
    tight = colocated_spec(steps, '  server: {extraArgs: ["--memory_budget_mb", "1"]}\n')
    start(c, tight)
    apply_model(c, copy, tight)
    wait_for(lambda: c.cond("CanaryColocated").get("reason") == "ColocationDoesNotFit", 60)
    cond = c.cond("CanaryColocated")
    assert cond["status"] == "False" and "the canary needs" in cond["message"], cond
    assert "ColocationDoesNotFit" in events(c)
    wait_phase(c, "Progressing", 90)  # in pods of its own now
    assert canary(c)["mode"] == "pods" and c.get("deployment", "story-canary")


def test_canary_behind_a_gateway_splits_and_rolls_back(cluster):
    """Clients reach the deployment only through an LLMGateway (which sends to the pods itself, past the
    deployment's router): the gateway splits by the canary's weight (both revisions answer it), and the
    controller judges the canary from the gateway's route counters too - a bad revision (half its requests
    answer 500) is rolled back on its error ratio, though the deployment's own router saw no request; the
    gateway's clients never see a failure (it retries on stable)."""
    c = cluster
    steps = [{"weight": 50, "pause": 600}]
    router_ip = start(c, spec(steps))
    c.k("apply", "-f", "-", stdin=GATEWAY_OF_ALL)
    gw = wait_for(lambda: (ips := c.ready_ips("front")) and ips[0], 120, "the gateway pod ready")
    oa = openai.OpenAI(base_url=f"http://{gw}:8000/v1", api_key="none", max_retries=0, timeout=30)
    wait_for(lambda: [m.id for m in oa.models.list().data] == ["story"], 60, "the gateway serving story")
    revs, failures, stop = [], [], threading.Event()

    def loop():
        while not stop.is_set():
            try:
                raw = oa.completions.with_raw_response.create(model="story", prompt="Once upon a time", max_tokens=4)
                revs.append(raw.headers.get("x-revision"))
                assert raw.parse().choices[0].text is not None
            except Exception as e:  # noqa: BLE001 - any failure counts
                failures.append(repr(e))
                time.sleep(0.1)
    th = threading.Thread(target=loop, daemon=True)
    th.start()
    try:
        c.apply(replicas=1, extra=spec(steps, '  server: {extraArgs: ["--fault-error-ratio", "0.5"]}\n'))
        wait_phase(c, "RolledBack", 120)
    finally:
        stop.set()
        th.join(timeout=60)
    cond = c.cond("CanaryRolledBack")
    assert cond["status"] == "True" and cond["reason"] == "ErrorRatio", cond
    assert failures == [], failures[:5]
    # weight 50 (every other request, by the smooth split), half of the canary's answers failed and retried on
    # stable: a quarter of the answers came from the canary
    first, last = revs.index("canary"), len(revs) - 1 - revs[::-1].index("canary")  # while it ran
    during = revs[first:last + 1]
    share = during.count("canary") / len(during)
    assert during.count("canary") >= 10 and 0.15 <= share <= 0.35, (during.count("canary"), len(during))
    assert canary_requests(router_ip) == 0  # the deployment's own router saw none of it: the gateway's counted
    wait_for(lambda: c.get("deployment", "story-canary") is None, 30)


SPY = r'''
import http.server, os, sys, threading
log = open(sys.argv[1], "a")
class H(http.server.BaseHTTPRequestHandler):
    def handle_one(self):
        log.write(f"{self.command} {self.path} {self.headers.get('Authorization')}\n"); log.flush()
        self.send_response(200); self.send_header("Content-Type", "application/json"); self.end_headers()
        self.wfile.write(b'{"state": "ready", "status": "ok"}')
    do_GET = do_POST = handle_one
    def log_message(self, *a): pass
ip = os.environ["POD_IP"]
for port in (8081,):
    threading.Thread(target=http.server.ThreadingHTTPServer((ip, port), H).serve_forever, daemon=True).start()
http.server.ThreadingHTTPServer((ip, 8080), H).serve_forever()
'''


def test_colocated_admin_token_goes_only_to_our_pods(tmp_path, models):
    """A pod that anyone allowed to create pods could make, with our labels and Ready, answering like a
    server: the controller's admin calls (and so its token) reach only pods whose owner chain leads to the
    LLMDeployment's Deployment, never it."""
    spy = tmp_path / "spy.py"
    spy.write_text(SPY)
    seen = tmp_path / "spy.log"
    with running(tmp_path, models("tiny", "Q8_0"), images={"spy:test": [sys.executable, str(spy), str(seen)]}) as c:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "planted", "labels": {
                   "app.kubernetes.io/name": "llm-server", "app.kubernetes.io/instance": "story",
                   "app.kubernetes.io/managed-by": "llm-controller"}},
               "spec": {"containers": [{"name": "spy", "image": "spy:test",
                                        "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                                        "readinessProbe": {"httpGet": {"path": "/readyz", "port": 8081}, "periodSeconds": 1}}]}}
        c.k("apply", "-f", "-", stdin=json.dumps(pod))
        wait_for(lambda: any(cd["type"] == "Ready" and cd["status"] == "True"
                             for cd in (c.get("pod", "planted") or {}).get("status", {}).get("conditions", [])), 60)
        copy = c.model.parent / "canary-copy.gguf"
        shutil.copy(c.model, copy)
        steps = [{"weight": 50, "pause": 2}]
        start(c, colocated_spec(steps))
        apply_model(c, copy, colocated_spec(steps))
        wait_phase(c, "Progressing", 120)  # the admin calls were made: load, then the first step's weight
        assert canary(c)["mode"] == "colocated", canary(c)
    calls = seen.read_text() if seen.exists() else ""
    assert "Bearer" not in calls, calls
