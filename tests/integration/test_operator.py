"""End to end on kubesim: the CRD applied, llm-controller running, an
LLMDeployment applied -> the controller creates its Deployment and Service
-> kubesim runs the real llm-server as pods -> they become ready -> the
status shows Ready with the right counts -> a completion through an
endpoint of the Service answers -> `kubectl scale llmd` scales ->
deleting the LLMDeployment removes every child."""
import json
import os
import shutil
import subprocess
import time
import urllib.request

import pytest

from conftest import ROOT, SHARED, tool
from test_kubesim import start, wait_for

CRD = ROOT / "manifests" / "crd" / "llmdeployments.yaml"

LLMD = """apiVersion: llmk8s.io/v1alpha1
kind: LLMDeployment
metadata: {{name: story}}
spec:
  image: llm-server:test
  replicas: {replicas}
  model:
    path: {model}
    name: story
    volume: {{hostPath: {{path: {dir}}}}}
  engine: {{threads: 1, contextLength: 128}}
"""


@pytest.fixture()
def cluster(tmp_path, models):
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    model = SHARED / "models" / "stories260K.gguf"
    model = model if model.exists() else models("tiny", "Q8_0")
    images = tmp_path / "images.yaml"
    images.write_text(f"llm-server:test: {json.dumps([tool('llm-server')])}\n")
    ks, d = start(tmp_path, "--image-map", str(images))
    env = {**os.environ, "KUBECONFIG": str(d / "kubeconfig")}

    def k(*args, check=True, stdin=None):
        r = subprocess.run(["kubectl", *args], env=env, capture_output=True, text=True, input=stdin, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r

    k("apply", "-f", str(CRD))
    k("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    ctl = subprocess.Popen([tool("llm-controller"), "--kubeconfig", str(d / "kubeconfig")],
                           stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        yield k, model, ctl
    finally:
        ctl.terminate()
        rc = ctl.wait(timeout=30)
        ks.terminate()
        ks.wait(timeout=30)
        assert rc == 0, ctl.stderr.read()


def status(k):
    return json.loads(k("get", "llmd", "story", "-o", "json").stdout).get("status") or {}


def ready_ips(k):
    r = k("get", "endpoints", "story", "-o", "json", check=False)
    subsets = json.loads(r.stdout).get("subsets") or [] if not r.returncode else []
    return sorted(a["ip"] for s in subsets for a in s.get("addresses", []))


def test_apply_serve_scale_delete(cluster):
    k, model, ctl = cluster
    k("apply", "-f", "-", stdin=LLMD.format(replicas=1, model=model, dir=model.parent))
    st = wait_for(lambda: (s := status(k)).get("phase") == "Ready" and s, 90)
    assert st["readyReplicas"] == 1 and st["replicas"] == 1
    assert st["conditions"][0]["type"] == "Ready" and st["conditions"][0]["status"] == "True"
    assert st["endpoint"] == "http://story.default.svc:8080" and st["observedGeneration"] >= 1
    dep = json.loads(k("get", "deployment", "story", "-o", "json").stdout)
    assert dep["metadata"]["ownerReferences"][0]["kind"] == "LLMDeployment"
    c = dep["spec"]["template"]["spec"]["containers"][0]
    assert c["startupProbe"]["httpGet"]["path"] == "/startupz" and c["securityContext"]["readOnlyRootFilesystem"]
    pdb = json.loads(k("get", "pdb", "story", "-o", "json").stdout)
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["metadata"]["ownerReferences"][0]["name"] == "story"
    ip = wait_for(lambda: ready_ips(k), 30)[0]
    body = json.dumps({"model": "story", "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}).encode()
    req = urllib.request.Request(f"http://{ip}:8080/v1/completions", body, {"Content-Type": "application/json"})
    out = json.loads(urllib.request.urlopen(req, timeout=30).read())
    assert out["usage"]["completion_tokens"] == 8
    rv = dep["metadata"]["resourceVersion"]
    time.sleep(1)  # level-based: nothing changed, nothing written
    assert json.loads(k("get", "deployment", "story", "-o", "json").stdout)["metadata"]["resourceVersion"] == rv
    assert "scaled" in k("scale", "llmd/story", "--replicas=2").stdout
    wait_for(lambda: status(k).get("readyReplicas") == 2 and status(k).get("phase") == "Ready", 90)
    assert len(wait_for(lambda: len(ready_ips(k)) == 2 and ready_ips(k), 30)) == 2
    assert "STORY" not in k("get", "llmd").stdout and "Ready" in k("get", "llmd").stdout
    k("delete", "llmd", "story")
    wait_for(lambda: k("get", "deployment", "story", check=False).returncode and
             k("get", "service", "story", check=False).returncode and
             k("get", "pdb", "story", check=False).returncode, 30)


def test_missing_model_is_degraded_with_reason(cluster, tmp_path):
    """A model path that does not exist: the status says Degraded, reason
    ModelNotFound, naming the path, in `kubectl describe` too."""
    k, model, ctl = cluster
    missing = tmp_path / "nope" / "missing.gguf"
    k("apply", "-f", "-", stdin=LLMD.format(replicas=1, model=missing, dir=missing.parent))
    st = wait_for(lambda: (s := status(k)).get("phase") == "Degraded" and s, 60)
    cond = st["conditions"][0]
    assert cond["status"] == "False" and cond["reason"] == "ModelNotFound" and str(missing) in cond["message"]
    assert "ModelNotFound" in k("describe", "llmd", "story").stdout
