"""llm-bench's plain form (the line tests/bench/bench.py parses): every field
it prints is there, and the prefill's time split is consistent with itself
- the matmul and attention shares lie in [0, 1] and add to at most 1, and
the matmuls' own GOP/s equals the prefill's GOP/s over the matmul share."""
import math

import pytest

from conftest import run, tool


def fields(out):
    return dict(kv.split("=", 1) for kv in out.split())


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_prefill_split(models, qtype):
    r = fields(run(tool("llm-bench"), "-m", models("tiny", qtype), "-p", 64, "-n", 4, "-r", 2, "-t", 2).stdout)
    for key in ("prefill_tps", "decode_tps", "matmul_gop_per_token", "prefill_matmul_share", "prefill_attn_share",
                "prefill_matmul_gops"):
        assert key in r, f"llm-bench printed no {key}: {r}"
        assert math.isfinite(float(r[key])), r
    mm, attn = float(r["prefill_matmul_share"]), float(r["prefill_attn_share"])
    assert 0 < mm <= 1 and 0 <= attn <= 1 and mm + attn <= 1.001, r
    # prefill_tps is the mean of the runs' rates, the split is over their
    # summed time: equal for equal runs, so a loose bound catches a wrong
    # unit or a share taken over the wrong interval
    expect = float(r["matmul_gop_per_token"]) * float(r["prefill_tps"]) / mm
    assert 0.5 * expect < float(r["prefill_matmul_gops"]) < 2 * expect, r
