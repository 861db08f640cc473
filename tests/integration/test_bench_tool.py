"""llm-bench's plain form (the line tests/bench/bench.py parses): the
operations it counts equal those the file's matrices take (read here with
the gguf package: a decode step runs every matrix, a prompt the output
matrix once per 512-token chunk), and the prefill's time split is
consistent - the matmul and attention shares lie in (0, 1] and add to at
most 1, and with one timed run the matmuls' own GOP/s is exactly the
prefill's GOP/s over the matmul share."""
import math

import gguf
import pytest

from harness import run, tool


KEYS = ("model", "threads", "kernels", "weight_bytes", "decode_bytes", "prefill_tps", "prefill_sd", "decode_tps",
        "decode_sd", "matmul_gop_per_token", "prefill_gop_per_token", "prefill_matmul_share", "prefill_attn_share",
        "prefill_matmul_gops")
LAYER = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")


def bench(path, *args):
    out = run(tool("llm-bench"), "-m", path, *args, "-t", 2).stdout
    r = dict(kv.split("=", 1) for kv in out.split())
    assert set(r) == set(KEYS), sorted(r)
    for k in KEYS[3:]:
        assert math.isfinite(float(r[k])), r
    return {k: v if k in KEYS[:3] else float(v) for k, v in r.items()}


def gop_per_token(path, n_prompt=None):
    """Multiply-adds x 2 of a decode step (n_prompt None) or of a prompt
    token, from the file's tensor shapes."""
    layers = 0
    names = {}
    for t in gguf.GGUFReader(str(path)).tensors:
        names[t.name] = int(t.shape[0]) * int(t.shape[1]) if len(t.shape) == 2 else 0
    for name, macs in names.items():
        if name.startswith("blk.") and name.split(".")[2] in LAYER:
            layers += macs
    output = names.get("output.weight", names["token_embd.weight"])  # tied: the embedding is the output
    chunks = 1 if n_prompt is None else (n_prompt + 511) // 512
    return 2 * (layers + output * (chunks / n_prompt if n_prompt else 1)) / 1e9


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_prefill_split(models, qtype):
    path = models("tiny", qtype)
    r = bench(path, "-p", 64, "-n", 2, "-r", 1)
    assert r["matmul_gop_per_token"] == pytest.approx(gop_per_token(path), rel=1e-4)
    assert r["prefill_gop_per_token"] == pytest.approx(gop_per_token(path, 64), rel=1e-4)
    mm, attn = r["prefill_matmul_share"], r["prefill_attn_share"]
    assert 0 < mm <= 1 and 0 < attn <= 1 and mm + attn <= 1.002, r
    # one timed run: prefill_tps is that run's rate, so the identity is exact
    # but for the printed digits (a share of 0.5 is known to 0.1%)
    expect = r["prefill_gop_per_token"] * r["prefill_tps"] / mm
    assert r["prefill_matmul_gops"] == pytest.approx(expect, rel=0.01), r


def test_split_leaves_decode_out(models):
    """A short prompt and a long decode: were the decode steps counted in
    the prefill's clocks, the matmul share would pass 1."""
    r = bench(models("tiny", "Q8_0"), "-p", 8, "-n", 200, "-r", 1)
    assert 0 < r["prefill_matmul_share"] <= 1 and r["prefill_matmul_share"] + r["prefill_attn_share"] <= 1.002, r
