"""llm-perplexity: the number itself recomputed here from the engine's logits
(chunking, BOS, which positions are scored), llama.cpp's llama-perplexity
value on Gemma 3 270M (same file, text and context), and --kl-divergence
(a model against itself is ~0 with full top-1 agreement; a quantized file
against its F32 base is small but not zero; a base of other text is
refused). The text: the GPL-3 from Debian's base-files."""
import math
import pathlib
import re
import subprocess

import numpy as np
import pytest

from harness import BUILD, kl_summary, run, tool


TEXT = pathlib.Path("/usr/share/common-licenses/GPL-3")
# llama-perplexity (llama-cpp-python 0.3.36's vendored llama.cpp) on Gemma 3
# 270M Q4_K_M, -c 512 --chunks 4 -t 2, this text: measured 2026-12-02
LLAMACPP_GEMMA_PPL = 15.1743


@pytest.fixture(scope="module")
def text():
    if not TEXT.exists():
        pytest.skip(f"{TEXT} missing (Debian's base-files)")
    return TEXT


def ppl(out):
    m = re.search(r"PPL = ([\d.]+)", out)
    assert m, out
    return float(m.group(1))


def test_ppl_is_exp_mean_nll_of_the_scored_positions(models, text):
    model = models("tiny-gemma3", "F32")
    out = run(tool("llm-perplexity"), "-m", model, "-f", text, "--ctx", 64, "--chunks", 3).stdout
    ids = [int(x) for x in run(tool("llm-tokenize"), "-m", model, "--file", text).stdout.split()]
    nll = []
    for c in range(3):
        chunk = ids[64 * c:64 * (c + 1)]
        chunk[0] = ids[0]  # every chunk starts with BOS
        r = subprocess.run([str(BUILD / "tests" / "logits_rows"), str(model), *map(str, chunk)], capture_output=True,
                           check=True)
        lg = np.frombuffer(r.stdout, np.float32).reshape(64, -1).astype(np.float64)
        for j in range(32, 63):
            row = lg[j] - lg[j].max()
            nll.append(math.log(np.exp(row).sum()) - row[chunk[j + 1]])
    assert len(nll) == 93 and "93 scored tokens" in out
    assert ppl(out) == pytest.approx(math.exp(sum(nll) / len(nll)), rel=1e-4)


def test_kl_divergence(models, text, tmp_path):
    base, quant = models("tiny", "F32"), models("tiny", "Q4_K")
    saved = tmp_path / "base.kl"
    run(tool("llm-perplexity"), "-m", base, "-f", text, "--ctx", 64, "--chunks", 4, "--save-logits", saved)
    same = run(tool("llm-perplexity"), "-m", base, "-f", text, "--ctx", 64, "--chunks", 4, "--kl-divergence",
               saved).stdout
    # only the F16 rounding of the saved log-probs: tiny KL, and the top-1
    # differs only where this random model's top logits are within F16's step
    self_kl, _, agree, samples = kl_summary(same)
    assert self_kl < 1e-4 and agree >= 95.0 and samples == 124, same
    other = run(tool("llm-perplexity"), "-m", quant, "-f", text, "--ctx", 64, "--chunks", 4, "--kl-divergence",
                saved).stdout
    mean, p99, _, _ = kl_summary(other)
    assert 10 * self_kl < mean < 0.2 and p99 >= mean, other
    short = tmp_path / "other.txt"
    short.write_text(text.read_text()[1000:])
    bad = run(tool("llm-perplexity"), "-m", quant, "-f", short, "--ctx", 64, "--chunks", 2, "--kl-divergence", saved,
              check=False)
    assert bad.returncode == 1 and "other tokens" in bad.stderr


def test_gemma_ppl_within_1_percent_of_llamacpp(gemma, text):
    out = run(tool("llm-perplexity"), "-m", gemma, "-f", text, "--ctx", 512, "--chunks", 4, "-t", 2).stdout
    assert ppl(out) == pytest.approx(LLAMACPP_GEMMA_PPL, rel=0.01), out
