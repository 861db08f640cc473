"""LoRA adapters against llama.cpp (tests/data/lora-llama.cpp.json, written
by tests/peer/make_lora_refs.py) on adapters llm-mkmodel --lora-of writes
in llama.cpp's format:

- logits: at 7 of 23 positions the peer's 8 largest logits must be ours
  within TOL of the largest |logit| (test_mkmodel_oracle's rule), on tiny
  llama, llama3, qwen3, gemma3 and qwen3moe (attention adapted, experts
  not) bases with F32, F16, BF16 and Q8_0 adapters, alpha or none, a
  negative scale; the same positions without the adapter must be far
  off, so the adapter is what is compared;
- Gemma 3 270M Q4_K_M with a rank-16 adapter: greedy ids equal up to a
  near tie (test_gemma3's NEAR_TIE).

Tolerances (measured 2026-12-05 on this 2-vCPU Zen 4, printed by the
test): we keep A and B in F32; llama.cpp multiplies an F16 or BF16
adapter with activations rounded to that type, a Q8_0 one with
activations quantized to 8 bits per 32. Float bases with float adapters:
1e-3 (measured 4e-5 to 3.7e-4). A quantized base or a Q8_0 adapter: 1e-2,
since each engine rounds the activations of every quantized matmul its
own way: tiny Q8_0 with a Q8_0 adapter measured 7.2e-3 (over the whole
vocabulary the base alone is 8.8e-3 from llama.cpp, and we are 1.0e-2
from llama.cpp given the same adapter dequantized to F32, which llama.cpp
itself is 1.1e-2 from: the adapter adds nothing), tiny-gemma3 Q4_K with an
F32 adapter 9.5e-4. Doubled for the MoE file (test_mkmodel_oracle)."""
import hashlib
import json
import subprocess

import numpy as np
import pytest

from harness import BUILD, ROOT, parse_ids, run, tool


REFS = json.loads((ROOT / "tests/data/lora-llama.cpp.json").read_text())
FLOAT = {"F32", "F16", "BF16"}
NEAR_TIE = 1.0  # Gemma 3 270M Q4_K_M: see test_gemma3.py


def made(path, *args):
    run(tool("llm-mkmodel"), *map(str, args), "-o", path)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def logits(model, *lora):
    r = subprocess.run([str(BUILD / "tests" / "logits_rows"), *map(str, lora), str(model), *map(str, REFS["ids"])],
                       capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode(errors="replace")
    return np.frombuffer(r.stdout, np.float32).reshape(len(REFS["ids"]), -1)


def worst_error(rows, positions):
    worst = 0.0
    for p in positions:
        worst = max(worst, float(np.abs(rows[p["pos"]][p["ids"]] - np.array(p["logits"])).max() / p["max_abs"]))
    return worst


@pytest.mark.parametrize("case", REFS["cases"],
                         ids=lambda c: f"{c['shape']}-{c['type']}-lora-{c['lora']['type']}")
def test_logits_equal_llamacpp(case, tmp_path):
    base, lora, lo = tmp_path / "base.gguf", tmp_path / "lora.gguf", case["lora"]
    regenerate = "llm-mkmodel writes another file now: regenerate tests/data with tests/peer/make_lora_refs.py"
    assert made(base, "--shape", case["shape"], "--type", case["type"], "--seed", case["seed"]) == case["sha256"], \
        regenerate
    assert made(lora, "--lora-of", base, "--rank", lo["rank"], "--alpha", lo["alpha"], "--type", lo["type"],
                "--seed", lo["seed"]) == lo["sha256"], regenerate
    moe = case["shape"].endswith("moe")
    tol = 1e-3 if case["type"] in FLOAT and lo["type"] in FLOAT else 1e-2
    tol *= 2 if moe else 1
    ours = logits(base, "--lora", lora, case["scale"])
    err = worst_error(ours, case["positions"])
    plain = worst_error(logits(base), case["positions"])
    print(f"{case['shape']} {case['type']} + {lo['type']} rank {lo['rank']}: worst {err:.2e}, without it {plain:.2e}")
    assert err <= tol, f"logits off by {err:.2e} of max |logit| (bound {tol})"
    assert plain > 5 * tol, f"without the adapter only {plain:.2e} off: the adapter changes too little to test"
    for p in case["positions"]:
        row = ours[p["pos"]]
        top = int(np.argmax(row))
        if top != p["ids"][0]:
            assert abs(row[top] - row[p["ids"][0]]) <= tol * p["max_abs"], f"position {p['pos']}: top {top}"


def test_gemma3_greedy_equals_llamacpp(gemma, tmp_path):
    g = REFS["gemma"]
    assert hashlib.sha256(gemma.read_bytes()).hexdigest() == g["model_sha256"]
    lora, lo = tmp_path / "lora.gguf", g["lora"]
    assert made(lora, "--lora-of", gemma, "--rank", lo["rank"], "--alpha", lo["alpha"], "--type", lo["type"],
                "--seed", lo["seed"]) == lo["sha256"]
    report, changed = [], 0
    for case in g["greedy"]:
        out = run(tool("llm-generate"), "-m", gemma, "-p", case["prompt"], "-n", 32, "--temp", "0", "--ids", "-t", 2,
                  "--lora", lora, "--lora-scale", g["scale"]).stderr
        base = run(tool("llm-generate"), "-m", gemma, "-p", case["prompt"], "-n", 32, "--temp", "0", "--ids",
                   "-t", 2).stderr
        assert parse_ids(out, "prompt ids") == case["prompt_ids"], case["prompt"]
        ours, theirs = parse_ids(out, "generated ids"), case["ids"]
        changed += parse_ids(base, "generated ids") != ours
        gaps = [float(x) for x in out.split("top-2 logit gaps:")[1].split("\n")[0].split()]
        n = next((i for i, (a, b) in enumerate(zip(ours, theirs)) if a != b), min(len(ours), len(theirs)))
        if n < min(len(ours), len(theirs)):
            assert gaps[n] < NEAR_TIE, f"{case['prompt']!r}: step {n}: {ours[n]} vs {theirs[n]}, our gap {gaps[n]}"
        else:
            assert len(ours) == len(theirs), case["prompt"]
        report.append(f"{case['prompt']!r}: equal for {n} of {len(theirs)} tokens")
    print("\n".join(report))
    assert changed == len(g["greedy"]), "the adapter must change every answer, or this compares the base"
