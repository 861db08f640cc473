#!/usr/bin/env python3
"""JSON within max_tokens, measured: N answers at temperature 1 (half json_schema over test_structured.py's
schemas and a recursive tree, half json_object), seeds 0..N-1, through the official `openai` client, from one or
more llm-server configurations (--server LABEL=PATH[,FLAG,VALUE...], each started with the same model, all at
once, taking turns batch by batch). Prints per build: answers that ended by themselves ("stop"), that parse,
that validate (jsonschema), mean completion tokens, and the grammar's time per generated token from the
server's own counters (llm_engine_grammar_seconds_total over llm_generation_tokens_total).

Example (the same build with and without closing within max_tokens):
  python3 tests/bench/json_budget.py --model build/models/gemma-3-270m-q4_k_m.gguf \
      --server close=build/bin/llm-server --server cut=build/bin/llm-server,--grammar_close,false"""
import argparse
import concurrent.futures
import json
import pathlib
import sys

import jsonschema

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))

from harness import Server, metric  # noqa: E402
import test_structured as ts  # noqa: E402


def judge(answers):
    fc = jsonschema.Draft202012Validator.FORMAT_CHECKER
    stop = parse = valid = 0
    for schema, ch, _ in answers:
        stop += ch.finish_reason == "stop"
        try:
            doc = json.loads(ch.message.content)
        except ValueError:
            continue
        parse += 1
        try:
            if schema is None:
                valid += isinstance(doc, dict)
            else:
                jsonschema.Draft202012Validator(schema, format_checker=fc).validate(doc)
                valid += 1
        except jsonschema.ValidationError:
            pass
    return stop, parse, valid


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", required=True)
    ap.add_argument("--server", action="append", required=True, help="LABEL=PATH to an llm-server")
    ap.add_argument("--answers", type=int, default=100)
    ap.add_argument("--max-tokens", type=int, default=120)
    ap.add_argument("--parallel", type=int, default=8)
    a = ap.parse_args()
    servers = {}
    for spec in a.server:
        label, rest = spec.split("=", 1)
        path, *flags = rest.split(",")
        servers[label] = Server(a.model, "--max_seqs", a.parallel, *flags, binary=path)
    results = {label: [] for label in servers}
    try:
        with concurrent.futures.ThreadPoolExecutor(a.parallel) as ex:
            for start in range(0, a.answers, a.parallel):
                for label, srv in servers.items():
                    c = srv.client()
                    ids = range(start, min(start + a.parallel, a.answers))
                    results[label] += ex.map(lambda i, c=c: ts.budget_answer(c, i, a.max_tokens), ids)
        print("| build | answers | stop | parse | validate | mean tokens | grammar ms per token |")
        print("|---|---|---|---|---|---|---|")
        for label, srv in servers.items():
            m = srv.metrics()
            g = metric(m, "llm_engine_grammar_seconds_total") * 1e3
            n = metric(m, "llm_generation_tokens_total")
            stop, parse, valid = judge(results[label])
            toks = sum(u for _, _, u in results[label]) / len(results[label])
            print(f"| {label} | {len(results[label])} | {stop} | {parse} | {valid} | {toks:.1f} | {g / max(n, 1):.3f} |")
    finally:
        for srv in servers.values():
            srv.stop()


if __name__ == "__main__":
    main()
