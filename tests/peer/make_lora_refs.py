"""Writes tests/data/lora-llama.cpp.json: what llama.cpp (the peer, built
from LLAMA_CPP_DIR, e.g. llama-cpp-python 0.3.36's vendor/llama.cpp)
answers with LoRA adapters that llm-mkmodel --lora-of writes in its
format: the 8 largest logits at some of 23 positions on tiny models (every
adapter type, four architectures, a quantized base), and greedy ids of
Gemma 3 270M Q4_K_M with an adapter. The files' sha256 are kept so a change
of llm-mkmodel shows as such. tests/integration/test_lora.py holds the
engine against it.

With PEFT_PYTHON (a Python with torch, transformers and peft) it also makes
an adapter with Hugging Face's peft (tests/peer/make_peft_adapter.py),
converts it with llama.cpp's own convert_lora_to_gguf.py (F16) into
build/peer/peft-lora-tiny.gguf (model files are not tracked: the test skips
where it is absent) and keeps its sha256 and llama.cpp's logits with it;
without PEFT_PYTHON the kept ones stay.

    LLAMA_CPP_DIR=... [PEFT_PYTHON=...] python3 tests/peer/make_lora_refs.py [GEMMA.gguf]"""
import hashlib
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tempfile

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/lora-llama.cpp.json"
MKMODEL = ROOT / "build/bin/llm-mkmodel"
IDS = [510, 297, 99, 101, 32, 117, 112, 273, 259, 256, 105, 274, 300, 12, 45, 99, 400, 250, 7, 18, 260, 301, 402]
POSITIONS = [0, 3, 7, 8, 12, 16, 22]
SEED = 7
# (shape, base type, rank, alpha (0: none), adapter type, adapter seed, scale)
CASES = [("tiny", "F32", 8, 16, "F32", 1, 0.8), ("tiny", "Q8_0", 32, 0, "Q8_0", 2, 1.0),
         ("tiny-qwen3", "F32", 16, 32, "F16", 3, 0.5), ("tiny-gemma3", "F32", 16, 32, "BF16", 4, 1.5),
         ("tiny-gemma3", "Q4_K", 16, 32, "F32", 5, 3.0), ("tiny-qwen3moe", "F32", 8, 16, "F32", 6, 1.0),
         ("tiny-llama3", "F32", 4, 8, "F32", 7, -0.6)]
GEMMA_PROMPTS = ["The capital of France is", "Once upon a time", "def quicksort(arr):", "Water boils at"]
GEMMA_ADAPTER = (16, 32, "F32", 11, 0.2)


def build(root, src, out):
    lib = root / "build" / "bin"
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "tests/peer" / src), f"-I{root}/include",
                    f"-I{root}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}",
                    "-o", str(out)], check=True)


def sha(path):
    return hashlib.sha256(pathlib.Path(path).read_bytes()).hexdigest()


def mklora(base, rank, alpha, qtype, seed, out):
    subprocess.run([str(MKMODEL), "--lora-of", str(base), "--rank", str(rank), "--alpha", str(alpha), "--type", qtype,
                    "--seed", str(seed), "-o", str(out)], check=True, capture_output=True)


def logit_cases(tmp, exe):
    cases = []
    for shape, btype, rank, alpha, atype, aseed, scale in CASES:
        base, lora, rows = tmp / f"{shape}-{btype}.gguf", tmp / "lora.gguf", tmp / "rows.bin"
        subprocess.run([str(MKMODEL), "--shape", shape, "--type", btype, "--seed", str(SEED), "-o", str(base)],
                       check=True, capture_output=True)
        mklora(base, rank, alpha, atype, aseed, lora)
        subprocess.run([str(exe), "--lora", str(lora), str(scale), str(base), str(rows), *map(str, IDS)], check=True)
        pos = top8(np.fromfile(rows, np.float32).reshape(len(IDS), -1))
        cases.append({"shape": shape, "type": btype, "seed": SEED, "sha256": sha(base),
                      "lora": {"rank": rank, "alpha": alpha, "type": atype, "seed": aseed, "sha256": sha(lora)},
                      "scale": scale, "positions": pos})
    return cases


