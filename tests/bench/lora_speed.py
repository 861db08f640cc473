"""One configuration of tests/bench/lora_speed.sh: N concurrent greedy
completions against llm-server (ours: model = adapter a{i mod K}) or
llama-server (llama: its "lora" scales), the second of two rounds timed.
    python3 lora_speed.py ours|llama PORT ADAPTERS SEQS TOKENS"""
import json, sys, threading, time, urllib.request
kind, port, n_adapt, n_seq, n_tok = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
PROMPT = "Once upon a time, in a small village by the sea,"
def one(i, out):
    if kind == "ours":
        body = {"model": f"a{i % n_adapt}" if n_adapt else "test", "prompt": PROMPT, "max_tokens": n_tok,
                "temperature": 0, "ignore_eos": True}
        url = f"http://127.0.0.1:{port}/v1/completions"
    else:
        body = {"prompt": PROMPT, "n_predict": n_tok, "temperature": 0, "ignore_eos": True, "cache_prompt": False,
                "lora": [{"id": k, "scale": 1.0 if (n_adapt and k == i % n_adapt) else 0.0} for k in range(16)]}
        url = f"http://127.0.0.1:{port}/completion"
    req = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    r = json.loads(urllib.request.urlopen(req, timeout=600).read())
    out[i] = r["usage"]["completion_tokens"] if kind == "ours" else r["tokens_predicted"]
for rep in range(2):
    out = {}
    ts = [threading.Thread(target=one, args=(i, out)) for i in range(n_seq)]
    t0 = time.time()
    for t in ts: t.start()
    for t in ts: t.join()
    dt = time.time() - t0
    if rep == 1:
        print(f"{kind} adapters={n_adapt} seqs={n_seq} tokens={sum(out.values())} wall={dt:.2f}s tok/s={sum(out.values())/dt:.1f}")
