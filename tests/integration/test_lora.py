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
  near tie (test_gemma3's NEAR_TIE);
- an adapter made by Hugging Face's peft and converted by llama.cpp's own
  convert_lora_to_gguf.py (build/peer/peft-lora-tiny.gguf, where
  make_lora_refs.py made it; skipped elsewhere): logits as above.

Then llm-server through the official openai client: adapters from --lora
and from /v1/load_lora_adapter, /v1/models with parents, the base and
four adapters answered concurrently each as alone, loading and unloading
while requests stream (an unload waits for them), eviction at max_loras,
every hostile load refused with nothing loaded changed, the metrics.

Tolerances (measured 2026-12-05 on this 2-vCPU Zen 4, printed by the
test): our products are float (an F16 adapter's exact values; BF16 and
Q8_0 widened to F32 at load); llama.cpp multiplies an F16 or BF16
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
import os
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import numpy as np
import openai
import pytest

from harness import BUILD, NAME, ROOT, Server, metric, parse_ids, run, running, tool, wait_for


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


def test_peft_adapter_converted_by_llamacpp(tmp_path):
    """An adapter made by Hugging Face's peft and converted by llama.cpp's own convert_lora_to_gguf.py
    (F16; tests/peer/make_lora_refs.py with PEFT_PYTHON): its names, layout (llama's Q/K rows permuted
    by the converter) and alpha as real adapters ship, against llama.cpp's logits with it."""
    pe = REFS["peft"]
    lora, base = ROOT / "build/peer" / pe["file"], tmp_path / "base.gguf"
    if not lora.exists():  # model files are not tracked; making it needs torch, transformers and peft
        pytest.skip(f"{lora} absent: made by tests/peer/make_lora_refs.py with PEFT_PYTHON (torch, transformers, peft)")
    assert hashlib.sha256(lora.read_bytes()).hexdigest() == pe["file_sha256"], "regenerate with make_lora_refs.py"
    assert made(base, "--shape", pe["shape"], "--type", pe["type"], "--seed", pe["seed"]) == pe["sha256"], \
        "llm-mkmodel writes another file now: regenerate tests/data with tests/peer/make_lora_refs.py"
    ours = logits(base, "--lora", lora, pe["scale"])
    err, plain = worst_error(ours, pe["positions"]), worst_error(logits(base), pe["positions"])
    print(f"{pe['made_by']}: worst {err:.2e}, without it {plain:.2e}")
    assert err <= 1e-3, f"logits off by {err:.2e} of max |logit|"
    assert plain > 5e-3, f"without the adapter only {plain:.2e} off: the adapter changes too little to test"
    for p in pe["positions"]:
        assert int(np.argmax(ours[p["pos"]])) == p["ids"][0] or \
            abs(ours[p["pos"]].max() - ours[p["pos"]][p["ids"][0]]) <= 1e-3 * p["max_abs"], p["pos"]


# ---- llm-server --------------------------------------------------------------------------------------------------

TOKEN = "lora-admin"
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def adapters(tmp_path_factory, models):
    """A tiny F32 base, five adapters of it in lora_dir (a..e), one of
    another architecture, one of rank 32, and a file outside lora_dir."""
    d = tmp_path_factory.mktemp("loras")
    base = models("tiny", "F32")
    lib = d / "lib"
    lib.mkdir()
    out = {"base": base, "dir": lib}
    for i, name in enumerate("abcde"):
        made(lib / f"{name}.gguf", "--lora-of", base, "--rank", 8, "--alpha", 16, "--seed", 50 + i)
        out[name] = lib / f"{name}.gguf"
    made(lib / "other-arch.gguf", "--lora-of", models("tiny-qwen2", "F32"), "--rank", 8)
    made(lib / "rank32.gguf", "--lora-of", base, "--rank", 32)
    made(d / "outside.gguf", "--lora-of", base, "--rank", 8, "--seed", 99)
    (lib / "escape.gguf").symlink_to(d / "outside.gguf")
    (lib / "notgguf.gguf").write_bytes(b"GGUF" + os.urandom(200))
    out["outside"] = d / "outside.gguf"
    return out


def admin(srv, path, body, token=TOKEN):
    return srv.request("POST", path, body, headers={"Authorization": f"Bearer {token}"} if token else {})


def model_ids(srv):
    return {m["id"]: m.get("parent") for m in json.loads(srv.get("/v1/models")[1])["data"]}


def complete(client, model, n=16, prompt=PROMPT):
    r = client.completions.create(model=model, prompt=prompt, max_tokens=n, temperature=0,
                                  extra_body={"ignore_eos": True})
    assert r.model == model
    return r.choices[0].text


def test_server_serves_adapters_concurrently(adapters):
    """Four adapters from --lora (one scaled) and the base: /v1/models lists
    them with their parent; answered concurrently, each equals its answer
    alone, and each adapter answers otherwise than the base."""
    a = adapters
    srv = Server(a["base"], "--lora", f"a={a['a']},b={a['b']}:0.5", "--lora", f"c={a['c']}", "--lora",
                 f"d={a['d']}:-1", "--max_seqs", 8)
    try:
        assert model_ids(srv) == {NAME: None, "a": NAME, "b": NAME, "c": NAME, "d": NAME}
        client = srv.client()
        names = [NAME, "a", "b", "c", "d"]
        alone = {m: complete(client, m, 24) for m in names}
        assert len(set(alone.values())) == 5, alone
        got, errors = {}, []

        def one(m, k):
            try:
                got[(m, k)] = complete(client, m, 24)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=one, args=(m, k)) for k in range(2) for m in names]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for (m, _), text in got.items():
            assert text == alone[m], m
        # embeddings under an adapter: its hidden states, not the base's (and the answer names it)
        ea, eb = (client.embeddings.create(model=x, input=PROMPT, encoding_format="float") for x in ("a", NAME))
        assert ea.model == "a" and ea.data[0].embedding != eb.data[0].embedding
        m = srv.metrics()
        assert metric(m, "llm_lora_requests_total", adapter="a", model_name=NAME) == 4
        assert metric(m, "llm_lora_generation_tokens_total", adapter="b", model_name=NAME) == 72
        info = [k for k in m if k[0] == "vllm:lora_requests_info"]
        assert len(info) == 1 and dict(info[0][1])["max_lora"] == "8" and dict(info[0][1])["model_name"] == NAME, info
        assert metric(m, "llm_lora_loaded", adapter="c", model_name=NAME) == 1
        # Go's parser (promcheck: expfmt) reads the page with the adapters' families as Python's does
        text = srv.get("/metrics")[1]
        r = subprocess.run([str(BUILD / "bin" / "promcheck")], input=text, capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stdout + r.stderr
        go = {line.split()[0]: line.split()[1].lower() for line in r.stdout.splitlines()}
        assert go["llm_lora_requests_total"] == "counter" and go["vllm:lora_requests_info"] == "gauge", go
    finally:
        srv.stop()


def test_server_loads_and_unloads_while_streaming(adapters):
    """Loading an adapter while another's request streams; an unload waits
    for the request streaming on it (which ends whole), and new requests
    naming it are refused as soon as it starts."""
    a = adapters
    srv = Server(a["base"], "--lora", f"a={a['a']}", "--admin_token", TOKEN, "--lora_dir", a["dir"])
    try:
        client = srv.client()
        first = threading.Event()
        ends = {}

        def stream(model, n):
            chunks = 0
            for ch in client.completions.create(model=model, prompt=PROMPT, max_tokens=n, temperature=0, stream=True,
                                                extra_body={"ignore_eos": True}):
                chunks += 1
                first.set()
            ends[model] = (time.monotonic(), chunks)

        gen0 = metric(srv.metrics(), "llm_generation_tokens_total")
        t = threading.Thread(target=stream, args=("a", 400))
        t.start()
        assert first.wait(60)
        status, text, _ = admin(srv, "/v1/load_lora_adapter", {"lora_name": "e", "lora_path": str(a["e"])})
        assert status == 200, text
        assert complete(client, "e") != complete(client, NAME)
        unloaded = {}

        def unload():
            unloaded["status"] = admin(srv, "/v1/unload_lora_adapter", {"lora_name": "a"})[0]
            # the server's count once the unload returned: the stream on "a" was over by then
            unloaded["generated"] = metric(srv.metrics(), "llm_generation_tokens_total") - gen0

        u = threading.Thread(target=unload)
        u.start()

        def refused():
            try:
                complete(client, "a", 1)
                return False
            except openai.NotFoundError:
                return True

        wait_for(refused, 60, "requests naming an adapter being unloaded refused")
        t.join(120)
        u.join(120)
        assert unloaded["status"] == 200
        assert ends["a"][1] >= 400, ends  # it ended whole
        # every token of the stream (and of the two requests before) was made before the unload returned
        assert unloaded["generated"] >= 400 + 32, unloaded
        assert model_ids(srv) == {NAME: None, "e": NAME}
        assert admin(srv, "/v1/unload_lora_adapter", {"lora_name": "a"})[0] == 404
    finally:
        srv.stop()


def test_server_refuses_hostile_loads(adapters):
    """Each bad load is refused with a clear error, and what is loaded stays."""
    a = adapters
    srv = Server(a["base"], "--lora", f"a={a['a']}", "--admin_token", TOKEN, "--lora_dir", a["dir"],
                 "--max_lora_rank", 16)
    try:
        before = model_ids(srv)
        cases = [({"lora_name": NAME, "lora_path": str(a["b"])}, 400, "base model's name"),
                 ({"lora_name": "a", "lora_path": str(a["b"])}, 400, "loaded already"),
                 ({"lora_name": "x y", "lora_path": str(a["b"])}, 400, "lora_name"),
                 ({"lora_name": "z" * 129, "lora_path": str(a["b"])}, 400, "lora_name"),
                 ({"lora_name": "x", "lora_path": str(a["outside"])}, 400, "not a file inside the directory"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / "escape.gguf")}, 400, "not a file inside"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / ".." / "outside.gguf")}, 400, "not a file inside"),
                 ({"lora_name": "x", "lora_path": "/etc/passwd"}, 400, "not a file inside"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / "other-arch.gguf")}, 400, "architecture"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / "rank32.gguf")}, 400, "rank 32"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / "notgguf.gguf")}, 400, "adapter 'x'"),
                 ({"lora_name": "x", "lora_path": str(a["dir"] / "missing.gguf")}, 400, "not a file inside"),
                 ({"lora_name": "x", "lora_path": str(a["b"]), "scale": "big"}, 400, "scale"),
                 ({"lora_name": "x", "lora_path": str(a["b"]), "scale": 1e9}, 400, "scale"),
                 ({"lora_name": "x"}, 400, "lora_path"),
                 ([1, 2], 400, "lora_name")]
        for body, want, text in cases:
            status, got, _ = admin(srv, "/v1/load_lora_adapter", body)
            assert status == want and text in got, (body, status, got)
        assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(a["b"])}, token=None)[0] == 401
        assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(a["b"])}, token="no")[0] == 401
        assert model_ids(srv) == before
        assert complete(srv.client(), "a")  # still serving
        with pytest.raises(openai.NotFoundError):
            complete(srv.client(), "x")
    finally:
        srv.stop()


