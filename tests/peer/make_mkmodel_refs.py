"""Writes tests/data/mkmodel-llama.cpp.json: llama.cpp's logits (the peer,
built from LLAMA_CPP_DIR, e.g. llama-cpp-python 0.3.36's vendor/llama.cpp)
on llm-mkmodel's tiny gemma3, qwen3 and qwen3moe files in every tensor type, for 23
token ids in one batch: the 8 largest logits at some positions (the window
of tiny-gemma3 is 8, so later positions are past it). The files' sha256
is kept so a change of llm-mkmodel shows as such.
tests/integration/test_mkmodel_oracle.py holds the engine against it.

    LLAMA_CPP_DIR=... python3 tests/peer/make_mkmodel_refs.py"""
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/mkmodel-llama.cpp.json"
SHAPES = ["tiny-gemma3", "tiny-qwen3", "tiny-qwen3moe"]
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]
IDS = [510, 297, 99, 101, 32, 117, 112, 273, 259, 256, 105, 274, 300, 12, 45, 99, 400, 250, 7, 18, 260, 301, 402]
POSITIONS = [0, 3, 7, 8, 12, 16, 22]
SEED = 7


def main():
    root = pathlib.Path(os.environ["LLAMA_CPP_DIR"])
    lib = root / "build" / "bin"
    tmp = pathlib.Path(tempfile.mkdtemp())
    exe = tmp / "llama_logits"
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "tests/peer/llama_logits.cpp"), f"-I{root}/include",
                    f"-I{root}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}",
                    "-o", str(exe)], check=True)
    cases = []
    for shape in SHAPES:
        for t in TYPES:
            model = tmp / f"{shape}-{t}.gguf"
            subprocess.run([str(ROOT / "build/bin/llm-mkmodel"), "--shape", shape, "--type", t, "--seed", str(SEED),
                            "-o", str(model)], check=True, capture_output=True)
            rows = tmp / "rows.bin"
            subprocess.run([str(exe), str(model), str(rows), *map(str, IDS)], check=True)
            lg = np.fromfile(rows, np.float32).reshape(len(IDS), -1)
            pos = []
            for p in POSITIONS:
                top = np.argsort(-lg[p], kind="stable")[:8]
                pos.append({"pos": p, "max_abs": float(np.abs(lg[p]).max()), "ids": top.tolist(),
                            "logits": [float(x) for x in lg[p][top]]})
            cases.append({"shape": shape, "type": t, "seed": SEED,
                          "sha256": hashlib.sha256(model.read_bytes()).hexdigest(), "positions": pos})
    OUT.write_text(json.dumps({"peer": f"{'/'.join(root.parts[-3:])}, F16 KV cache, one batch", "ids": IDS,
                               "cases": cases}, indent=1) + "\n")
    print(f"wrote {OUT}: {len(cases)} files")


if __name__ == "__main__":
    sys.exit(main())
