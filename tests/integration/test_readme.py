"""The README's try-it-here path on kubesim, run as the README writes it:
the block from `make kubesim` to `make kubesim-stop`, in a shell at the
repository's root, must end with a completion from the sample's pod. A
README that drifts from what works fails here."""
import os
import re
import shutil
import subprocess

import pytest

from harness import BUILD, ROOT


def readme_block():
    text = (ROOT / "README.md").read_text()
    m = re.search(r"^make kubesim .*?^make kubesim-stop$", text, re.M | re.S)
    assert m, "README.md has no block from `make kubesim` to `make kubesim-stop`"
    return m.group(0)


def test_kubesim_quick_start_runs_as_written():
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    if BUILD.name != "build":
        pytest.skip("the README's commands name build/; this run builds into " + BUILD.name)
    env = {k: v for k, v in os.environ.items() if k != "KUBECONFIG"}
    try:
        r = subprocess.run(["bash", "-e", "-c", readme_block()], cwd=ROOT, env=env, capture_output=True, text=True,
                           timeout=600)
    finally:
        subprocess.run(["make", "--no-print-directory", "kubesim-stop"], cwd=ROOT, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert '"completion_tokens":12' in r.stdout, r.stdout[-3000:]
    assert "condition met" in r.stdout