def test_server_evicts_idle_adapters_only(adapters):
    """At max_loras, a load unloads the idle adapter used least recently; with
    every adapter in use it is refused (429) and nothing changes."""
    a = adapters
    srv = Server(a["base"], "--lora", f"a={a['a']},b={a['b']}", "--admin_token", TOKEN, "--lora_dir", a["dir"],
                 "--max_loras", 2, "--max_seqs", 4, "--fault_delay_ms", 1500)  # each request holds its adapter 1.5 s first
    try:
        client = srv.client()
        complete(client, "b", 1)
        complete(client, "a", 1)  # b is now the one used least recently
        for bad in ("other-arch.gguf", "notgguf.gguf", "missing.gguf"):  # a full table: a bad file evicts nothing
            assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "x", "lora_path": str(a["dir"] / bad)})[0] == 400
        assert model_ids(srv) == {NAME: None, "a": NAME, "b": NAME}
        assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(a["c"])})[0] == 200
        assert model_ids(srv) == {NAME: None, "a": NAME, "c": NAME}
        def stream(m):
            for _ in client.completions.create(model=m, prompt=PROMPT, max_tokens=300, temperature=0, stream=True,
                                               extra_body={"ignore_eos": True}):
                pass

        def held():  # each request holds its adapter through the server's 1.5 s delay (fault_delay_ms)
            state = json.loads(srv.request("GET", "/admin/lora", headers={"Authorization": f"Bearer {TOKEN}"})[1])
            return all(x["requests"] >= 1 for x in state["adapters"])

        ts = [threading.Thread(target=stream, args=(m,)) for m in ("a", "c")]
        for t in ts:
            t.start()
        wait_for(held, 60, "both adapters held by a request", interval=0.02)
        status, text, _ = admin(srv, "/v1/load_lora_adapter", {"lora_name": "d", "lora_path": str(a["d"])})
        assert status == 429 and "in use" in text, text
        assert model_ids(srv) == {NAME: None, "a": NAME, "c": NAME}
        for t in ts:
            t.join(120)
        assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "d", "lora_path": str(a["d"])})[0] == 200
        assert len(model_ids(srv)) == 3 and "d" in model_ids(srv)
    finally:
        srv.stop()


