#!/usr/bin/env python3
"""Load test: llm-server and, in the same run, llama.cpp's llama-server on
the same model and threads, under a closed loop of C concurrent clients
sending the traffic mix of this project's origins: 3 short queries (~18-token
prompt, 16 tokens out) to 1 long one (~250-token prompt, 128 tokens out),
streamed, greedy, ignore_eos (so both servers generate the same amounts).
Reports requests/s, generated tokens/s, and p50/p99 time to first token and
end-to-end latency per concurrency level; for llm-server also where its time
went at each level (its /metrics through prometheus_client's parser and its
threads' CPU time from /proc): steps per second, tokens per step, the share
of the wall the engine spent in steps and in forward passes, and CPU per
generated token in the HTTP threads (civetweb's, by name), the engine thread
(which is also the compute pool's thread 0: its share of the matmuls is
there) and the pool's other threads.

  python3 tests/bench/load.py --model build/models/llama-110m-q8_0.gguf \\
      [--peer /tmp/llama.cpp/build/bin/llama-server] [--threads 2] [--conc 1,4,16,32] [--requests 48]
"""
import argparse
import collections
import http.client
import json
import os
import pathlib
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = ("the cat sat on a mat while little bird sang over green hill and old man walked to river "
         "because sun was warm bright day kind children played ball near house").split()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, proc, path, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        if proc.poll() is not None:
            sys.exit(f"server exited: {proc.stderr.read()[-2000:]}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    sys.exit("server did not become ready")


def mix(n, seed=1):
    rng = random.Random(seed)
    reqs = []
    for i in range(n):
        long = i % 4 == 3
        prompt = " ".join(rng.choice(WORDS) for _ in range(70 if long else 5))  # ~250 and ~18 tokens here
        reqs.append((prompt, 128 if long else 16))
    return reqs


def one(port, prompt, max_tokens):
    """Streams one completion; returns (ttft_s, e2e_s, chunks)."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
                       "ignore_eos": True})
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"status {r.status}: {r.read()[:200]}")
    ttft, chunks = None, 0
    for line in r:
        if line.startswith(b"data: ") and line.strip() != b"data: [DONE]":
            chunks += 1
            if ttft is None:
                ttft = time.time() - t0
    c.close()
    return ttft or 0.0, time.time() - t0, chunks


def level(port, conc, reqs):
    todo = list(reqs)
    lock = threading.Lock()
    out = []

    def worker():
        while True:
            with lock:
                if not todo:
                    return
                p, n = todo.pop()
            res = one(port, p, n)
            with lock:
                out.append((res, n))

    t0 = time.time()
    th = [threading.Thread(target=worker) for _ in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    wall = time.time() - t0
    ttft = sorted(x[0][0] for x in out)
    e2e = sorted(x[0][1] for x in out)
    q = lambda v, p: v[min(len(v) - 1, int(p * len(v)))]
    return {"rps": len(out) / wall, "tps": sum(n for _, n in out) / wall, "ttft50": q(ttft, 0.5), "ttft99": q(ttft, 0.99),
            "e2e50": q(e2e, 0.5), "e2e99": q(e2e, 0.99)}


def scrape(port):
    """llm-server's counters that say where time goes (prometheus_client's parser)."""
    from prometheus_client.parser import text_string_to_metric_families
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    c.request("GET", "/metrics")
    text = c.getresponse().read().decode()
    c.close()
    out = {}
    for fam in text_string_to_metric_families(text):
        for smp in fam.samples:
            if not smp.labels:
                out[smp.name] = smp.value
    return out


def thread_cpu(pid):
    """CPU seconds per thread group of a process: HTTP workers, engine, compute pool, the rest."""
    tick = os.sysconf("SC_CLK_TCK")
    out = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/stat") as f:
                st = f.read()
        except OSError:
            continue
        name = st[st.index("(") + 1:st.rindex(")")]
        f = st[st.rindex(")") + 2:].split()
        group = "engine" if name == "llm-engine" else "pool" if name.startswith("llm-cpu") else \
            "http" if name.startswith("civetweb") else "other"
        out[group] += (int(f[11]) + int(f[12])) / tick  # utime + stime
    return out


def profile(m0, m1, c0, c1, wall):
    """Where llm-server's time went over one level (deltas of scrape and thread_cpu)."""
    d = lambda k: m1.get(k, 0) - m0.get(k, 0)
    steps, gen = d("llm_engine_steps_total"), d("llm_generation_tokens_total")
    toks = d("llm_batch_size_tokens_sum")
    cpu = {k: c1[k] - c0[k] for k in ("http", "engine", "pool", "other")}
    us = lambda k: 1e6 * cpu[k] / gen if gen else 0.0
    return {"steps_s": steps / wall, "tok_step": toks / steps if steps else 0.0, "gen_step": gen / steps if steps else 0.0,
            "busy": d("llm_engine_step_seconds_total") / wall, "fwd": d("llm_engine_forward_seconds_total") / wall,
            "http_us": us("http"), "engine_us": us("engine"), "pool_us": us("pool"), "other_us": us("other")}


