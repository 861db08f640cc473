"""End to end on kubesim: the CRD applied, llm-controller running, an
LLMDeployment applied -> the controller creates its ConfigMap, Deployment,
Service and PodDisruptionBudget -> kubesim runs the real llm-server as pods
-> they become ready -> the status shows Ready with the right counts and
conditions -> a completion through an endpoint of the Service answers ->
`kubectl scale llmd` scales -> edits roll the pods with no failed request
-> deleting the LLMDeployment removes every child. Then the reasons a
deployment is not ready, faults (API server restart, forced conflicts, a
killed pod), leader election and 200 objects."""
import json
import os
import random
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request

import pytest

from harness import Cluster, LLMD, api_requests, http_code, metrics, wait_for


def complete(ip, timeout=30, port=8080):
    body = json.dumps({"model": "story", "prompt": "Once upon a time", "max_tokens": 4, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://{ip}:{port}/v1/completions", body, {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=timeout).read())


def test_apply_serve_scale_delete(cluster):
    c = cluster
    ctl, url = c.controller()
    c.apply()
    st = wait_for(lambda: (s := c.status()).get("phase") == "Ready" and s, 90)
    assert st["readyReplicas"] == 1 and st["replicas"] == 1 and st["observedGeneration"] >= 1
    assert [x["type"] for x in st["conditions"]] == ["Ready", "Progressing", "Degraded", "SpecServed"]
    assert [x["status"] for x in st["conditions"]] == ["True", "False", "False", "True"]
    assert st["endpoint"] == "http://story.default.svc:8080" and len(st["stableRevision"]) == 10
    dep = c.get("deployment", "story")
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"
    pod = dep["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    assert ctr["startupProbe"]["httpGet"]["path"] == "/startupz" and ctr["securityContext"]["readOnlyRootFilesystem"]
    # the probes go to the health listener (threads of its own), not the API port
    assert {p["name"]: p["containerPort"] for p in ctr["ports"]} == {"http": 8080, "health": 8081}
    assert {ctr[k]["httpGet"]["port"] for k in ("startupProbe", "readinessProbe", "livenessProbe")} == {8081}
    assert pod["terminationGracePeriodSeconds"] == 2 + 20 + 10 and pod["securityContext"]["runAsNonRoot"]
    cfg = c.get("configmap", "story-config")["data"]["config.yaml"]
    assert f'model: "{c.model}"' in cfg and "max_seqs: 8" in cfg and "shutdown_delay_s: 2" in cfg
    assert "health_port: 8081" in cfg
    assert c.get("pdb", "story")["spec"]["maxUnavailable"] == 1
    ip = wait_for(lambda: c.ready_ips(), 30)[0]
    assert complete(ip)["usage"]["completion_tokens"] == 4
    # level-based: nothing changed, nothing written (kubesim alone writes the
    # Deployment's status, so its generation and the children nobody else
    # touches are what tell)
    before = [(c.get(kind, name) or {}).get("metadata", {}).get(field) for kind, name, field in
              (("deployment", "story", "generation"), ("service", "story", "resourceVersion"),
               ("configmap", "story-config", "resourceVersion"), ("pdb", "story", "generation"))]
    time.sleep(1.5)
    assert [(c.get(kind, name) or {}).get("metadata", {}).get(field) for kind, name, field in
            (("deployment", "story", "generation"), ("service", "story", "resourceVersion"),
             ("configmap", "story-config", "resourceVersion"), ("pdb", "story", "generation"))] == before

    def quiet():  # and nothing polls: the controller comes to rest (its own count of API requests)
        n = api_requests(url)
        time.sleep(1.5)
        return api_requests(url) == n
    wait_for(quiet, 20)
    assert "scaled" in c.k("scale", "llmd/story", "--replicas=3").stdout
    wait_for(lambda: (s := c.status()).get("readyReplicas") == 3 and s.get("phase") == "Ready", 90)
    assert len(wait_for(lambda: len(c.ready_ips()) == 3 and c.ready_ips(), 30)) == 3
    described = c.k("describe", "llmd", "story").stdout
    for reason in ("Created", "Ready", "Scaled"):
        assert reason in described, described
    assert "scaled from 1 to 3 replicas" in described
    m = metrics(url)
    assert m[("llm_controller_reconciles_total", (("result", "success"),))] >= 3
    assert m[("llm_controller_reconcile_duration_seconds_count", ())] >= 3
    assert m[("llm_controller_leader", ())] == 1 and m[("llm_controller_events_total", ())] >= 3
    assert http_code(url + "/healthz") == 200
    c.k("delete", "llmd", "story")
    wait_for(lambda: all(c.get(kind, name) is None for kind, name in
                         (("deployment", "story"), ("service", "story"), ("pdb", "story"),
                          ("configmap", "story-config"))), 30)


class Traffic:
    """A client that keeps sending completions (send(ip), default
    complete), each to a ready endpoint of the Service read just before
    (as kube-proxy would route)."""

    def __init__(self, c, send=None):
        self.c, self.ok, self.failures, self.stop = c, 0, [], threading.Event()
        self.send = send or complete
        import kubernetes
        self.api = kubernetes.config.new_client_from_config(str(c.dir / "kubeconfig"))
        self.v1 = kubernetes.client.CoreV1Api(self.api)
        self.th = threading.Thread(target=self.loop, daemon=True)
        self.th.start()

    def loop(self):
        while not self.stop.is_set():
            ep = self.v1.read_namespaced_endpoints("story", "default")
            ips = [a.ip for s in ep.subsets or [] for a in s.addresses or []]
            if not ips:
                self.failures.append("no endpoints")
                time.sleep(0.1)
                continue
            try:
                self.send(random.choice(ips))
                self.ok += 1
            except Exception as e:  # noqa: BLE001 - any failure counts
                self.failures.append(repr(e))

    def finish(self):
        self.stop.set()
        self.th.join(timeout=60)
        self.api.close()


def pod_names(c, instance="story"):
    pods = json.loads(c.k("get", "pods", "-l", f"app.kubernetes.io/instance={instance}", "-o", "json").stdout)["items"]
    return {p["metadata"]["name"] for p in pods}


def test_router_rollout_loses_no_request(cluster):
    """spec.router with 2 replicas: changing its policy rolls the router
    pods (surge; each old one turns not ready, keeps routing through its
    shutdown delay, then drains its streams) while the official openai
    client, without retries, streams completions to a ready endpoint of
    the Service read before each: not one fails."""
    openai = pytest.importorskip("openai")
    pytest.importorskip("kubernetes")
    c = cluster

    def stream(ip):
        oa = openai.OpenAI(base_url=f"http://{ip}:8000/v1", api_key="none", max_retries=0, timeout=30)
        try:
            chunks = oa.completions.create(model="story", prompt="Once upon a time", max_tokens=16, stream=True,
                                           temperature=0)
            if not "".join(ch.choices[0].text for ch in chunks if ch.choices):
                raise AssertionError(f"empty answer from router {ip}")
        finally:
            oa.close()

    c.controller()
    c.apply(extra="  router: {enabled: true, image: llm-router:test, replicas: 2}\n")
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    wait_for(lambda: len(c.ready_ips()) == 2 and c.ready_ips("story-backends"), 60)
    before = pod_names(c, "story-router")
    t = Traffic(c, send=stream)
    try:
        wait_for(lambda: t.ok >= 5 or t.failures, 60)
        ok0 = t.ok
        c.apply(extra="  router: {enabled: true, image: llm-router:test, replicas: 2, policy: round-robin}\n")
        wait_for(lambda: len(c.ready_ips()) == 2 and not (pod_names(c, "story-router") & before), 120)
        ok = t.ok
        assert ok - ok0 >= 5, (ok0, ok)  # requests went on during the rollout
        wait_for(lambda: t.ok >= ok + 5 or t.failures, 60)  # served by the new pods too
    finally:
        t.finish()
    assert t.failures == [] and t.ok >= 10, (t.ok, t.failures[:5])
    args = c.get("deployment", "story-router")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--policy") + 1] == "round-robin", args


def evict(v1, name, deadline):
    """Evicts pod name as `kubectl drain` does: policy/v1 Eviction, retried while the disruption budget refuses
    (429); the number of refusals."""
    import kubernetes
    refused = 0
    body = kubernetes.client.V1Eviction(metadata=kubernetes.client.V1ObjectMeta(name=name, namespace="default"))
    while True:
        try:
            v1.create_namespaced_pod_eviction(name, "default", body)
            return refused
        except kubernetes.client.exceptions.ApiException as e:
            if e.status != 429 or time.time() > deadline:
                raise
            assert "disruption budget" in e.body, e.body
            refused += 1
            time.sleep(0.5)


def test_draining_the_routers_loses_no_request(cluster):
    """A node drain of the router pods, one eviction at a time through the official kubernetes client as `kubectl
    drain` sends them: the routers' PodDisruptionBudget (maxUnavailable 1) refuses the second eviction (429) until
    the first pod's replacement is ready, each evicted router stops being ready, keeps routing through its
    shutdown delay and drains; a client sending completions to a ready endpoint of the Service read before each
    sees no failure. The routers spread over nodes (preferred anti-affinity) and zones (ScheduleAnyway)."""
    pytest.importorskip("kubernetes")
    c = cluster
    c.controller()
    c.apply(extra="  router: {enabled: true, image: llm-router:test, replicas: 2}\n")
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    wait_for(lambda: len(c.ready_ips()) == 2 and c.ready_ips("story-backends"), 60)
    pdb = wait_for(lambda: c.get("pdb", "story-router"), 30)
    assert pdb["spec"]["maxUnavailable"] == 1
    pod = c.get("deployment", "story-router")["spec"]["template"]["spec"]
    assert pod["affinity"]["podAntiAffinity"] and pod["topologySpreadConstraints"][0]["whenUnsatisfiable"] == "ScheduleAnyway"
    before = sorted(pod_names(c, "story-router"))
    t = Traffic(c, send=lambda ip: complete(ip, port=8000))  # the routers' port
    refused = 0
    try:
        wait_for(lambda: t.ok >= 5 or t.failures, 60)
        deadline = time.time() + 120
        for name in before:  # the drain: one after the other, each retried while the budget says no
            refused += evict(t.v1, name, deadline)
        wait_for(lambda: len(c.ready_ips()) == 2 and not (pod_names(c, "story-router") & set(before)), 120)
        ok = t.ok
        wait_for(lambda: t.ok >= ok + 5 or t.failures, 60)  # the new pods serve
    finally:
        t.finish()
    assert t.failures == [] and t.ok >= 10, (t.ok, t.failures[:5])
    assert refused >= 1  # the second eviction waited for the first pod's replacement
    c.apply(extra="  router: {enabled: false}\n")  # turned off: the budget goes with the routers
    wait_for(lambda: c.get("pdb", "story-router") is None and c.get("deployment", "story-router") is None, 60)


def test_rollouts_lose_no_request(cluster):
    """Editing an engine field rolls the pods (surge), then again with
    rollout.maxSurge 0 (in place, one at a time): a client looping
    requests throughout sees no failure."""
    pytest.importorskip("kubernetes")
    c = cluster
    c.controller()
    c.apply(replicas=2)
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    wait_for(lambda: len(c.ready_ips()) == 2, 30)
    t = Traffic(c)
    try:
        for seqs, extra in ((16, ""), (12, "  rollout: {maxSurge: 0}\n")):
            before, rev = pod_names(c), c.status()["stableRevision"]
            time.sleep(1)
            c.apply(replicas=2, seqs=seqs, extra=extra)
            wait_for(lambda: (s := c.status()).get("stableRevision") != rev and s.get("phase") == "Ready"
                     and not (pod_names(c) & before), 120)
            if extra:
                strategy = c.get("deployment", "story")["spec"]["strategy"]["rollingUpdate"]
                assert strategy == {"maxSurge": 0, "maxUnavailable": 1}
            assert f"max_seqs: {seqs}" in c.get("configmap", "story-config")["data"]["config.yaml"]
    finally:
        t.finish()
    assert t.failures == [] and t.ok >= 20, (t.ok, t.failures[:5])
    assert "RollingUpdate" in c.k("describe", "llmd", "story").stdout


def test_reasons_not_ready(tmp_path, model):
    """Each way a deployment can fail to become ready shows as a condition
    reason with a message a human can act on: a missing model file, a
    checksum mismatch, a crashing container, an image that cannot be
    pulled, a pod waiting for a GPU, a spec the controller cannot use."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    c = Cluster(tmp_path, model)
    try:
        c.controller()
        missing = tmp_path / "missing.gguf"  # its folder is there (the hostPath volume mounts), the file not
        c.apply("a", model=missing)
        c.apply("b", extra="  resources: {limits: {nvidia.com/gpu: 1}}\n")
        c.apply("c", image="crash:test")
        c.apply("d", image="nowhere:latest")
        c.apply("e")
        c.k("patch", "llmd", "e", "--type", "merge", "-p", '{"spec":{"engine":{"kvCacheMemory":"lots"}}}')
        c.apply("f")
        c.k("patch", "llmd", "f", "--type", "merge", "-p", json.dumps({"spec": {"model": {"sha256": "0" * 64}}}))
        want = {"a": ("ModelNotFound", str(missing)), "b": ("WaitingForGPU", "Insufficient nvidia.com/gpu"),
                "c": ("CrashLooping", "exit code 3"), "d": ("ImagePullFailed", "nowhere:latest"),
                "e": ("InvalidSpec", "spec.engine.kvCacheMemory"), "f": ("ModelChecksumMismatch", f"expected {'0' * 64}")}

        def seen():
            got = {n: (c.cond("Ready", n).get("reason"), c.cond("Ready", n).get("message", "")) for n in want}
            return all(got[n][0] == r and m in got[n][1] for n, (r, m) in want.items()) and got
        got = wait_for(seen, 90)
        # a pod asking for a GPU runs llm-server's CUDA backend; the others keep the default (no line)
        assert "backend: cuda" in c.get("configmap", "b-config")["data"]["config.yaml"]
        assert "backend:" not in c.get("configmap", "c-config")["data"]["config.yaml"]
        # spec.engine.prefixCache: false reaches llm-server's config; the default writes no line
        c.k("patch", "llmd", "d", "--type", "merge", "-p", '{"spec":{"engine":{"prefixCache":false}}}')
        wait_for(lambda: "prefix_cache: false" in c.get("configmap", "d-config")["data"]["config.yaml"], 30)
        assert "prefix_cache" not in c.get("configmap", "c-config")["data"]["config.yaml"]
        for n in ("a", "c", "d", "e", "f"):
            assert c.status(n)["phase"] == "Degraded" and c.cond("Degraded", n)["status"] == "True", got
        assert c.status("b")["phase"] == "Pending" and c.cond("Degraded", "b")["status"] == "False"
        time.sleep(12)  # the failed servers are restarted by their liveness probes meanwhile
        assert c.cond("Ready", "a")["reason"] == "ModelNotFound" and c.cond("Ready", "f")["reason"] == \
            "ModelChecksumMismatch"
        ev = c.k("get", "events", "--field-selector", "involvedObject.name=a", "-o", "json").stdout
        assert any(e["reason"] == "ModelNotFound" and e["type"] == "Warning" for e in json.loads(ev)["items"])
    finally:
        c.close()


def test_faults_restart_conflict_killed_pod(cluster):
    """The API server restarts mid-run (watches break, resourceVersions
    expire): the controller relists and converges; forced 409s on the
    Deployment are retried; a killed pod is replaced and the status shows
    the dip and the recovery; children deleted by hand are recreated."""
    c = cluster
    ctl, url = c.controller()
    c.apply(replicas=1)
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    hold = c.tmp / "hold-down"
    hold.write_text("")
    c.fault({"restart": {"downSeconds": 2, "holdFile": str(hold)}})
    wait_for(lambda: c.k("get", "--raw", "/healthz", check=False).returncode != 0, 30)  # it is down
    hold.unlink()
    wait_for(lambda: c.k("get", "--raw", "/healthz", check=False).returncode == 0, 30)  # and back
    c.k("scale", "llmd/story", "--replicas=2")
    wait_for(lambda: (s := c.status()).get("readyReplicas") == 2 and s.get("phase") == "Ready", 90)
    assert metrics(url)[("llm_controller_watch_relists_total", ())] >= 1
    errors0 = metrics(url)[("llm_controller_reconciles_total", (("result", "error"),))]
    c.fault({"conflicts": {"deployments": 2}})
    c.k("scale", "llmd/story", "--replicas=1")
    wait_for(lambda: c.get("deployment", "story")["spec"]["replicas"] == 1, 30)
    assert metrics(url)[("llm_controller_reconciles_total", (("result", "error"),))] >= errors0 + 2
    wait_for(lambda: (s := c.status()).get("phase") == "Ready" and s.get("replicas") == 1, 60)
    victim = sorted(pod_names(c))[0]
    was = c.cond("Ready")["lastTransitionTime"]
    time.sleep(1.1)  # transition times have one-second resolution
    c.k("delete", "pod", victim, "--grace-period=0", "--wait=false")
    # replaced, and the status saw it: Ready went False and back (a new transition time)
    wait_for(lambda: victim not in pod_names(c) and c.status().get("phase") == "Ready" and
             c.cond("Ready")["lastTransitionTime"] > was, 60)
    uids = {kind: c.get(kind, name)["metadata"]["uid"] for kind, name in
            (("service", "story"), ("configmap", "story-config"), ("pdb", "story"))}
    for kind, name in (("service", "story"), ("configmap", "story-config"), ("pdb", "story")):
        c.k("delete", kind, name)  # a child deleted by hand comes back (its informer sees it go)
    wait_for(lambda: all((o := c.get(kind, name)) and o["metadata"]["uid"] != uids[kind] for kind, name in
                         (("service", "story"), ("configmap", "story-config"), ("pdb", "story"))), 20)
    assert ctl.poll() is None


def test_leader_election(cluster):
    """Two replicas: one holds the Lease and reconciles; killed, the other
    takes over within the lease duration and reconciles new objects."""
    c = cluster
    args = ["--leader-elect", "--lease-duration", "6", "--renew-deadline", "4", "--retry-period", "0.5"]
    (a, ua), (b, ub) = c.controller(*args), c.controller(*args)
    wait_for(lambda: metrics(ua)[("llm_controller_leader", ())] + metrics(ub)[("llm_controller_leader", ())] == 1, 20)
    leader, standby, surl = (a, b, ub) if metrics(ua)[("llm_controller_leader", ())] == 1 else (b, a, ua)
    c.apply("one", replicas=0)
    wait_for(lambda: c.get("deployment", "one") is not None and c.status("one").get("phase") == "Idle", 30)  # no pods: Idle
    assert metrics(surl)[("llm_controller_reconciles_total", (("result", "success"),))] == 0
    lease = c.get("lease", "llm-controller")
    assert lease["spec"]["holderIdentity"].endswith(f"_{leader.pid}")
    leader.send_signal(signal.SIGKILL)
    leader.wait()
    t0 = time.time()
    wait_for(lambda: metrics(surl)[("llm_controller_leader", ())] == 1, 15)
    assert time.time() - t0 < 6 + 2  # the lease duration, plus a retry period or so
    c.apply("two", replicas=0)
    wait_for(lambda: c.get("deployment", "two") is not None and c.status("two").get("phase") == "Idle", 30)
    assert c.get("lease", "llm-controller")["spec"]["holderIdentity"].endswith(f"_{standby.pid}")
    standby.terminate()  # a graceful stop gives the lease up
    assert standby.wait(timeout=30) == 0
    assert c.get("lease", "llm-controller")["spec"]["holderIdentity"] == ""
    for p, log in [x for x in c.ctls if x[0] is leader]:  # killed on purpose: not a failed exit
        log.close()
        c.ctls.remove((p, log))


def cpu_seconds(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_kib(pid):
    return int(next(ln.split()[1] for ln in open(f"/proc/{pid}/status") if ln.startswith("VmRSS")))


def test_two_hundred_converge_then_rest(cluster):
    """200 LLMDeployments (no pods: replicas 0) converge - every child
    created, every status Ready - and then the controller rests: no CPU
    to speak of and no memory growth while nothing changes."""
    c = cluster
    ctl, url = c.controller()
    docs = "---\n".join(LLMD.format(name=f"m{i:03d}", replicas=0, model=c.model, dir=c.model.parent,
                                    image="llm-server:test", seqs=8, extra="") for i in range(200))
    t0 = time.time()
    c.k("apply", "-f", "-", stdin=docs)

    def converged():
        items = json.loads(c.k("get", "llmd", "-o", "json").stdout)["items"]
        return len(items) == 200 and all((i.get("status") or {}).get("phase") == "Idle" for i in items)  # replicas 0
    wait_for(converged, 240)
    took = time.time() - t0
    assert len(json.loads(c.k("get", "deployments", "-o", "json").stdout)["items"]) == 200
    time.sleep(2)
    cpu0, rss0, n0 = cpu_seconds(ctl.pid), rss_kib(ctl.pid), metrics(url)[("llm_controller_reconcile_duration_seconds_count", ())]
    time.sleep(10)
    cpu1, rss1, n1 = cpu_seconds(ctl.pid), rss_kib(ctl.pid), metrics(url)[("llm_controller_reconcile_duration_seconds_count", ())]
    print(f"200 LLMDeployments converged in {took:.1f} s; at rest: {cpu1 - cpu0:.3f} s CPU in 10 s, "
          f"RSS {rss0} -> {rss1} KiB, {n1 - n0:.0f} reconciles")
    assert n1 == n0  # nothing polls at rest
    assert cpu1 - cpu0 < 0.2 and rss1 - rss0 < 1024
    # a reconcile of each at rest (a metadata change queues them all) asks the API server nothing:
    # the LLMDeployments and their children are read from the informers' caches, nothing differs
    a0 = api_requests(url)
    c.k("annotate", "llmd", "--all", "example.com/poke=1")
    wait_for(lambda: metrics(url)[("llm_controller_reconcile_duration_seconds_count", ())] >= n1 + 200, 60)
    assert api_requests(url) == a0, f"{api_requests(url) - a0} API requests for 200 reconciles at rest"


def test_chat_template_configmap_must_be_immutable(cluster):
    """spec.chatTemplate names a ConfigMap that pods read when they start, so one edited in place would reach
    new pods with no new revision (no canary, no quality gate). A missing or mutable one is refused, saying
    what to do, and changes nothing (the served revision stays); an immutable one serves and its edits are
    refused by the API server (kubesim as kube-apiserver) - a new template is a new ConfigMap."""
    c = cluster
    c.controller()
    template = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"

    def configmap(name, immutable, text=template):
        c.k("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                                  "data": {"template.jinja": text}, "immutable": immutable}))
    c.apply()
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    rev = c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"]
    refused = lambda: c.cond("Ready").get("reason") == "ChatTemplateRefused" and c.cond("Ready")  # noqa: E731
    c.apply(extra="  chatTemplate: {configMap: nowhere}\n")
    assert "ConfigMap nowhere not found" in wait_for(refused, 60, "the refusal")["message"]
    configmap("editable", False)
    c.apply(extra="  chatTemplate: {configMap: editable}\n")
    cond = wait_for(lambda: (r := refused()) and "editable" in r["message"] and r, 60, "the mutable one refused")
    assert "not immutable" in cond["message"] and "set immutable: true" in cond["message"], cond
    # nothing changed: the served revision is the one before
    assert c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"] == rev
    assert "ChatTemplateRefused" in c.k("get", "events", "-o", "json").stdout
    # made right with the spec untouched: the next look (every 15 s) rolls it out
    c.k("delete", "configmap", "editable")
    configmap("editable", True)
    wait_for(lambda: c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"] != rev, 60,
             "the revision once the ConfigMap is immutable")
    rev = c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"]
    configmap("fixed", True)
    c.apply(extra="  chatTemplate: {configMap: fixed}\n")
    wait_for(lambda: c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"] != rev, 60,
             "the new revision")
    wait_for(lambda: c.status().get("phase") == "Ready", 120)
    r = c.k("apply", "-f", "-", check=False, stdin=json.dumps({
        "apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fixed"}, "immutable": True,
        "data": {"template.jinja": "{{ messages }}"}}))
    assert r.returncode and "field is immutable when `immutable` is set" in r.stderr, r.stderr