def test_server_bad_lora_setting_fails_the_start(adapters):
    for spec, text in ((f"a{adapters['a']}", "not NAME=PATH"), (f"a={adapters['dir'] / 'other-arch.gguf'}", "architecture"),
                       (f"{NAME}={adapters['a']}", "base model's name"), (f"a={adapters['a']}:5000", "scale"),
                       (",".join(f"{k}={adapters[k]}" for k in "abcde"), "more than max_loras 4")):
        srv = Server(adapters["base"], "--lora", spec, "--max_loras", 4, wait=False)
        try:
            detail = wait_for(lambda: failed_or_none(srv), 60, "the load failing")
            assert text in detail, (spec, detail)
        finally:
            srv.stop()


def failed_or_none(srv):
    try:
        body = json.loads(srv.get("/startupz")[1])
    except OSError:
        return None
    return body["detail"] if body.get("phase") == "failed" else None


def test_server_lora_file_and_digests(adapters, tmp_path):
    """lora_file (what the operator writes from spec.adapters): adapters with
    their sha256 and scale at start; GET /admin/lora shows them; a wrong
    digest stops the start, or refuses a load, naming the mismatch."""
    a = adapters
    digest = hashlib.sha256(a["a"].read_bytes()).hexdigest()
    f = tmp_path / "adapters.json"
    f.write_text(json.dumps([{"name": "a", "path": str(a["a"]), "sha256": digest},
                             {"name": "b", "path": str(a["b"]), "scale": 0.5}]))
    srv = Server(a["base"], "--lora_file", f, "--admin_token", TOKEN, "--lora_dir", a["dir"])
    try:
        status, text, _ = srv.request("GET", "/admin/lora", headers={"Authorization": f"Bearer {TOKEN}"})
        state = json.loads(text)
        assert status == 200 and state["max_loras"] == 8, text
        assert [(x["name"], x["sha256"], x["scale"], x["state"]) for x in state["adapters"]] == \
            [("a", digest, 1.0, "ready"), ("b", "", 0.5, "ready")]
        assert srv.request("GET", "/admin/lora")[0] == 401
        status, text, _ = admin(srv, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(a["c"]), "sha256": digest})
        assert status == 400 and "sha256 mismatch" in text, text
        assert admin(srv, "/v1/load_lora_adapter", {"lora_name": "c", "lora_path": str(a["c"]), "sha256": "12"})[0] == 400
        assert model_ids(srv) == {NAME: None, "a": NAME, "b": NAME}
    finally:
        srv.stop()
    f.write_text(json.dumps([{"name": "a", "path": str(a["b"]), "sha256": digest}]))
    for body, text in ((None, "sha256 mismatch"), ('[{"name": "a"}]', "needs a name and one of uri and path"),
                       ('{"a": 1}', "not a JSON array"), ("[", "lora_file")):
        if body is not None:
            f.write_text(body)
        srv = Server(a["base"], "--lora_file", f, wait=False)
        try:
            detail = wait_for(lambda: failed_or_none(srv), 60, "the load failing")
            assert text in detail, (body, detail)
        finally:
            srv.stop()


