"""The LLMDeployment CRD (manifests/crd) on kubesim through kubectl: it is
established, the samples are accepted with defaults filled in, bad specs
are rejected with field paths, printer columns and the scale subresource
work, and `kubectl explain` describes the fields."""
import json

import pytest

from harness import ROOT


CRD = ROOT / "manifests" / "crd" / "llmdeployments.yaml"
SAMPLES = ROOT / "manifests" / "samples"


@pytest.fixture()
def k(kubectl):  # noqa: F811
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    return kubectl


def test_samples_accepted_with_defaults(k):
    for f in sorted(SAMPLES.glob("*.yaml")):
        k("apply", "--validate=false", "-f", str(f))
    cpu = json.loads(k("get", "llmd", "tinyllama", "-o", "json").stdout)["spec"]
    assert cpu["engine"]["kvCacheType"] == "f16" and cpu["engine"]["maxBatchTokens"] == 512
    assert cpu["engine"]["prefixCache"] is True
    assert cpu["engine"]["maxSeqs"] == 32 and cpu["engine"]["contextLength"] == 2048
    assert cpu["server"] == {"port": 8080} and cpu["probes"]["startupTimeoutSeconds"] == 600
    assert cpu["model"]["volume"]["mountPath"] == "/models" and cpu["image"] == "llm-server:0.1.0"
    gpu = json.loads(k("get", "llmd", "llama-8b", "-o", "json").stdout)["spec"]
    assert gpu["engine"]["tensorParallelSize"] == 2 and gpu["rollout"]["maxSurge"] == 0
    assert gpu["resources"]["limits"]["nvidia.com/gpu"] == 2  # preserved as given
    table = k("get", "llmd").stdout.splitlines()
    assert table[0].split() == ["NAME", "MODEL", "READY", "PODS", "DESIRED", "CANARY", "PHASE", "AGE"]
    rows = {r.split()[0]: r.split()[1] for r in table[1:]}
    assert rows == {"gemma": "gemma", "gemma-hf": "gemma-3-270m-it", "llama-8b": "llama-3.1-8b",
                    "tinyllama": "tinyllama"}, rows
    gemma = json.loads(k("get", "llmd", "gemma", "-o", "json").stdout)["spec"]
    assert gemma["model"]["volume"] == {"mountPath": "/models", "pvc": {"claimName": "models"}}
    assert "scaled" in k("scale", "llmd/tinyllama", "--replicas=3").stdout
    assert k("get", "llmd", "tinyllama", "-o", "jsonpath={.spec.replicas}").stdout == "3"


BASE = "apiVersion: llmk8s.io/v1alpha1\nkind: LLMDeployment\nmetadata: {{name: bad}}\nspec:\n{}"


@pytest.mark.parametrize("spec,needle", [
    ("  model: {path: models/x.gguf}\n", "spec.model.path: Invalid value"),
    ("  model: {path: /m/x.gguf}\n  engine: {kvCacheType: fp8}\n", 'spec.engine.kvCacheType: Unsupported value: "fp8"'),
    ("  model: {path: /m/x.gguf}\n  replicas: -1\n", "spec.replicas: Invalid value: -1"),
    ("  model: {path: /m/x.gguf, sha256: abc}\n", "spec.model.sha256: Invalid value"),
    ("  replicas: 1\n", "spec.model: Required value"),
    ("  model: {path: /m/x.gguf}\n  engine: {tensorParallelSize: 9}\n", "spec.engine.tensorParallelSize: Invalid value: 9"),
    ("  model: {path: /m/x.gguf}\n  server: {port: 70000}\n", "spec.server.port: Invalid value: 70000"),
    ("  model: {path: /m/x.gguf}\n  engine: {prefixCache: maybe}\n", "spec.engine.prefixCache: Invalid value"),
    # CEL rules (x-kubernetes-validations; kubesim evaluates them with cel-python)
    ("  model: {path: /m/x.gguf, volume: {pvc: {claimName: a}, hostPath: {path: /m}}}\n",
     "spec.model.volume: Invalid value: \"object\": exactly one of pvc, hostPath and image"),
    ("  model: {path: /m/x.gguf}\n  autoscaling: {enabled: true, minReplicas: 5, maxReplicas: 2}\n",
     "spec.autoscaling: Invalid value: \"object\": minReplicas must not exceed maxReplicas"),
    ("  model: {path: /m/x.gguf}\n  autoscaling: {enabled: true, minReplicas: 0}\n",
     "autoscaling.minReplicas 0 needs mode builtin and spec.router"),
    ("  model: {path: /m/x.gguf}\n  autoscaling: {enabled: true, minReplicas: 0}\n  router: {enabled: true}\n",
     "autoscaling.minReplicas 0 needs mode builtin and spec.router"),
    ("  model: {path: /m/x.gguf}\n  adapters: [{name: a, path: /m/a.gguf, uri: 'hf://o/r/a.gguf'}]\n",
     "exactly one of path (a file in the container) and uri"),
    ("  model: {path: /m/x.gguf}\n  adapters: [{name: a, uri: 'hf://o/r/a.gguf'}]\n", "it needs spec.model.uri"),
    ("  model: {path: /m/x.gguf}\n  adapters: [{name: 'a b', path: /m/a.gguf}]\n", "spec.adapters[0].name: Invalid value"),
    ("  model: {path: /m/x.gguf}\n  adapters: [{name: a, path: /m/a.gguf, scale: 5000}]\n",
     "spec.adapters[0].scale: Invalid value"),
    ("  model: {path: /m/x.gguf}\n  adapters: [{name: a, path: /m/a.gguf}, {name: a, path: /m/b.gguf}]\n",
     "each adapter needs a name of its own"),
])
def test_bad_specs_rejected(k, spec, needle):
    r = k("apply", "--validate=false", "-f", "-", check=False, stdin=BASE.format(spec))
    assert r.returncode and needle in r.stderr, r.stderr
    assert "bad" not in k("get", "llmd", "-o", "name").stdout


