#!/usr/bin/env python3
"""make bench: prefill and decode tokens/s of the CPU engine on seeded models
at realistic shapes, decode as a fraction of the memory roofline, and - when
LLAMA_BENCH points at llama.cpp's llama-bench - llama.cpp on the same files
and thread counts in the same run, with our/their ratios.

Roofline: a decode step reads every weight once (the token embedding only
for one row, unless it doubles as the output matrix), so tokens/s can not
exceed bandwidth / bytes per token. Bandwidth is measured two ways: a large
multi-threaded memcpy, as bytes copied per second (the usual memcpy figure;
the bus moves twice that, read plus write), and a read-only pass, the kind
of traffic decode makes. Models that fit in the last-level cache (llama-110m
does on a large-L3 server) can exceed both.

Shared machines are noisy (runs of one binary vary by +-15% here), so each
row alternates our run and llama.cpp's ROUNDS times and reports medians.

The serving section runs the engine (llm-serve-bench): aggregate decode
tokens/s with N concurrent sequences (each a PP-token prompt generating TG
tokens) against llama.cpp's llama-batched-bench on the same file and
threads (LLAMA_BATCHED_BENCH, or next to LLAMA_BENCH), then time to first
token with 16 sequences decoding, and the prefix cache's effect on time to
first token behind a shared 512-token system prompt."""
import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def sh(args, **kw):
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, **kw)
    if r.returncode:
        sys.exit(f"{args[0]} failed: {r.stderr.strip()}")
    return r.stdout


def kv(line):
    return dict(p.split("=", 1) for p in line.split())


def model(build, shape, qtype):
    path = build / "models" / f"{shape}-{qtype.lower()}.gguf"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        print(f"making {path} ...", file=sys.stderr, flush=True)
        sh([build / "bin" / "llm-mkmodel", "--shape", shape, "--type", qtype, "-o", path])
    return path


def llama_bench(exe, path, threads, p, n, reps):
    out = sh([exe, "-m", path, "-t", threads, "-p", p, "-n", n, "-r", reps, "-o", "json"], env=peer_env())
    pp = tg = None
    for row in json.loads(out):
        if row.get("n_prompt", 0) > 0 and row.get("n_gen", 0) == 0:
            pp = row["avg_ts"]
        if row.get("n_gen", 0) > 0 and row.get("n_prompt", 0) == 0:
            tg = row["avg_ts"]
    return pp, tg


def peer_env():
    env = dict(os.environ)
    env.pop("OMP_NUM_THREADS", None)
    return env


def ours(build, path, threads, p, n, reps):
    r = kv(sh([build / "bin" / "llm-bench", "-m", path, "-p", p, "-n", n, "-t", threads, "-r", reps]))
    return (float(r["prefill_tps"]), float(r["decode_tps"]), float(r["decode_bytes"]), float(r["prefill_gop_per_token"]),
            r["kernels"], int(r["weight_bytes"]), float(r["prefill_matmul_gops"]))


def machine():
    """The CPU's model name, its int8-relevant ISA extensions and its
    last-level cache in bytes (0 when unknown), for the header that says
    where the figures were measured and which files are cache-resident."""
    name, flags = "unknown CPU", set()
    try:
        for line in open("/proc/cpuinfo"):
            key, _, val = line.partition(":")
            if key.strip() == "model name":
                name = val.strip()
            elif key.strip() == "flags":
                flags = set(val.split())
    except OSError:
        pass
    isa = [f for f in ("avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512_vnni", "amx_int8") if f in flags]
    llc = 0
    for idx in sorted(pathlib.Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            size = (idx / "size").read_text().strip()
            llc = max(llc, int(size[:-1]) * {"K": 1 << 10, "M": 1 << 20}.get(size[-1], 1) if size[-1] in "KM" else int(size))
        except (OSError, ValueError):
            pass
    return name, isa, llc


def int8_peak(build, threads):
    return float(kv(sh([build / "bin" / "llm-bench", "--peak", "-t", threads]))["int8_peak_gops"])


def batched_bench(exe, path, threads, pp, tg, npl):
    out = sh([exe, "-m", path, "-t", threads, "-c", max(npl) * (pp + tg) + 64, "-b", 2048, "-ub", 512,
              "-npp", pp, "-ntg", tg, "-npl", ",".join(map(str, npl))], env=peer_env())
    res = {}
    for line in out.splitlines():
        cols = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cols) == 10 and cols[0].isdigit():
            res[int(cols[2])] = float(cols[7])  # B -> S_TG t/s
    return res


