#!/usr/bin/env python3
"""Router benchmark: llm-router in front of two llm-server backends, least
loaded against round robin, in the same run, under uneven request lengths
(1 long request of 128 tokens to 3 short ones of 8, ignore_eos) from C
concurrent closed-loop clients. Round robin queues short requests behind
long ones on a busy backend; least loaded sends them to the idle one.
Reports requests/s and p50/p99 latency of short and of all requests.

  python3 tests/bench/router.py --model build/models/llama-110m-q8_0.gguf [--threads 1] [--conc 6] [--seconds 20]
"""
import argparse
import http.client
import json
import pathlib
import random
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]


def free_ports(n):
    """n loopback ports, all free now and all different: the sockets are
    held open together, so the kernel cannot hand one out twice."""
    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def wait_ok(port, path, timeout=120):
    end = time.time() + timeout
    while time.time() < end:
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    sys.exit(f"port {port}{path} not ready")


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p / 100 * len(xs)))] if xs else float("nan")


def run(port, conc, seconds, seed):
    lat = {"short": [], "long": []}
    end = time.time() + seconds
    rng = random.Random(seed)
    lock = threading.Lock()

    def client(i):
        r = random.Random(seed * 100 + i)
        while time.time() < end:
            kind = "long" if r.random() < 0.25 else "short"
            body = json.dumps({"model": "m", "prompt": "Once upon a time", "max_tokens": 128 if kind == "long" else 8,
                               "ignore_eos": True, "temperature": 0})
            t0 = time.time()
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
            c.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
            ok = c.getresponse().status == 200
            if ok:
                with lock:
                    lat[kind].append(time.time() - t0)
    th = [threading.Thread(target=client, args=(i,)) for i in range(conc)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    rng.random()
    return lat


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--conc", type=int, default=6)
    ap.add_argument("--seconds", type=float, default=20)
    a = ap.parse_args()
    bin_ = pathlib.Path(a.build) / "bin"
    ports = free_ports(2)
    servers = [subprocess.Popen([str(bin_ / "llm-server"), "-m", a.model, "--host", "127.0.0.1", "--port", str(p),
                                 "--threads", str(a.threads), "--model_name", "m", "--max_seqs", "4"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports]
    try:
        for p in ports:
            wait_ok(p, "/readyz")
        print(f"two llm-server backends ({a.threads} thread(s), max_seqs 4), {a.conc} clients, {a.seconds:.0f} s per "
              f"policy, 1 long (128 tokens) : 3 short (8 tokens)\n")
        print("| policy | req/s | short p50 | short p99 | all p50 | all p99 |")
        print("|---|---:|---:|---:|---:|---:|")
        for policy in ("round-robin", "least-loaded"):
            rp = free_ports(1)[0]  # the back-ends hold theirs: not handed out again
            router = subprocess.Popen([str(bin_ / "llm-router"), "--host", "127.0.0.1", "--port", str(rp), "--policy",
                                       policy, "--poll-ms", "100"] + sum((["--backend", f"http://127.0.0.1:{p}"]
                                                                         for p in ports), []),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                wait_ok(rp, "/readyz")
                lat = run(rp, a.conc, a.seconds, 7)
            finally:
                router.terminate()
                router.wait(timeout=30)
            allv = lat["short"] + lat["long"]
            print(f"| {policy} | {len(allv) / a.seconds:.2f} | {pct(lat['short'], 50) * 1e3:.0f} ms | "
                  f"{pct(lat['short'], 99) * 1e3:.0f} ms | {statistics.median(allv) * 1e3:.0f} ms | "
                  f"{pct(allv, 99) * 1e3:.0f} ms |", flush=True)
    finally:
        for s in servers:
            s.terminate()
            s.wait(timeout=30)


if __name__ == "__main__":
    main()
