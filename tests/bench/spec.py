#!/usr/bin/env python3
"""Speculative decoding, measured: batch-1 decode tokens/s of llm-server without and with n-gram guesses
(--speculative ngram) on four completion tasks - three whose answers copy their input (edit a 60-line function,
extract JSON from a document, continue a quoted passage) and one open-ended - beside llama.cpp's llama-server
without and with its own n-gram speculation (--peer PATH, same model file, same thread count, same prompts), all
greedy; then llm-server's throughput at 16 and 64 concurrent sequences with guesses off and on.

Decode rate: (completion tokens - 1) / (last streamed token - first), the median of --reps runs, the servers
taking turns run by run; usage from stream_options include_usage. Prints a Markdown table; ratios are against llm-server without guesses."""
import argparse
import concurrent.futures
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time
import urllib.request

import openai

ROOT = pathlib.Path(__file__).resolve().parents[2]

FUNC = "\n".join(
    [
        "def summarize(orders, tax_rate, discount):",
        '    """Totals per customer, with tax and a discount over 100."""',
        "    totals = {}",
    ]
    + [
        line
        for i in range(14)
        for line in (
            f"    order_{i} = orders[{i}]",
            f"    amount_{i} = order_{i}['qty'] * order_{i}['price']",
            f"    if amount_{i} > 100:",
            f"        amount_{i} = amount_{i} - discount",
        )
    ]
    + ["    return totals"]
)
DOC = (
    "Invoice 2291 was issued on 3 March 2026 by Harbor Supplies Ltd, 14 Quay Street, Bristol, to Mill Lane "
    "Bakery, 2 Mill Lane, Bath. It lists 40 bags of flour at 18.50 each, 12 tins of yeast at 4.20 each and 6 "
    "boxes of baking paper at 7.95 each. Payment is due within 30 days to account GB29 NWBK 6016 1331 9268 19. "
    "The contact for questions is Alice Moreno, alice.moreno@harbor-supplies.example, +44 117 496 0321."
)
PASSAGE = (
    "It was the best of times, it was the worst of times, it was the age of wisdom, it was the age of "
    "foolishness, it was the epoch of belief, it was the epoch of incredulity, it was the season of Light, it was "
    "the season of Darkness, it was the spring of hope, it was the winter of despair, we had everything before "
    "us, we had nothing before us, we were all going direct to Heaven, we were all going direct the other way"
)
# Completion prompts (Gemma 3 270M is a base model: it continues text), each set up so that a faithful
# continuation copies from its input, as an editing, extracting or quoting answer does.
TASKS = {
    "edit a function": "```python\n" + FUNC + "\n```\n\nThe same function with `discount` renamed to `rebate`, "
    "every other line unchanged:\n\n```python\ndef summarize(orders, tax_rate, rebate):\n",
    "extract JSON": DOC + "\n\nThe same facts as JSON, values copied exactly:\n\n{\"invoice\": \"2291\", \"date\": ",
    "quote a passage": "\"" + PASSAGE + "\"\n\nThat is how the novel opens. Once more, word for word:\n\n\"It was the",
    "open-ended": "Write a short story about a lighthouse keeper who finds a message in a bottle.\n\n",
}


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(cmd, port):
    """Starts a server; returns once it answers ready (llm-server's /readyz, llama-server's /health)."""
    p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    probe = "/readyz" if cmd[0].endswith("llm-server") else "/health"
    for _ in range(600):
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}{probe}", timeout=2).status == 200:
                return p
        except OSError:
            pass
        if p.poll() is not None:
            sys.exit(f"{cmd[0]} exited {p.returncode}")
        time.sleep(0.5)
    p.kill()
    sys.exit(f"{cmd[0]} did not become ready")


def decode_rate(client, prompt, max_tokens):
    """(tokens/s after the first token, completion tokens) of one greedy streamed answer."""
    t_first = t_last = None
    n = 0
    for c in client.completions.create(model="m", prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
                                       stream_options={"include_usage": True}):
        if c.choices and c.choices[0].text:
            t_last = time.perf_counter()
            t_first = t_first or t_last
        if c.usage:
            n = c.usage.completion_tokens
    return ((n - 1) / (t_last - t_first) if n > 1 and t_last > t_first else 0.0), n


