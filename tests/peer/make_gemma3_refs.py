"""Writes tests/data/gemma3-270m-llama.cpp.json: what llama.cpp (the peer,
built from LLAMA_CPP_DIR, e.g. llama-cpp-python 0.3.36's vendor/llama.cpp)
answers on Gemma 3 270M Q4_K_M: prompt ids of llama.cpp's SentencePiece
tokenizer vectors and of mixed strings, and greedy ids of 10 short prompts
and one past the sliding window for 64 tokens. tests/integration/test_gemma3.py holds our engine against it.

    LLAMA_CPP_DIR=... python3 tests/peer/make_gemma3_refs.py MODEL.gguf VECTORS.inp"""
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tests/data/gemma3-270m-llama.cpp.json"

MIXED = [
    "def fib(n):\n    return n if n < 2 else fib(n - 1) + fib(n - 2)\n",
    "for (int i = 0; i < n; i++) { sum += a[i] * b[i]; }",
    "東京は日本の首都です。人口は約1400万人。",
    "北京欢迎你！我们一起去长城吧。",
    "안녕하세요, 만나서 반갑습니다.",
    "Emoji: 🦙🚀✨ and a family 👨‍👩‍👧‍👦 and flags 🇫🇷🇯🇵",
    "    leading spaces and\t\ttabs\n\n\nand newlines   ",
    "trailing spaces        ",
    "Mixed: Ünïcödé ñ ß ø å 𝔘𝔫𝔦𝔠𝔬𝔡𝔢",
    "<start_of_turn>user\nHi<end_of_turn>",
    "https://example.com/path?query=1&other=%20value#frag",
    "JSON: {\"key\": [1, 2.5e-3, null, true], \"s\": \"a\\nb\"}",
    "Числа 12345 и 3.14159 — русский текст.",
    "العربية نص قصير للاختبار",
    "हिन्दी में एक वाक्य।",
    "A" * 300,
    "The quick brown fox jumps over the lazy dog. " * 5,
    "   ",
    "\n",
    "x = [i**2 for i in range(10) if i % 2 == 0]  # squares of evens",
]

PROMPTS = ["The capital of France is", "Once upon a time", "def quicksort(arr):", "The best way to learn a language is",
           "In 1969, the first humans", "Water boils at", "My favourite recipe for pancakes:",
           "The three laws of thermodynamics are", "Dear Sir or Madam,", "import numpy as np\n"]


# Past the 512-token window of Gemma's local layers (and past one 512-row
# prefill chunk): the opening of Debian's GPL-3 text (base-files), ~800 ids.
LONG = pathlib.Path("/usr/share/common-licenses/GPL-3").read_text()[:3600]


def ids(line, what):
    m = re.search(rf"^{what}:(.*)$", line, re.M)
    return [int(x) for x in m.group(1).split()]


def main():
    model, vectors = sys.argv[1], sys.argv[2]
    root = pathlib.Path(os.environ["LLAMA_CPP_DIR"])
    lib = root / "build" / "bin"
    exe = pathlib.Path(tempfile.mkdtemp()) / "llama_greedy"
    subprocess.run(["g++", "-O2", "-std=c++17", str(ROOT / "tests/peer/llama_greedy.cpp"), f"-I{root}/include",
                    f"-I{root}/ggml/include", f"-L{lib}", "-lllama", "-lggml", "-lggml-base", f"-Wl,-rpath,{lib}",
                    "-o", str(exe)], check=True)

    def peer(text, n):
        r = subprocess.run([str(exe), model, text, str(n)], capture_output=True, text=True, check=True)
        return r.stderr

    texts = [t for t in pathlib.Path(vectors).read_text().split("\n__ggml_vocab_test__\n") if t] + MIXED
    tok = [{"text": t, "ids": ids(peer(t, 0), "prompt ids")} for t in texts]
    greedy = []
    for p in PROMPTS + [LONG]:
        out = peer(p, 64)
        greedy.append({"prompt": p, "prompt_ids": ids(out, "prompt ids"), "ids": ids(out, "generated ids")})
    sha = hashlib.sha256(pathlib.Path(model).read_bytes()).hexdigest()
    OUT.write_text(json.dumps({"model_sha256": sha, "peer": f"{'/'.join(root.parts[-3:])}, greedy, F16 KV cache",
                               "tokenize": tok, "greedy": greedy}, ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {OUT}: {len(tok)} tokenizations, {len(greedy)} greedy runs")


if __name__ == "__main__":
    main()
