"""Every block type the engine loads, decoded by the engine and by llama.cpp's
own reference decoders (the `gguf` package, llama.cpp's gguf-py on PyPI), on
random blocks with random finite scales: the floats must be identical."""
import subprocess

import numpy as np
import pytest


gguf = pytest.importorskip("gguf", reason="the gguf package (llama.cpp's gguf-py) is not installed")
from gguf import quants, GGMLQuantizationType as T, GGML_QUANT_SIZES  # noqa: E402

from harness import BUILD


TOOL = BUILD / "tests" / "dequant_rows"

# byte offsets of each type's half-precision scales within a block
SCALES = {"Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0], "Q2_K": [80, 82],
          "Q3_K": [108], "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208]}


@pytest.mark.parametrize("name", sorted(SCALES))
def test_dequant_equals_llamacpp(name):
    assert TOOL.exists(), f"{TOOL} is missing: run make first"
    rng = np.random.default_rng(sum(map(ord, name)))
    t = T[name]
    elems, nbytes = GGML_QUANT_SIZES[t]
    nb = 257
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    for b in range(nb):
        for off in SCALES[name]:
            raw[b, off:off + 2] = np.frombuffer(np.float16(rng.uniform(-0.05, 0.05)).tobytes(), np.uint8)
    want = quants.dequantize(raw.reshape(-1), t).astype(np.float32).reshape(-1)
    out = subprocess.run([str(TOOL), str(int(t)), str(nb * elems)], input=raw.tobytes(), capture_output=True, check=True)
    got = np.frombuffer(out.stdout, np.float32)
    assert got.shape == want.shape
    bad = np.flatnonzero(got != want)
    assert bad.size == 0, f"{name}: {bad.size} of {got.size} differ, first at {bad[0]}: {got[bad[0]]} vs {want[bad[0]]}"
