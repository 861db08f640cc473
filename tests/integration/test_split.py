"""Split GGUFs (llama.cpp's gguf-split format: PREFIX-00001-of-00003.gguf
...): a set written by a splitter we did not write runs like the single
file it came from: the same greedy ids and the same saved log-probs, byte
for byte (the weights are the same bytes, only in three mappings). The
splitters: llama.cpp's own gguf-py (PyPI `gguf`, GGUFWriter with
split_max_size, as convert_hf_to_gguf.py --split-max-size writes sets) in
every run, and llama.cpp's `llama-gguf-split` when LLAMA_CPP_DIR names a
build. A set missing a part or mixed with another split is refused with
the reason."""
import os
import pathlib
import shutil
import subprocess

import pytest

from harness import run, tool

TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")
PROMPT = "The capital of France is"


def gguf_py_split(src, out_prefix, max_bytes):
    """Rewrites src as a split set with gguf-py's writer (what
    gguf_new_metadata.py does, with split_max_size); returns the parts."""
    gguf = pytest.importorskip("gguf")
    from gguf.scripts.gguf_new_metadata import copy_with_new_metadata
    reader = gguf.GGUFReader(str(src), "r")
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out_prefix) + ".gguf", arch, split_max_size=max_bytes)
    copy_with_new_metadata(reader, writer, {}, [])
    return sorted(out_prefix.parent.glob(out_prefix.name + "-*-of-*.gguf"))


def greedy(model):
    return run(tool("llm-generate"), "-m", model, "-p", PROMPT, "-n", 16, "--ids").stdout


def saved_logprobs(model, path):
    run(tool("llm-perplexity"), "-m", model, "-f", TEXT, "--ctx", 128, "--chunks", 2, "--save-logits", path)
    return path.read_bytes()


def same_as_single(single, parts, tmp_path):
    assert len(parts) >= 3, parts
    want_ids = greedy(single)
    want_lp = saved_logprobs(single, tmp_path / "single.lp")
    # any part names the set
    for p in (parts[0], parts[-1]):
        assert greedy(p) == want_ids
    assert saved_logprobs(parts[1], tmp_path / "split.lp") == want_lp


@pytest.fixture(scope="module")
def gemma_split(gemma, tmp_path_factory):
    d = tmp_path_factory.mktemp("split")
    return gguf_py_split(gemma, d / "gemma", 100 * 1000 * 1000)


def test_gguf_py_split_runs_like_the_single_file(gemma, gemma_split, tmp_path):
    if not TEXT.exists():
        pytest.skip(f"{TEXT} missing (Debian's base-files)")
    same_as_single(gemma, gemma_split, tmp_path)


def test_llama_gguf_split_runs_like_the_single_file(gemma, tmp_path):
    root = os.environ.get("LLAMA_CPP_DIR")
    if not root:
        pytest.skip("LLAMA_CPP_DIR not set: no llama.cpp build with llama-gguf-split")
    splitter = pathlib.Path(root) / "build" / "bin" / "llama-gguf-split"
    if not splitter.exists():
        pytest.skip(f"{splitter} missing: cmake --build build --target llama-gguf-split")
    if not TEXT.exists():
        pytest.skip(f"{TEXT} missing (Debian's base-files)")
    subprocess.run([str(splitter), "--split", "--split-max-size", "100M", str(gemma), str(tmp_path / "gemma")],
                   check=True, capture_output=True)
    same_as_single(gemma, sorted(tmp_path.glob("gemma-*-of-*.gguf")), tmp_path)


def load_error(model):
    p = subprocess.run([str(tool("llm-generate")), "-m", str(model), "-p", "x", "-n", "1"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode != 0, p.stdout
    return p.stderr


def test_incomplete_or_mixed_sets_are_refused(models, tmp_path):
    """Two splits of two different models with the same shape: each part
    of one is a valid GGUF, but a set mixing them is refused, as is a set
    with a part missing. (Mixed sets of the same tensor layout carry
    nothing that tells them apart; a sha256 per part does.)"""
    a = gguf_py_split(models("tiny", "F32"), tmp_path / "a", 2_000_000)
    b = gguf_py_split(models("tiny", "Q8_0"), tmp_path / "b", 400_000)
    assert len(a) >= 3 and len(b) != len(a), (len(a), len(b))
    shutil.copy(a[0], tmp_path / "keep")
    a[1].unlink()
    err = load_error(a[0])
    assert f"the split set of {a[0]} is incomplete: part 2 of {len(a)}" in err, err
    # b's part 2 in a's place: another part count and tensor total
    shutil.copy(b[1], a[1])
    err = load_error(a[0])
    assert "parts of different splits" in err, err
    shutil.copy(tmp_path / "keep", a[0])
    renamed = tmp_path / "renamed.gguf"
    shutil.copy(b[0], renamed)
    err = load_error(renamed)
    assert "whose name does not end in -00001-of-" in err, err


def test_server_checks_one_digest_per_part(models, tmp_path):
    """llm-server's model_sha256 for a split set: one digest per part,
    comma-separated in part order; a part that differs is named."""
    import hashlib
    import json
    from harness import Server, wait_for
    parts = gguf_py_split(models("tiny", "F32"), tmp_path / "t", 2_000_000)
    sums = [hashlib.sha256(p.read_bytes()).hexdigest() for p in parts]
    s = Server(parts[0], "--model_sha256", ",".join(sums))
    assert s.get("/readyz")[0] == 200
    s.stop()
    # too few digests: refused at start, before the port is up
    s = Server(parts[0], "--model_sha256", ",".join(sums[:2]), wait=False)
    assert s.proc.wait(timeout=60) == 2
    err = s.proc.stderr.read()
    assert f"2 sha256 digests for {len(parts)} files" in err, err
    s.stop()
    bad = sums[:]
    bad[2] = "ab" * 32
    for digests, what in ((",".join(bad), f"{parts[2]}: sha256 mismatch"),):
        s = Server(parts[0], "--model_sha256", digests, wait=False)

        def failed():
            try:
                return json.loads(s.get("/startupz")[1])["phase"] == "failed"
            except OSError:
                return False
        wait_for(failed, 60, "the failed load")
        detail = json.loads(s.get("/startupz")[1])["detail"]
        assert what in detail, detail
        s.stop()