# ---- on kubesim: spec.adapters ------------------------------------------------------------------------------------

def kcomplete(ip, model):
    body = json.dumps({"model": model, "prompt": PROMPT, "max_tokens": 8, "temperature": 0,
                       "ignore_eos": True}).encode()
    req = urllib.request.Request(f"http://{ip}:8080/v1/completions", body, {"Content-Type": "application/json"})
    try:
        return json.loads(urllib.request.urlopen(req, timeout=60).read())["choices"][0]["text"]
    except urllib.error.HTTPError as e:
        return e.code


def adapters_yaml(*entries):
    return "  adapters:\n" + "".join(f"  - {json.dumps(e)}\n" for e in entries)


def test_operator_applies_adapters_without_restarts(cluster, models, tmp_path):
    """spec.adapters: served by the pods from their start; a changed list
    (a scale changed, one added, one removed) applied to the running pod
    through its admin route (the same pod, its answers changed); a bad
    adapter named in AdaptersReady while the model keeps serving."""
    c = cluster
    c.controller()
    d = tmp_path / "files"
    d.mkdir()
    base = d / "model.gguf"
    base.symlink_to(c.model)
    for name, seed in (("a", 1), ("b", 2)):
        made(d / f"{name}.gguf", "--lora-of", c.model, "--rank", 8, "--seed", seed)
    made(d / "bad.gguf", "--lora-of", models("tiny-qwen2", "F32"), "--rank", 8)

    def converged(want):
        st = c.status()
        cond = c.cond("AdaptersReady")
        return st.get("phase") == "Ready" and cond.get("status") == "True" and st.get("adapters") == want and st

    c.apply(model=base, extra=adapters_yaml({"name": "a", "path": str(d / "a.gguf")}))
    wait_for(lambda: converged([{"name": "a", "loaded": 1, "pods": 1}]), 120, "adapter a on the pod")
    assert "adapters.json" in c.get("configmap", "story-config")["data"]
    pods = json.loads(c.k("get", "pods", "-o", "json").stdout)["items"]
    uid, pod = [p["metadata"]["uid"] for p in pods], pods[0]["metadata"]["name"]

    def pod_has(names):  # status.podAdapters: what the pod answered it has
        pa = c.status().get("podAdapters") or {}
        return pa.get("pods") == [{"pod": pod, "answered": True, "loaded": names, "more": 0}] and pa.get("omitted") == 0

    wait_for(lambda: pod_has(["a"]), 60, "status.podAdapters lists a on the pod")
    ip = wait_for(lambda: c.ready_ips(), 30)[0]
    plain, first_a = kcomplete(ip, "story"), kcomplete(ip, "a")
    assert isinstance(first_a, str) and first_a != plain

    c.apply(model=base, extra=adapters_yaml({"name": "a", "path": str(d / "a.gguf"), "scale": 0.25},
                                            {"name": "b", "path": str(d / "b.gguf")}))
    wait_for(lambda: converged([{"name": "a", "loaded": 1, "pods": 1}, {"name": "b", "loaded": 1, "pods": 1}]), 120,
             "a rescaled and b added")
    assert [p["metadata"]["uid"] for p in json.loads(c.k("get", "pods", "-o", "json").stdout)["items"]] == uid
    assert kcomplete(ip, "a") != first_a and isinstance(kcomplete(ip, "b"), str)
    wait_for(lambda: pod_has(["a", "b"]) or pod_has(["b", "a"]), 60, "status.podAdapters lists a and b")

    c.apply(model=base, extra=adapters_yaml({"name": "b", "path": str(d / "b.gguf")},
                                            {"name": "bad", "path": str(d / "bad.gguf")}))
    cond = wait_for(lambda: (x := c.cond("AdaptersReady")).get("reason") == "AdapterFailed" and x, 120,
                    "the bad adapter reported")
    assert cond["status"] == "False" and "bad" in cond["message"] and "architecture" in cond["message"], cond
    wait_for(lambda: kcomplete(ip, "a") == 404, 60, "a unloaded")
    assert kcomplete(ip, "story") == plain and isinstance(kcomplete(ip, "b"), str)
    assert c.status()["phase"] == "Ready"
    assert [p["metadata"]["uid"] for p in json.loads(c.k("get", "pods", "-o", "json").stdout)["items"]] == uid
    wait_for(lambda: pod_has(["b"]), 60, "status.podAdapters: b alone (bad never loaded, a unloaded)")


