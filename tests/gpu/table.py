"""tests/gpu/table.py - the GPU timing table of issue 8 from llm-bench's
key=value lines (tests/gpu/run.sh's bench.txt):

    python3 tests/gpu/table.py bench.txt

Per model file: prefill tokens/s (one 512-token prompt) and its matmul
rate as a share of the cuBLAS BF16 rate measured in the same run; decode
tokens/s at each batch size; batch-1 decode as a share of the bandwidth
roofline (decode bytes per token over the device copy bandwidth measured in
the same run, bytes read + written)."""
import shlex
import sys


def records(path):
    for line in open(path, encoding="utf-8", errors="replace"):
        kv = {}
        for tok in shlex.split(line):
            if "=" in tok:
                k, v = tok.split("=", 1)
                kv[k] = v
        if kv:
            yield kv


def main(path):
    dev, models, cur = {}, [], None
    for r in records(path):
        if "bandwidth_gbs" in r or "gemm_bf16_tflops" in r:
            dev.update(r)
        elif "prefill_tps" in r:
            cur = dict(r, decode={})
            models.append(cur)
        elif "decode_batch" in r and cur is not None:
            cur["decode"][int(r["decode_batch"])] = float(r["decode_tps"])
    bw = float(dev.get("bandwidth_gbs", 0)) * 1e9
    gemm = float(dev.get("gemm_bf16_tflops", 0)) * 1e12
    print(f"device: {dev.get('device', '?')}; copy bandwidth {bw / 1e9:.0f} GB/s (read + written); "
          f"cuBLAS BF16 {gemm / 1e12:.3g} TFLOP/s")
    batches = sorted({b for m in models for b in m["decode"]})
    head = f"{'model':<30} {'prefill tok/s':>13} {'% cuBLAS':>8} " + \
        " ".join(f"{'b=' + str(b):>9}" for b in batches) + f" {'b=1 % roofline':>15}"
    print(head)
    print("-" * len(head))
    for m in models:
        pp = float(m["prefill_tps"])
        flops = pp * 2 * float(m.get("matmul_params", 0))
        roof = bw / float(m["decode_bytes"]) if bw else 0
        b1 = m["decode"].get(1, 0)
        cells = " ".join(f"{m['decode'].get(b, 0):>9.1f}" for b in batches)
        name = m.get("file", m["model"]) + (" eager" if m.get("graphs") == "0" else "")
        print(f"{name:<30} {pp:>13.0f} {100 * flops / gemm if gemm else 0:>7.1f}% {cells} "
              f"{100 * b1 / roof if roof else 0:>14.1f}%")
    print("targets (issue 8): 8B BF16 batch-1 decode >= 75% of the roofline; prefill >= 60% of the cuBLAS rate")


if __name__ == "__main__":
    main(sys.argv[1])
