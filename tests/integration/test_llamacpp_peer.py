"""Side by side with llama.cpp (when LLAMA_CPP_DIR names a llama.cpp checkout
built with CMake in LLAMA_CPP_DIR/build): greedy ids for many prompts on the
real stories260K model, and on llm-mkmodel files of each architecture, must
be identical. Skipped, with the reason, when no peer is available."""
import os
import pathlib
import subprocess

import pytest

from conftest import ROOT, run, shared, tool
from test_generate import parse_ids

PROMPTS = ["Once upon a time", "The cat sat on the mat", "Lily and Ben went to the park. They saw",
           "One day, a big dog", "Tom had a red ball.", "Hello", "The sun was shining and the birds",
           "She was very happy because", "\"Can I play?\" asked the little boy.", "In a small house"]


@pytest.fixture(scope="module")
def peer(tmp_path_factory):
    root = os.environ.get("LLAMA_CPP_DIR")
    if not root:
        pytest.skip("LLAMA_CPP_DIR not set: no llama.cpp build to compare with")
    root = pathlib.Path(root)
    lib = root / "build" / "bin"
    if not (lib / "libllama.so").exists():
        pytest.skip(f"{lib}/libllama.so missing: build llama.cpp with CMake first")
    exe = tmp_path_factory.mktemp("peer") / "llama_greedy"
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "tests/peer/llama_greedy.cpp"),
                    f"-I{root}/include", f"-I{root}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base",
                    f"-Wl,-rpath,{lib}", "-o", str(exe)], check=True)
    return exe


def both(peer, model, prompt, n):
    ours = run(tool("llm-generate"), "-m", model, "-p", prompt, "-n", n, "--temp", "0", "--ids").stderr
    theirs = run(peer, model, prompt, n).stderr
    return ((parse_ids(ours, "prompt ids"), parse_ids(ours, "generated ids")),
            (parse_ids(theirs, "prompt ids"), parse_ids(theirs, "generated ids")))


def test_stories260k_many_prompts(peer):
    model = shared("models/stories260K.gguf")
    for p in PROMPTS:
        ours, theirs = both(peer, model, p, 100)
        assert ours == theirs, p


@pytest.mark.parametrize("shape", ["tiny", "tiny-qwen2", "tiny-llama3"])
def test_mkmodel_files(peer, models, shape):
    model = models(shape, "F32")
    for p in PROMPTS[:4]:
        ours, theirs = both(peer, model, p, 24)
        assert ours == theirs, (shape, p)