# A compromised pod: /admin/lora answers what the file named by its first argument holds, loads are refused,
# everything else is 200 (so it is ready and serving).
HOSTILE_POD = r"""
import http.server, json, os, sys, threading
answer = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass
    def reply(self, code, body, ctype="application/json"):
        b = body.encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(b)))
        self.end_headers()
        self.wfile.write(b)
    def do_GET(self):
        if self.path == "/admin/lora":
            self.reply(200, open(answer).read())
        else:
            self.reply(200, "", "text/plain")
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.reply(400, json.dumps({"error": {"message": "refused by the hostile pod"}}))
for port in (8080, 8081):
    s = http.server.ThreadingHTTPServer((os.environ["POD_IP"], port), H)
    threading.Thread(target=s.serve_forever, daemon=True).start()
threading.Event().wait()
"""


def test_operator_bounds_what_a_hostile_pod_says(model, tmp_path):
    """status.podAdapters from a compromised pod's GET /admin/lora: at most 32 names of 1-128 bytes, the
    rest counted in `more` (objects, null, numbers, "" and a 500-byte name among 36 good ones); a list of
    more than 64 entries counts as no answer. The status keeps being written (a name that is not a string
    would make the API server refuse the whole patch; unbounded lists would pass etcd's object size)."""
    answer, pod = tmp_path / "answer.json", tmp_path / "pod.py"
    pod.write_text(HOSTILE_POD)
    ready = lambda n: {"name": n, "state": "ready", "source": "/x", "sha256": "", "scale": 1}
    answer.write_text(json.dumps({"adapters": [ready(f"a{i}") for i in range(36)] +
                                  [ready(x) for x in ({}, None, 5, "", "x" * 500)]}))
    with running(tmp_path, model, images={"hostile:test": [sys.executable, str(pod), str(answer)]}) as c:
        c.controller()
        c.apply(image="hostile:test", extra=adapters_yaml({"name": "a", "path": "/nowhere/a.gguf"}))

        def listed(answered):
            pods = (c.status().get("podAdapters") or {}).get("pods") or []
            return len(pods) == 1 and pods[0]["answered"] == answered and pods[0]

        p = wait_for(lambda: listed(True), 120, "the hostile pod's list in status.podAdapters")
        assert p["loaded"] == [f"a{i}" for i in range(32)] and p["more"] == 4 + 5, p
        assert c.cond("AdaptersReady").get("status") == "False"
        answer.write_text(json.dumps({"adapters": [ready(f"b{i}") for i in range(100)]}))
        p = wait_for(lambda: listed(False), 60, "a list of 100 taken as no answer")
        assert p["loaded"] == [] and p["more"] == 0, p


