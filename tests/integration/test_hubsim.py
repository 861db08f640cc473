"""tests/hubsim (the Hugging Face hub stand-in the model-source tests will
use) held to the official `huggingface_hub` client: it downloads through the
stand-in into the hub's cache layout, lists files, meets the hub's errors
(gated, missing repository, missing file) as its own exception types, does
not carry the token to the CDN host, and survives a dropped transfer; curl
checks the CDN's Range answers."""
import hashlib
import os
import shutil
import subprocess
import sys

import pytest

from harness import ROOT

sys.path.insert(0, str(ROOT / "tests" / "hubsim"))
from hubsim import Hub  # noqa: E402

hf = pytest.importorskip("huggingface_hub")
from huggingface_hub.errors import EntryNotFoundError, GatedRepoError, RepositoryNotFoundError  # noqa: E402


@pytest.fixture()
def hub(tmp_path):
    root = tmp_path / "root"
    (root / "org" / "repo").mkdir(parents=True)
    (root / "org" / "gated").mkdir(parents=True)
    (root / "org" / "repo" / "model-Q4_K_M.gguf").write_bytes(os.urandom(300_000))
    (root / "org" / "repo" / "README.md").write_text("hello\n")
    (root / "org" / "gated" / "m.gguf").write_bytes(os.urandom(5000))
    (root / "org" / "gated" / ".token").write_text("sekrit\n")
    h = Hub(str(root))
    yield h, root
    h.close()


def test_official_client_downloads_into_the_hub_cache_layout(hub, tmp_path):
    h, root = hub
    cache = tmp_path / "cache"
    got = hf.hf_hub_download("org/repo", "model-Q4_K_M.gguf", cache_dir=cache, endpoint=h.url)
    want = (root / "org" / "repo" / "model-Q4_K_M.gguf").read_bytes()
    assert open(got, "rb").read() == want
    base = cache / "models--org--repo"
    commit = (base / "refs" / "main").read_text()
    assert got == str(base / "snapshots" / commit / "model-Q4_K_M.gguf")
    assert (base / "blobs" / hashlib.sha256(want).hexdigest()).exists()  # large files: named by their sha256
    assert sorted(hf.HfApi(endpoint=h.url).list_repo_files("org/repo")) == ["README.md", "model-Q4_K_M.gguf"]
    small = hf.hf_hub_download("org/repo", "README.md", cache_dir=cache, endpoint=h.url)
    assert open(small).read() == "hello\n"


def test_hub_errors_and_tokens(hub, tmp_path):
    h, _ = hub
    cache = tmp_path / "cache"
    for args, err in ((("org/gated", "m.gguf"), GatedRepoError), (("org/repo", "nope.gguf"), EntryNotFoundError),
                      (("org/none", "x.gguf"), RepositoryNotFoundError)):
        with pytest.raises(err):
            hf.hf_hub_download(*args, cache_dir=cache, endpoint=h.url)
    with pytest.raises(GatedRepoError):
        hf.hf_hub_download("org/gated", "m.gguf", cache_dir=cache, endpoint=h.url, token="wrong")
    assert hf.hf_hub_download("org/gated", "m.gguf", cache_dir=cache, endpoint=h.url, token="sekrit")
    api = [hd for host, _, _, hd in h.log if host == "api" and hd.get("authorization") == "Bearer sekrit"]
    cdn = [hd for host, _, _, hd in h.log if host == "cdn"]
    assert api and cdn and not any("authorization" in hd for hd in cdn)  # the token stays on the hub's host


def test_a_dropped_transfer_is_retried_and_ranges_are_served(hub, tmp_path):
    h, root = hub
    h.faults = {"drop_at": 100_000}
    got = hf.hf_hub_download("org/repo", "model-Q4_K_M.gguf", cache_dir=tmp_path / "c", endpoint=h.url)
    want = (root / "org" / "repo" / "model-Q4_K_M.gguf").read_bytes()
    assert open(got, "rb").read() == want
    assert len([1 for host, m, _, _ in h.log if host == "cdn" and m == "GET"]) == 2
    if not shutil.which("curl"):
        pytest.skip("curl not installed")
    blob = f"{h.cdn_url}/blobs/{hashlib.sha256(want).hexdigest()}"
    part = subprocess.run(["curl", "-sf", "-r", "1000-1999", blob], capture_output=True, timeout=30).stdout
    assert part == want[1000:2000]
    tail = subprocess.run(["curl", "-sf", "-r", "299990-", blob], capture_output=True, timeout=30).stdout
    assert tail == want[299990:]


def test_the_official_client_resumes_with_range(hub, tmp_path):
    """A cut after the client's first 10 MB chunk: it resumes with a Range
    request, which the CDN answers with 206 and the rest; the file is whole."""
    h, root = hub
    want = os.urandom(12 << 20)
    (root / "org" / "repo" / "big.gguf").write_bytes(want)
    h.faults = {"drop_at": 11 << 20}
    got = hf.hf_hub_download("org/repo", "big.gguf", cache_dir=tmp_path / "c", endpoint=h.url)
    assert hashlib.sha256(open(got, "rb").read()).digest() == hashlib.sha256(want).digest()
    ranges = [hd.get("range") for host, m, _, hd in h.log if host == "cdn" and m == "GET"]
    assert ranges[0] is None and ranges[1] and ranges[1].startswith("bytes=") and ranges[1] != "bytes=0-", ranges