def top8(rows):
    pos = []
    for p in POSITIONS:
        top = np.argsort(-rows[p], kind="stable")[:8]
        pos.append({"pos": p, "max_abs": float(np.abs(rows[p]).max()), "ids": top.tolist(),
                    "logits": [float(x) for x in rows[p][top]]})
    return pos


def peft_case(tmp, exe, root, python):
    """peft's adapter for the tiny llama base, converted by llama.cpp, and llama.cpp's logits with it."""
    made = subprocess.run([python, str(ROOT / "tests/peer/make_peft_adapter.py"), str(tmp / "peft")], check=True,
                          capture_output=True, text=True).stdout.strip().splitlines()[-1]
    out = tmp / "peft-lora-tiny.gguf"  # into build/peer only with its refs (main)
    subprocess.run([python, str(root / "convert_lora_to_gguf.py"), "--base", str(tmp / "peft/base"), "--outtype",
                    "f16", "--outfile", str(out), str(tmp / "peft/adapter")], check=True, capture_output=True)
    base, rows = tmp / "tiny-F32.gguf", tmp / "rows.bin"
    subprocess.run([str(MKMODEL), "--shape", "tiny", "--type", "F32", "--seed", str(SEED), "-o", str(base)],
                   check=True, capture_output=True)
    subprocess.run([str(exe), "--lora", str(out), "1.0", str(base), str(rows), *map(str, IDS)], check=True)
    lg = np.fromfile(rows, np.float32).reshape(len(IDS), -1)
    return {"shape": "tiny", "type": "F32", "seed": SEED, "sha256": sha(base), "file": out.name,
            "file_sha256": sha(out), "made_by": f"{made}; llama.cpp convert_lora_to_gguf.py --outtype f16",
            "scale": 1.0, "positions": top8(lg)}


def gemma_greedy(tmp, exe, model):
    rank, alpha, atype, aseed, scale = GEMMA_ADAPTER
    lora = tmp / "gemma-lora.gguf"
    mklora(model, rank, alpha, atype, aseed, lora)
    runs = []
    for p in GEMMA_PROMPTS:
        out = subprocess.run([str(exe), str(model), p, "32", str(lora), str(scale)], capture_output=True, text=True,
                             check=True).stderr
        ids = lambda what: [int(x) for x in re.search(rf"^{what}:(.*)$", out, re.M).group(1).split()]
        runs.append({"prompt": p, "prompt_ids": ids("prompt ids"), "ids": ids("generated ids")})
    return {"model_sha256": sha(model), "lora": {"rank": rank, "alpha": alpha, "type": atype, "seed": aseed,
                                                  "sha256": sha(lora)}, "scale": scale, "greedy": runs}


def main():
    root = pathlib.Path(os.environ["LLAMA_CPP_DIR"])
    tmp = pathlib.Path(tempfile.mkdtemp())
    build(root, "llama_logits.cpp", tmp / "llama_logits")
    build(root, "llama_greedy.cpp", tmp / "llama_greedy")
    refs = {"peer": f"{'/'.join(root.parts[-3:])}, F16 KV cache, llama_set_adapters_lora", "ids": IDS,
            "cases": logit_cases(tmp, tmp / "llama_logits")}
    if len(sys.argv) > 1:
        refs["gemma"] = gemma_greedy(tmp, tmp / "llama_greedy", sys.argv[1])
    if os.environ.get("PEFT_PYTHON"):
        refs["peft"] = peft_case(tmp, tmp / "llama_logits", root, os.environ["PEFT_PYTHON"])
        (ROOT / "build/peer").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp / refs["peft"]["file"], ROOT / "build/peer" / refs["peft"]["file"])
    elif OUT.exists() and "peft" in json.loads(OUT.read_text()):
        refs["peft"] = json.loads(OUT.read_text())["peft"]
    OUT.write_text(json.dumps(refs, indent=1) + "\n")
    print(f"wrote {OUT}: {len(refs['cases'])} files" + (", Gemma 3 greedy" if "gemma" in refs else "") +
          (", the peft adapter" if "peft" in refs else ""))


if __name__ == "__main__":
    sys.exit(main())