def serve_section(a, build):
    npl = [int(x) for x in a.npl.split(",")]
    exe = build / "bin" / "llm-serve-bench"
    peer = os.environ.get("LLAMA_BATCHED_BENCH")
    if not peer and os.environ.get("LLAMA_BENCH"):
        cand = pathlib.Path(os.environ["LLAMA_BENCH"]).with_name("llama-batched-bench")
        peer = str(cand) if cand.exists() else None
    t = a.serve_threads
    print(f"\nserving: {a.serve_pp}-token prompts, {a.serve_tg} tokens each, {t} threads, Q8_0, F16 KV")
    head = f"{'model':<16}{'seqs':>5}{'decode t/s':>12}{'x 1 seq':>9}{'TTFT ms':>9}"
    if peer:
        head += f"{'llama.cpp t/s':>15}{'x 1 seq':>9}{'ratio':>8}"
    print(head)
    for shape in a.serve_shapes.split(","):
        path = model(build, shape, "Q8_0")
        mine = {n: [] for n in npl}
        theirs = {n: [] for n in npl}
        for _ in range(a.serve_rounds):
            for line in sh([exe, "-m", path, "-t", t, "-p", a.serve_pp, "-n", a.serve_tg, "-r", 1,
                            "--npl", ",".join(map(str, npl))]).splitlines():
                r = kv(line)
                mine[int(r["npl"])].append((float(r["decode_tps"]), float(r["ttft_ms"])))
            if peer:
                for n, v in batched_bench(peer, path, t, a.serve_pp, a.serve_tg, npl).items():
                    theirs[n].append(v)
        base = statistics.median(x[0] for x in mine[npl[0]])
        pbase = statistics.median(theirs[npl[0]]) if peer else 0
        for n in npl:
            tg = statistics.median(x[0] for x in mine[n])
            ttft = statistics.median(x[1] for x in mine[n])
            line = f"{shape:<16}{n:>5}{tg:>12.2f}{tg / base:>9.2f}{ttft:>9.0f}"
            if peer:
                ptg = statistics.median(theirs[n])
                line += f"{ptg:>15.2f}{ptg / pbase:>9.2f}{tg / ptg:>8.2f}"
            print(line, flush=True)
        r = kv(sh([exe, "-m", path, "-t", t, "-p", a.serve_pp, "-r", 3, "--load", 16]).splitlines()[0])
        p = kv(sh([exe, "-m", path, "-t", t, "-r", 3, "--prefix", 512]).splitlines()[0])
        print(f"{shape:<16} TTFT alone {float(r['ttft_alone_ms']):.0f} ms, with 16 decoding {float(r['ttft_load_ms']):.0f} ms; "
              f"512-token shared prefix: cold {float(p['cold_ttft_ms']):.0f} ms, cached {float(p['warm_ttft_ms']):.0f} ms "
              f"({float(p['speedup']):.1f}x, {p['cached_tokens']} tokens from the cache)", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--shapes", default="llama-110m,tinyllama-1.1b")
    ap.add_argument("--types", default="Q8_0,Q4_K")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("-p", type=int, default=128)
    ap.add_argument("-n", type=int, default=64)
    ap.add_argument("-r", type=int, default=2, help="repetitions inside one run")
    ap.add_argument("--rounds", type=int, default=5, help="alternating runs per row (medians reported)")
    ap.add_argument("--sections", default="single,serve", help="single (one stream), serve (engine)")
    ap.add_argument("--serve-shapes", default="llama-110m,tinyllama-1.1b")
    ap.add_argument("--npl", default="1,4,16,64", help="concurrent sequences (serving)")
    ap.add_argument("--serve-threads", type=int, default=2)
    ap.add_argument("--serve-pp", type=int, default=32)
    ap.add_argument("--serve-tg", type=int, default=32)
    ap.add_argument("--serve-rounds", type=int, default=1)
    a = ap.parse_args()
    build = ROOT / a.build
    sections = a.sections.split(",")
    if "single" in sections:
        single_section(a, build)
    if "serve" in sections:
        serve_section(a, build)


def single_section(a, build):
    peer = os.environ.get("LLAMA_BENCH")
    threads = [int(t) for t in a.threads.split(",")]
    # The machine's memory bandwidth moves with its neighbours' load: measure
    # it around every row and use the best seen for that thread count.
    bw = {t: {"copy": 0.0, "read": 0.0} for t in threads}

    def measure(t):
        r = kv(sh([build / "bin" / "llm-bench", "--bandwidth", "-t", t]))
        bw[t]["copy"] = max(bw[t]["copy"], float(r["bandwidth_gbs"]) / 2)  # bytes copied per second
        bw[t]["read"] = max(bw[t]["read"], float(r["read_gbs"]))
        return float(r["read_gbs"])

    name, isa, llc = machine()
    # the int8 peak moves with the neighbours' load too (800-1400 GOP/s on
    # the 2-vCPU VM in one afternoon): the best seen before and after each row
    peak = {t: int8_peak(build, t) for t in threads}
    print(f"CPU: {name}; {' '.join(isa) or 'no AVX2'}; last-level cache {llc >> 20} MiB; kernel set "
          f"{os.environ.get('LLM_KERNELS') or 'best'}")
    print("GOP/s: the prefill's matmul operations per second (a multiply and an add each; the output matrix for a "
          "prompt's last token only); % peak: of the best int8 rate llm-bench --peak saw around the row; mm GOP/s, "
          "mm %: the same over the time inside the matmul calls only (activation quantizing and the thread hand-off "
          "included, the rest of a forward pass not); 'L3' after a model: its weights fit in the last-level cache")
    print("copy roof, read roof: decode over the best bandwidth seen in the whole run; same round: the median over "
          "rounds of decode over the read bandwidth measured just before and after that round's run")
    head = (f"{'model':<19}{'type':<6}{'thr':>4}{'prefill t/s':>13}{'GOP/s':>8}{'% peak':>8}{'mm GOP/s':>10}"
            f"{'mm %':>6}{'decode t/s':>12}"
            f"{'copy roof':>10}{'read roof':>10}{'same round':>11}")
    if peer:
        head += f"{'llama.cpp pp':>14}{'tg':>9}{'pp ratio':>10}{'tg ratio':>10}"
    print(head)
    for shape in a.shapes.split(","):
        for qtype in a.types.split(","):
            path = model(build, shape, qtype)
            for t in threads:
                mine, theirs, adjacent = [], [], []
                for _ in range(a.rounds):
                    # the read bandwidth just before and after our run: the
                    # roof that run saw (the best of the whole run can come
                    # from a minute when the neighbours were idle)
                    before = measure(t)
                    mine.append(ours(build, path, t, a.p, a.n, a.r))
                    after = measure(t)
                    adjacent.append(mine[-1][1] * mine[-1][2] / ((before + after) / 2 * 1e9))
                    if peer:
                        theirs.append(llama_bench(peer, path, t, a.p, a.n, a.r))
                pp = statistics.median(m[0] for m in mine)
                tg = statistics.median(m[1] for m in mine)
                step, gop, kset, wbytes = mine[0][2], mine[0][3], mine[0][4], mine[0][5]
                peak[t] = max(peak[t], int8_peak(build, t))
                copy_roof = bw[t]["copy"] * 1e9 / step
                read_roof = bw[t]["read"] * 1e9 / step
                label = shape + (" L3" if llc and wbytes <= llc else "")
                mm = statistics.median(m[6] for m in mine)
                line = (f"{label:<19}{qtype:<6}{t:>4}{pp:>13.1f}{pp * gop:>8.0f}{pp * gop / peak[t]:>8.0%}"
                        f"{mm:>10.0f}{mm / peak[t]:>6.0%}"
                        f"{tg:>12.2f}{tg / copy_roof:>9.0%} {tg / read_roof:>9.0%} {statistics.median(adjacent):>10.0%} ")
                if peer:
                    lpp = statistics.median(x[0] for x in theirs)
                    ltg = statistics.median(x[1] for x in theirs)
                    line += f"{lpp:>13.1f}{ltg:>9.2f}{pp / lpp:>10.2f}{tg / ltg:>10.2f}"
                print(line, flush=True)
    print(f"kernel set used: {kset}; best int8 peak seen: " + ", ".join(f"{peak[t]:.0f} GOP/s at {t} thread(s)"
                                                                       for t in threads)
          + "; best bandwidth seen: " + ", ".join(f"copy {bw[t]['copy']:.1f} GB/s (bytes copied), read-only "
                                              f"{bw[t]['read']:.1f} GB/s at {t} thread(s)" for t in threads))


if __name__ == "__main__":
    main()
