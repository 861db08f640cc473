#!/usr/bin/env python3
"""Routing by what pods have cached: one trace, the router's four policies
side by side in one run, and one replica alone as the floor.

The trace (seeded, the same for every run): T tenants, each with its own
system prompt of about --system-tokens tokens; conversations of 1..4 turns
(a user question of 20-60 words, then a fixed assistant reply of 12-30
words, so the prompts do not depend on what the model answers); a
conversation's tenant drawn Zipf-skewed (s = 1.1), or with --hot H one
tenant takes share H of them. C closed-loop clients each take the next
conversation and run its turns in order (streamed, 16 tokens, ignore_eos);
or, with --rate R, conversations arrive open-loop (Poisson, R per second,
seeded), each running its turns in order: latency compared at the same
offered load, where closed-loop clients give a faster policy more load.
Each policy runs on fresh pods (caches cold), each with one thread.

Reported per policy: the prompt tokens the pods computed (queries less
prefix-cache hits, from their own /metrics), that as a ratio to one
replica alone and to least-loaded, the hit rate, time to first token p50
and p99 (client side), requests/s.

  python3 tests/bench/route_cache.py --model build/models/gemma-3-270m-q4_k_m.gguf [--replicas 3] [--tenants 16]
        [--conversations 40] [--conc 6 | --rate 0.6] [--hot 0.8] [--policies cache-aware,least-loaded,round-robin,prefix-hash]
"""
import argparse
import http.client
import json
import pathlib
import random
import subprocess
import threading
import time

from router import free_ports, pct, wait_ok  # tests/bench/router.py: the same loopback helpers

ROOT = pathlib.Path(__file__).resolve().parents[2]
WORDS = ("river stone light garden window paper music winter harbor market lantern forest copper signal "
         "meadow bridge letter candle mirror orchard valley thunder silver engine compass island feather "
         "ladder pocket velvet anchor basket cinder dragon ember falcon glacier hollow ivory jasmine kettle").split()


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def make_trace(a):
    rng = random.Random(a.seed)
    systems = [f"You are the assistant of tenant {t}. " + words(rng, int(a.system_tokens * 0.75))
               for t in range(a.tenants)]
    zipf = [1 / (k + 1) ** 1.1 for k in range(a.tenants)]
    convs = []
    for _ in range(a.conversations):
        if a.hot and rng.random() < a.hot:
            t = 0
        else:
            t = rng.choices(range(a.tenants), zipf)[0]
        turns = [(words(rng, rng.randint(20, 60)) + "?", words(rng, rng.randint(12, 30)) + ".")
                 for _ in range(rng.randint(1, 4))]
        convs.append((t, turns))
    return systems, convs


