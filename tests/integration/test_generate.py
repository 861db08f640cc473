"""llm-generate end to end: greedy output on the real stories260K model must
equal llama.cpp's, id for id (reference in ../shared/testdata); sampling is
reproducible per seed; bad input gives clear errors and exit codes."""
import json
import re

import pytest

from harness import parse_ids, run, shared, tool


def reference_cases():
    ref = shared("testdata/stories260K/greedy-llama.cpp.json")
    return json.loads(ref.read_text())["cases"]


@pytest.mark.parametrize("threads,extra", [(1, []), (2, []), (2, ["--scalar"])])
def test_stories260k_greedy_matches_llamacpp(threads, extra):
    model = shared("models/stories260K.gguf")
    for case in reference_cases():
        n = len(case["generated_ids"])
        r = run(tool("llm-generate"), "-m", model, "-p", case["prompt"], "-n", n, "--temp", "0",
                "--threads", threads, "--ids", *extra)
        assert parse_ids(r.stderr, "prompt ids") == case["prompt_ids_with_bos"]
        assert parse_ids(r.stderr, "generated ids") == case["generated_ids"]
        assert r.stdout.rstrip("\n") == case["generated_text"]
        assert re.search(r"decode: \d+ tokens, [\d.]+ tok/s", r.stderr)


def test_seeded_sampling_is_reproducible(models):
    m = models("tiny", "Q8_0")
    args = [tool("llm-generate"), "-m", m, "-p", "Once upon", "-n", 24, "--temp", "1.0", "--top-k", 40,
            "--top-p", "0.95", "--ids"]
    a = parse_ids(run(*args, "--seed", 1).stderr, "generated ids")
    b = parse_ids(run(*args, "--seed", 1).stderr, "generated ids")
    c = parse_ids(run(*args, "--seed", 2).stderr, "generated ids")
    assert a == b and len(a) == 24
    assert a != c


def test_every_shape_family_generates(models):
    for shape, qtype in [("tiny", "Q4_K"), ("tiny-qwen2", "Q4_0"), ("tiny-llama3", "BF16"), ("tiny", "F16")]:
        r = run(tool("llm-generate"), "-m", models(shape, qtype), "-p", "The robot", "-n", 8, "--temp", "0",
                "--ids")
        assert len(parse_ids(r.stderr, "generated ids")) == 8


@pytest.mark.parametrize("args,needle", [
    (["-n", "abc"], "-n expects an integer"),
    (["--temp", "-1"], "--temp expects a number"),
    (["--threads", "0"], "--threads expects an integer"),
    (["--bogus"], "usage"),
])
def test_bad_arguments(models, args, needle):
    r = run(tool("llm-generate"), "-m", models("tiny"), "-p", "x", *args, check=False)
    assert r.returncode == 2
    assert needle in r.stderr


def test_bad_model_files(tmp_path):
    missing = tmp_path / "nope.gguf"
    r = run(tool("llm-generate"), "-m", missing, "-p", "x", check=False)
    assert r.returncode == 1 and str(missing) in r.stderr and "cannot open" in r.stderr
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"NOTAGGUF" * 10)
    r = run(tool("llm-generate"), "-m", junk, "-p", "x", check=False)
    assert r.returncode == 1 and "not a GGUF file" in r.stderr


def test_truncated_model_is_rejected(models, tmp_path):
    data = models("tiny", "Q8_0").read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    r = run(tool("llm-generate"), "-m", cut, "-p", "x", check=False)
    assert r.returncode == 1
    assert "beyond end of file" in r.stderr