def test_explain(k):
    out = k("explain", "llmdeployment.spec.model.path", check=False)
    if out.returncode:
        pytest.skip(f"kubectl explain against kubesim: {out.stderr.strip()[:200]}")
    assert "Absolute path of the GGUF file" in out.stdout


def test_cel_rules_accept_what_the_controller_runs(k):
    """The rules refuse only what the controller would refuse: scale to zero
    behind a holding router, one volume, min == max, and names up to 47."""
    pytest.importorskip("celpy")
    ok = ("  model: {path: /m/x.gguf, volume: {image: {reference: r}}}\n"
          "  autoscaling: {enabled: true, minReplicas: 0, maxReplicas: 0}\n  router: {enabled: true, holdSeconds: 5}\n")
    r = k("apply", "--validate=false", "-f", "-", check=False, stdin=BASE.format(ok))
    assert r.returncode and "minReplicas must not exceed" not in r.stderr  # max 0 is below the schema's minimum 1
    ok = ok.replace("maxReplicas: 0", "maxReplicas: 1")
    k("apply", "--validate=false", "-f", "-", stdin=BASE.format(ok))
    for name, good in (("a" * 47, True), ("a" * 48, False), ("x1-b", True), ("1abc", False), ("ab-", False),
                       ("chat-backends", False), ("chat-router", False), ("chat-gateway", False), ("backends-chat", True)):
        doc = BASE.replace("{{name: bad}}", f"{{{{name: {name}}}}}").format("  model: {path: /m/x.gguf}\n")
        r = k("apply", "--validate=false", "-f", "-", check=False, stdin=doc)
        assert (r.returncode == 0) == good, (name, r.stderr)
        if not good:  # a name ending as another deployment's child does (its router's and gateways' Service) is refused
            assert any(w in r.stderr for w in ("at most 47 characters", "DNS-1035 label", "must not end in")), r.stderr


def test_crd_upgrade_path(kubectl, tmp_path):  # noqa: F811
    """Helm installs crds/ once and never upgrades them; the README's path is
    `kubectl apply --server-side --force-conflicts -f` the new CRD. From an
    older CRD (made here by taking this one's newer parts out) with objects
    in it: the new one takes over (its columns, fields and rules), the
    objects stay as they were, and the new fields are kept, not pruned."""
    import yaml
    crd = yaml.safe_load(CRD.read_text())
    old = json.loads(json.dumps(crd))
    ver = old["spec"]["versions"][0]
    schema = ver["schema"]["openAPIV3Schema"]
    schema.pop("x-kubernetes-validations", None)
    del schema["properties"]["spec"]["properties"]["router"]["properties"]["resources"]
    ver["additionalPrinterColumns"] = [c for c in ver["additionalPrinterColumns"] if c["name"] != "Pods"]
    path = tmp_path / "old-crd.yaml"
    path.write_text(yaml.safe_dump(old))
    kubectl("create", "-f", str(path))  # as helm install creates it
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    kubectl("apply", "--validate=false", "-f", "-", stdin=BASE.replace("bad", "before").format(  # (Strict refuses it)
        "  model: {path: /m/x.gguf}\n  router: {enabled: true, resources: {limits: {memory: 1Gi}}}\n"))
    assert "resources" not in json.loads(kubectl("get", "llmd", "before", "-o", "json").stdout)["spec"]["router"]  # pruned
    kubectl("apply", "--server-side", "--force-conflicts", "-f", str(CRD))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    assert "PODS" in kubectl("get", "llmd").stdout.splitlines()[0].split()
    before = json.loads(kubectl("get", "llmd", "before", "-o", "json").stdout)
    assert before["spec"]["model"]["path"] == "/m/x.gguf" and before["spec"]["router"]["enabled"] is True
    kubectl("apply", "-f", "-", stdin=BASE.replace("bad", "after").format(
        "  model: {path: /m/x.gguf}\n  router: {enabled: true, resources: {limits: {memory: 1Gi}}}\n"))
    after = json.loads(kubectl("get", "llmd", "after", "-o", "json").stdout)
    assert after["spec"]["router"]["resources"] == {"limits": {"memory": "1Gi"}}
    r = kubectl("apply", "-f", "-", check=False, stdin=BASE.replace("bad", "x" * 48).format("  model: {path: /m/x.gguf}\n"))
    assert r.returncode and "at most 47 characters" in r.stderr  # the new rules hold