def throughput(client, n_seqs, max_tokens):
    """Generated tokens per second of n_seqs answers at once (the tasks in turn)."""
    prompts = [list(TASKS.values())[i % len(TASKS)] for i in range(n_seqs)]

    def one(p):
        r = client.completions.create(model="m", prompt=p, max_tokens=max_tokens, temperature=0)
        return r.usage.completion_tokens
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(n_seqs) as ex:
        total = sum(ex.map(one, prompts))
    return total / (time.perf_counter() - t0)


def servers(args):
    """(label, command, port) of each server measured."""
    out = []
    ours = [("llm-server", []), ("llm-server ngram", ["--speculative", "ngram"])]
    ours += [(f"llm-server {v.split('=', 1)[0]}", v.split("=", 1)[1].split()) for v in args.variant]
    for label, extra in ours:
        port = free_port()
        out.append((label, [str(ROOT / args.build / "bin" / "llm-server"), "-m", args.model, "--host", "127.0.0.1",
                            "--port", str(port), "--threads", str(args.threads), "--model_name", "m", *extra], port))
    if args.peer:
        for label, extra in (("llama.cpp", []),
                             ("llama.cpp ngram-simple", ["--spec-type", "ngram-simple"]),
                             ("llama.cpp ngram-mod", ["--spec-type", "ngram-mod"])):
            port = free_port()
            out.append((label, [args.peer, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t",
                                str(args.threads), "-c", "4096", "-np", "1", "--no-webui", *extra], port))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--model", default=str(ROOT / "build/models/gemma-3-270m-q4_k_m.gguf"))
    ap.add_argument("--peer", default=os.environ.get("LLAMA_SERVER"), help="llama.cpp's llama-server")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--throughput", default="16,64", help="concurrent sequences ('' to skip)")
    ap.add_argument("--variant", action="append", default=[],
                    help="another llm-server to measure, LABEL=ARGS (e.g. 'k16=--speculative ngram --spec_tokens 16')")
    ap.add_argument("--tasks", default=",".join(TASKS), help="the tasks measured, comma-separated")
    args = ap.parse_args()
    # Every server is up at once and the runs alternate between them, rep by rep: this VM's speed drifts by
    # 20% within minutes, and one server measured minutes after another would carry that drift into the ratio
    # (an idle server takes no CPU: one request runs at a time).
    procs, clients = [], {}
    try:
        for label, cmd, port in servers(args):
            procs.append(start(cmd, port))
            clients[label] = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0)
            decode_rate(clients[label], "Say hello.", 8)  # warm up
        runs = {}
        for rep in range(args.reps):
            for task in args.tasks.split(","):
                for label, client in clients.items():
                    runs.setdefault((label, task), []).append(decode_rate(client, TASKS[task], args.max_tokens))
        rates = {}
        for (label, task), rs in runs.items():
            rates[label, task] = (statistics.median(r for r, _ in rs), rs[0][1])
            print(f"{label:24} {task:18} {rates[label, task][0]:7.1f} tok/s ({rs[0][1]} tokens; runs "
                  f"{', '.join(f'{r:.1f}' for r, _ in rs)})", file=sys.stderr, flush=True)
        for n in map(int, args.throughput.split(",")) if args.throughput else ():
            for rep in range(args.reps):
                for label, client in clients.items():
                    if label.startswith("llm-server"):
                        runs.setdefault((label, f"{n} sequences"), []).append(throughput(client, n, 128))
            for label in clients:
                if (label, f"{n} sequences") in runs:
                    rs = runs[label, f"{n} sequences"]
                    rates[label, f"{n} sequences"] = (statistics.median(rs), 0)
                    print(f"{label:24} {n} seqs {statistics.median(rs):7.1f} tok/s (runs "
                          f"{', '.join(f'{r:.1f}' for r in rs)})", file=sys.stderr, flush=True)
    finally:
        for p in procs:
            p.terminate()
            p.wait(timeout=60)
    labels = list(dict.fromkeys(label for label, _ in rates))
    rows = list(dict.fromkeys(task for _, task in rates))
    print("| task | " + " | ".join(labels) + " |")
    print("|---|" + "---|" * len(labels))
    for task in rows:
        base = rates.get(("llm-server", task), (0, 0))[0]
        cells = []
        for label in labels:
            r = rates.get((label, task))
            cells.append("-" if r is None else f"{r[0]:.1f} ({r[0] / base:.2f}x)" if base else f"{r[0]:.1f}")
        print(f"| {task} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