def one_turn(port, messages):
    """Streams one chat turn: time to first content byte, and the usage."""
    body = json.dumps({"model": "m", "messages": messages, "max_tokens": 16, "ignore_eos": True, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.time()
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    c.request("POST", "/v1/chat/completions", body, {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        raise RuntimeError(f"{r.status}: {r.read()[:300]!r}")
    ttft, usage = None, None
    for line in r:
        if not line.startswith(b"data: {"):
            continue
        ev = json.loads(line[6:])
        if ttft is None and ev.get("choices") and ev["choices"][0]["delta"].get("content"):
            ttft = time.time() - t0
        usage = ev.get("usage") or usage
    c.close()
    return ttft, usage


def run_trace(port, systems, convs, conc, rate=0, seed=1):
    """Runs the trace: conc closed-loop clients, or (rate > 0) conversations
    arriving open-loop, Poisson at rate per second (seeded), each its turns
    in order - latency compared at the same offered load."""
    todo, lock, ttfts, errors = list(reversed(convs)), threading.Lock(), [], []

    def conversation(t, turns):
        msgs = [{"role": "system", "content": systems[t]}]
        for q, reply in turns:
            msgs.append({"role": "user", "content": q})
            try:
                ttft, _ = one_turn(port, msgs)
            except Exception as e:  # noqa: BLE001 - counted and shown
                with lock:
                    errors.append(str(e))
                return
            with lock:
                ttfts.append(ttft)
            msgs.append({"role": "assistant", "content": reply})

    def client():
        while True:
            with lock:
                if not todo:
                    return
                t, turns = todo.pop()
            conversation(t, turns)

    def arrivals():
        rng, at = random.Random(seed * 7919), time.time()
        for t, turns in convs:
            at += rng.expovariate(rate)
            time.sleep(max(0.0, at - time.time()))
            th.append(threading.Thread(target=conversation, args=(t, turns)))
            th[-1].start()

    t0 = time.time()
    th = []
    if rate > 0:
        arrivals()
    else:
        th = [threading.Thread(target=client) for _ in range(conc)]
        for x in th:
            x.start()
    for x in th:
        x.join()
    return ttfts, errors, time.time() - t0


def pod_counts(ports):
    """Prompt tokens looked up, and served from cache, summed over the pods' /metrics."""
    q = h = 0.0
    for p in ports:
        c = http.client.HTTPConnection("127.0.0.1", p, timeout=10)
        c.request("GET", "/metrics")
        for line in c.getresponse().read().decode().splitlines():
            if line.startswith("vllm:prefix_cache_queries_total"):
                q += float(line.split()[-1])
            elif line.startswith("vllm:prefix_cache_hits_total"):
                h += float(line.split()[-1])
    return q, h


def run_policy(a, bin_, policy, systems, convs):
    """Fresh pods (cold caches), the router with policy (None: one pod alone, no router); the row's numbers."""
    n = 1 if policy is None else a.replicas
    ports = free_ports(n + 1)
    pods = [subprocess.Popen([str(bin_ / "llm-server"), "-m", a.model, "--host", "127.0.0.1", "--port", str(p),
                              "--threads", str(a.threads), "--model_name", "m", "--max_seqs", str(a.max_seqs)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for p in ports[:n]]
    router = None
    try:
        for p in ports[:n]:
            wait_ok(p, "/readyz", 180)
        port = ports[0]
        if policy is not None:
            port = ports[n]
            router = subprocess.Popen([str(bin_ / "llm-router"), "--host", "127.0.0.1", "--port", str(port),
                                       "--policy", policy, "--poll-ms", "200", *a.router_args.split()] +
                                      sum((["--backend", f"http://127.0.0.1:{p}"] for p in ports[:n]), []),
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            wait_ok(port, "/readyz", 180)
        ttfts, errors, wall = run_trace(port, systems, convs, a.conc, a.rate, a.seed)
        q, h = pod_counts(ports[:n])
        return {"computed": q - h, "queries": q, "hit": h / q if q else 0, "p50": pct(ttfts, 50), "p99": pct(ttfts, 99),
                "rps": len(ttfts) / wall, "errors": errors, "n": len(ttfts)}
    finally:
        for x in ([router] if router else []) + pods:
            x.terminate()
            x.wait(timeout=60)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=str(ROOT / "build/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--replicas", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--max-seqs", type=int, default=8)
    ap.add_argument("--tenants", type=int, default=16)
    ap.add_argument("--system-tokens", type=int, default=1000)
    ap.add_argument("--conversations", type=int, default=40)
    ap.add_argument("--conc", type=int, default=6, help="closed-loop clients (not with --rate)")
    ap.add_argument("--rate", type=float, default=0, help="open loop: conversations arriving per second (Poisson)")
    ap.add_argument("--hot", type=float, default=0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--policies", default="cache-aware,least-loaded,round-robin,prefix-hash")
    ap.add_argument("--router-args", default="", help="more llm-router flags, e.g. '--cache-balance 0.5'")
    a = ap.parse_args()
    bin_ = pathlib.Path(a.build) / "bin"
    systems, convs = make_trace(a)
    turns = sum(len(t) for _, t in convs)
    print(f"{a.replicas} llm-server replicas ({a.threads} thread each, max_seqs {a.max_seqs}) of {pathlib.Path(a.model).name};"
          f" {a.tenants} tenants, ~{a.system_tokens}-token system prompts, {len(convs)} conversations ({turns} turns),"
          f" {'tenant 0 at ' + str(int(a.hot * 100)) + '%' if a.hot else 'Zipf 1.1'}, "
          f"{f'{a.rate} conversations/s arriving (open loop)' if a.rate else f'{a.conc} clients'}, seed {a.seed}\n")
    rows = {"one replica alone": run_policy(a, bin_, None, systems, convs)}
    for p in a.policies.split(","):
        rows[p] = run_policy(a, bin_, p, systems, convs)
    alone, ll = rows["one replica alone"]["computed"], rows.get("least-loaded", {}).get("computed")
    print("| policy | prompt tokens computed | vs one alone | vs least-loaded | hit rate | TTFT p50 | TTFT p99 | req/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, r in rows.items():
        print(f"| {name} | {r['computed']:.0f} | {r['computed'] / alone:.2f}x | "
              f"{(r['computed'] / ll) if ll else float('nan'):.2f}x | {r['hit']:.2f} | {r['p50'] * 1e3:.0f} ms | "
              f"{r['p99'] * 1e3:.0f} ms | {r['rps']:.2f} |" + (f" {len(r['errors'])} errors: {r['errors'][0]}"
                                                                if r["errors"] else ""), flush=True)


if __name__ == "__main__":
    main()