def test_router_sends_an_adapters_requests_to_pods_that_have_it(adapters):
    """Two servers, only one with adapter a: the router (polling their
    /metrics) sends every request naming a there, the base model's to
    either (round robin); once a is loaded on the other too, both take a."""
    from harness import Router
    a = adapters
    one = Server(a["base"], "--lora", f"a={a['a']}")
    two = Server(a["base"], "--admin_token", TOKEN, "--lora_dir", a["dir"])
    r = Router("--backend", one.base, "--backend", two.base, "--policy", "round-robin")  # the base model's spread is exact
    try:
        body = {"model": "a", "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        wait_for(lambda: all(r.post(body)[0] == 200 for _ in range(4)), 30, "the router polled the adapters")
        assert {r.post(body)[2] for _ in range(12)} == {one.base}
        base = {"model": NAME, "prompt": PROMPT, "max_tokens": 2, "temperature": 0}
        assert {r.post(base)[2] for _ in range(8)} == {one.base, two.base}
        assert admin(two, "/v1/load_lora_adapter", {"lora_name": "a", "lora_path": str(a["a"])})[0] == 200
        wait_for(lambda: two.base in {r.post(body)[2] for _ in range(8)}, 30, "the second pod taking a")
        assert {r.post(body)[0] for _ in range(8)} == {200}
    finally:
        assert r.stop() == 0
        one.stop()
        two.stop()