def run_server(kind, a, port):
    if kind == "ours":
        cmd = [ROOT / a.build / "bin" / "llm-server", "-m", a.model, "--host", "127.0.0.1", "--port", port,
               "--threads", a.threads, "--n_ctx", 512]
        ready = "/readyz"
    else:
        cmd = [a.peer, "-m", a.model, "--host", "127.0.0.1", "--port", port, "-t", a.threads, "-np", 32,
               "-c", 512 * 32, "--no-webui"]
        ready = "/health"
    proc = subprocess.Popen([str(x) for x in cmd], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    wait_ready(port, proc, ready)
    return proc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--peer", default=None, help="llama.cpp's llama-server")
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--conc", default="1,4,16,32")
    ap.add_argument("--requests", type=int, default=48, help="per concurrency level")
    a = ap.parse_args()
    kinds = ["ours"] + (["llama.cpp"] if a.peer else [])
    res, prof = {}, {}
    for kind in kinds:
        port = free_port()
        proc = run_server(kind, a, port)
        try:
            one(port, "warm up", 4)
            for conc in map(int, a.conc.split(",")):
                if kind == "ours":
                    m0, c0, t0 = scrape(port), thread_cpu(proc.pid), time.time()
                # each level its own prompts (the same for both servers): a level
                # must not find the last one's prompts in the prefix cache
                res[(kind, conc)] = level(port, conc, mix(a.requests, seed=conc))
                if kind == "ours":
                    prof[conc] = profile(m0, scrape(port), c0, thread_cpu(proc.pid), time.time() - t0)
        finally:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    print(f"{'server':<10}{'conc':>5}{'req/s':>8}{'tok/s':>8}{'TTFT p50':>10}{'p99':>8}{'e2e p50':>9}{'p99':>8}")
    for (kind, conc), r in sorted(res.items(), key=lambda x: (x[0][1], x[0][0] != "ours")):
        print(f"{kind:<10}{conc:>5}{r['rps']:>8.2f}{r['tps']:>8.1f}{r['ttft50'] * 1e3:>9.0f}ms{r['ttft99'] * 1e3:>6.0f}ms"
              f"{r['e2e50']:>8.2f}s{r['e2e99']:>7.2f}s", flush=True)
    print("\nllm-server, where the time went (busy/forward: share of the wall in engine steps / forward passes;"
          " CPU per generated token by thread group)")
    print(f"{'conc':>5}{'steps/s':>9}{'tok/step':>9}{'gen/step':>9}{'busy':>7}{'fwd':>7}{'http':>9}{'engine':>9}"
          f"{'pool':>9}{'other':>9}")
    if prof and all(p["http_us"] == 0 for p in prof.values()):
        print("(no thread named civetweb-*: this civetweb build does not name its threads; HTTP time is in 'other')")
    for conc, p in sorted(prof.items()):
        print(f"{conc:>5}{p['steps_s']:>9.2f}{p['tok_step']:>9.1f}{p['gen_step']:>9.1f}{p['busy']:>7.2f}{p['fwd']:>7.2f}"
              f"{p['http_us']:>7.0f}us{p['engine_us']:>7.0f}us{p['pool_us']:>7.0f}us{p['other_us']:>7.0f}us", flush=True)


if __name__ == "__main__":
    main()
