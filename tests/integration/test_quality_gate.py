"""The canary quality gate end to end on kubesim (spec.canary.analysis.quality):
real llm-server pods of a trained model (stories260K, F32) as the stable
revision, canaries of the same weights quantized anew by llama.cpp's gguf-py
(tests/peer/requantize.py), the texts from a ConfigMap (the model reads 128
tokens), the openai client streaming through the router all along:

- Q8_0 (KL ~0.002 on such text) passes the gate before its first step and
  again before promotion, and is promoted; the figures of both judgements
  are in status.canary.quality;
- Q4_0 (KL ~0.1), which serves without an error and as fast, is rolled back
  with reason QualityRegression before it takes a single request, its KL in
  the condition's message and an event;
- a canary whose texts the revisions cannot read alike (a ConfigMap text the
  model refuses: longer than its context) holds, saying why, and with
  onIncomparable: fail is rolled back (QualityIncomparable);
- turning the gate on (which gives the pods the operator's admin token)
  restarts the pods once, with no canary.
The client never sees a failed request."""
import json
import os
import pathlib

import pytest

from harness import running, shared, wait_for, run, ROOT
from test_canary import Client, canary, canary_requests, events, router_weight, wait_phase

openai = pytest.importorskip("openai")

# Stories as the model read them in training (short sentences, a small vocabulary), written for this test.
TEXTS = [
    "Once upon a time, there was a little girl named Lily. She loved to play in the park with her red ball.",
    "Tom had a big dog. The dog liked to run and jump. One day, the dog found a stick and gave it to Tom.",
    "The sun was hot, so Mia went to the lake. She saw a duck and said, \"Hello, duck!\" The duck was happy.",
    "Ben wanted to bake a cake with his mom. They mixed the flour and the eggs. The cake was sweet and soft.",
    "One day, a small cat went outside. It saw a bird in a tree. The cat tried to climb, but the tree was tall.",
    "Sue lost her toy in the garden. She looked under the flowers and behind the fence. Then she found it.",
    "There was a kind old man who lived in a small house. Every day he gave bread to the birds near his door.",
    "Max and Anna built a tower with blocks. The tower was very tall. Then the wind came and it fell down.",
    "The little fish swam in the sea. It was scared of the big shark, so it hid behind a rock until night.",
    "Lucy wanted to help her dad in the garden. She dug a hole and put a seed in it. Soon a flower grew.",
    "Sam was sad because it was raining. His mom said they could read a book. They read about a brave lion.",
    "A little bunny hopped in the field. It found a carrot and ate it all up. Then it took a long nap.",
]
QUALITY = "{{texts: {{configMap: stories}}, minPositions: 500, maxKLDivergence: 0.03, minTop1Agreement: 0.8{more}}}"
SPEC = """  router: {{image: llm-router:test, replicas: 1}}
  canary:
    steps: [{{weight: 50, pause: 6}}]
    intervalSeconds: 2
    analysis: {{minRequests: 5, quality: {quality}}}
"""


def spec(more=""):
    return SPEC.format(quality=QUALITY.format(more=more))


@pytest.fixture()
def models_dir(tmp_path):
    """stories260K (F32) and two requantizations of it, in one folder (the pods' model volume)."""
    base = shared("models/stories260K.gguf")
    d = tmp_path / "models"
    d.mkdir()
    (d / "stable.gguf").write_bytes(base.read_bytes())
    for q in ("Q8_0", "Q4_0"):
        run("python3", ROOT / "tests/peer/requantize.py", base, d / f"{q}.gguf", q)
    return d


def texts_configmap(c, extra=None):
    data = {f"story-{i:02d}": t for i, t in enumerate(TEXTS)}
    data.update(extra or {})
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "stories"}, "data": data}
    c.k("apply", "-f", "-", stdin=json.dumps(cm))


def start(c, d, more=""):
    c.controller()
    c.apply(model=d / "stable.gguf", extra=spec(more))
    wait_for(lambda: c.status().get("phase") == "Ready", 90)
    wait_for(lambda: c.ready_ips("story-backends"), 60)
    ip = wait_for(lambda: c.ready_ips("story"), 60)[0]
    wait_for(lambda: router_weight(ip) == 0, 30)
    return ip


def test_gate_promotes_q8_and_rolls_back_q4(tmp_path, models_dir):
    d = models_dir
    with running(tmp_path, d / "stable.gguf") as c:
        texts_configmap(c)
        ip = start(c, d)
        client = Client(ip)
        try:
            c.apply(model=d / "Q8_0.gguf", extra=spec())
            wait_phase(c, "Promoted", 240)
            q = canary(c)["quality"]
            for stage in ("start", "promotion"):
                assert q[stage]["result"] == "Pass" and q[stage]["positions"] >= 500, q
                assert q[stage]["meanKL"] < 0.01 and q[stage]["top1Agreement"] > 0.9, q
            assert "QualityPassed" in events(c)
            sent = canary_requests(ip)  # (the router's count: Q8_0's requests are in it)
            c.apply(model=d / "Q4_0.gguf", extra=spec())
            wait_phase(c, "RolledBack", 240)
        finally:
            client.finish()
        assert client.failures == [], client.failures[:5]
        cond = c.cond("CanaryRolledBack")
        assert cond["status"] == "True" and cond["reason"] == "QualityRegression", cond
        assert "mean KL divergence" in cond["message"] and "(max 0.0300)" in cond["message"], cond
        rec = canary(c)["quality"]["start"]
        assert rec["result"] == "Fail" and rec["meanKL"] > 0.03, rec
        assert "QualityRegression" in events(c)
        # judged before its first step: the router never sent it a request
        assert canary_requests(ip) == sent and c.status()["canary"]["step"] == -1


def test_incomparable_holds_or_fails(tmp_path, models_dir):
    d = models_dir
    long_text = " ".join(TEXTS)  # far more than the model's 128-token context: both revisions refuse it
    with running(tmp_path, d / "stable.gguf") as c:
        texts_configmap(c, {"zz-too-long": long_text})
        start(c, d)
        c.apply(model=d / "Q8_0.gguf", extra=spec())
        wait_for(lambda: (canary(c).get("quality") or {}).get("start", {}).get("result") == "Incomparable", 120)
        st = canary(c)
        assert st["phase"] == "Starting" and "zz-too-long" in st["message"], st
        assert "QualityIncomparable" in events(c)
        c.apply(model=d / "Q8_0.gguf", extra=spec(", onIncomparable: fail"))
        wait_phase(c, "RolledBack", 120)
        assert c.cond("CanaryRolledBack")["reason"] == "QualityIncomparable"


def test_turning_the_gate_on_restarts_once_without_a_canary(tmp_path, models_dir):
    d = models_dir
    plain = """  router: {image: llm-router:test, replicas: 1}
  canary:
    steps: [{weight: 50, pause: 6}]
    intervalSeconds: 2
"""
    with running(tmp_path, d / "stable.gguf") as c:
        texts_configmap(c)
        c.controller()
        c.apply(model=d / "stable.gguf", extra=plain)
        wait_for(lambda: c.status().get("phase") == "Ready", 90)
        before = wait_for(lambda: c.ready_ips("story-backends"), 60)
        rev0 = c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"]
        c.apply(model=d / "stable.gguf", extra=spec())
        wait_for(lambda: c.get("deployment", "story")["metadata"]["annotations"]["llmk8s.io/template-hash"] != rev0, 30)
        wait_for(lambda: c.status().get("phase") == "Ready" and c.ready_ips("story-backends")
                 and set(c.ready_ips("story-backends")).isdisjoint(before), 90)
        assert c.get("deployment", "story-canary") is None
        assert canary(c).get("phase") in (None, "Promoted", "Cancelled"), canary(c)
        assert "CanaryStarted" not in events(c)


GOOD_TEMPLATE = "{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}"
# drops the system turn: a mistake a template edit makes, which serves fine and answers worse
BROKEN_TEMPLATE = "{% for m in messages %}{% if m.role != 'system' %}{{ m.role }}: {{ m.content }}\n{% endif %}{% endfor %}"
CHATS = [
    ("Your name is Lily and you have a red ball.", "What is your name?", "My name is Lily. I have a red ball."),
    ("You are Tom, a boy with a big brown dog.", "Who are you?", "I am Tom. I have a big brown dog."),
    ("You are a cat named Mittens who loves milk.", "What do you love?", "I am Mittens and I love milk."),
    ("You live in a blue house by the sea with Ben.", "Where do you live?", "I live in a blue house by the sea."),
    ("Your friend is Sue. She has a yellow kite.", "Who is your friend?", "My friend is Sue. She has a yellow kite."),
    ("You are Max, and you like to build towers.", "What do you like?", "I am Max and I like to build towers."),
]


def chat_texts(c):
    data = {f"chat-{i}.json": json.dumps({"messages": [{"role": "system", "content": s}, {"role": "user", "content": u},
                                                       {"role": "assistant", "content": a}]})
            for i, (s, u, a) in enumerate(CHATS)}
    c.k("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "chats"},
                                              "data": data}))
    for name, text in (("good", GOOD_TEMPLATE), ("good-again", GOOD_TEMPLATE), ("broken", BROKEN_TEMPLATE)):
        c.k("apply", "-f", "-", stdin=json.dumps({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name},
                                                  "data": {"template.jinja": text}, "immutable": True}))


def test_chat_texts_catch_a_template_that_drops_the_system_turn(tmp_path, models_dir):
    """The same weights under a chat template that drops the system turn: the plain texts could not tell,
    the chats do (their answers repeat what the system turn said). The same template under another name
    passes: the gate judges what is served, not what changed."""
    d = models_dir
    chat = ("  chatTemplate: {{configMap: {t}}}\n" + SPEC).format
    quality = "{texts: {configMap: chats}, minPositions: 100, maxKLDivergence: 0.03, minTop1Agreement: 0.8}"
    with running(tmp_path, d / "stable.gguf") as c:
        chat_texts(c)
        c.controller()
        c.apply(model=d / "stable.gguf", extra=chat(t="good", quality=quality))
        wait_for(lambda: c.status().get("phase") == "Ready", 90)
        ip = wait_for(lambda: c.ready_ips("story"), 60)[0]
        wait_for(lambda: router_weight(ip) == 0, 30)
        client = Client(ip)
        try:
            c.apply(model=d / "stable.gguf", extra=chat(t="good-again", quality=quality))
            wait_phase(c, "Promoted", 240)
            ok = canary(c)["quality"]["start"]
            assert ok["result"] == "Pass" and ok["meanKL"] < 1e-6 and ok["positions"] >= 100, ok
            c.apply(model=d / "stable.gguf", extra=chat(t="broken", quality=quality))
            wait_phase(c, "RolledBack", 240)
        finally:
            client.finish()
        assert client.failures == [], client.failures[:5]
        cond = c.cond("CanaryRolledBack")
        assert cond["reason"] == "QualityRegression" and "mean KL divergence" in cond["message"], cond
        bad = canary(c)["quality"]["start"]
        assert bad["result"] == "Fail" and bad["texts"] == len(CHATS), bad


def test_colocated_canary_is_judged_inside_the_stable_pods(tmp_path, models_dir):
    """mode colocated: the new model loads inside the stable pods and the same pod is read twice, once per
    revision (X-LLM-Revision). Q4_0 is rolled back before it takes a request, the pods untouched; Q8_0
    passes both judgements and is promoted."""
    d = models_dir
    colocated = spec().replace("  canary:\n", "  canary:\n    mode: colocated\n")
    with running(tmp_path, d / "stable.gguf") as c:
        texts_configmap(c)
        ip = start(c, d, more="")
        c.apply(model=d / "stable.gguf", extra=colocated)  # (the mode alone: the same pods)
        pods0 = wait_for(lambda: c.ready_ips("story-backends"), 60)
        client = Client(ip)
        try:
            c.apply(model=d / "Q4_0.gguf", extra=colocated)
            wait_phase(c, "RolledBack", 240)
            assert canary(c)["mode"] == "colocated" and c.get("deployment", "story-canary") is None, canary(c)
            assert c.cond("CanaryRolledBack")["reason"] == "QualityRegression", c.status()
            assert c.ready_ips("story-backends") == pods0
            c.apply(model=d / "Q8_0.gguf", extra=colocated)
            wait_phase(c, "Promoted", 240)
        finally:
            client.finish()
        assert client.failures == [], client.failures[:5]
        q = canary(c)["quality"]
        assert q["start"]["result"] == "Pass" and q["promotion"]["result"] == "Pass", q


GEMMA_LLMD = """apiVersion: llmk8s.io/v1alpha1
kind: LLMDeployment
metadata: {{name: story}}
spec:
  image: llm-server:test
  replicas: 1
  model:
    path: {model}
    name: story
    volume: {{hostPath: {{path: {dir}}}}}
  engine: {{threads: 1, contextLength: 1024, maxSeqs: 4}}
  probes: {{shutdownDelaySeconds: 2, drainSeconds: 20}}
  router: {{image: llm-router:test, replicas: 1}}
  canary:
    steps: [{{weight: 50, pause: 4}}]
    intervalSeconds: 2
    analysis: {{minRequests: 5, quality: {{}}}}
"""


def test_gemma_requantized_by_llama_quantize(tmp_path, gemma):
    """The proof on a real pretrained model with the gate's defaults (the built-in texts, 1,000 positions,
    maxKLDivergence 0.1, minTop1Agreement 0.8): Gemma 3 270M Q4_K_M stable; the same weights requantized by
    llama.cpp's llama-quantize to Q8_0 pass and are promoted, to Q2_K (serving without an error) are rolled
    back with QualityRegression. Needs LLAMA_CPP_DIR (a llama.cpp built with CMake in LLAMA_CPP_DIR/build)."""
    root = os.environ.get("LLAMA_CPP_DIR")
    quantize = pathlib.Path(root or "/nonexistent") / "build" / "bin" / "llama-quantize"
    if not quantize.exists():
        pytest.skip("LLAMA_CPP_DIR/build/bin/llama-quantize missing: no llama.cpp to requantize Gemma with")
    d = tmp_path / "models"
    d.mkdir()
    stable = d / "stable.gguf"
    stable.write_bytes(gemma.read_bytes())
    for q in ("Q8_0", "Q2_K"):
        run(quantize, "--allow-requantize", stable, d / f"{q}.gguf", q)

    def apply(c, model):
        c.k("apply", "-f", "-", stdin=GEMMA_LLMD.format(model=model, dir=d))

    with running(tmp_path, stable) as c:
        c.controller()
        apply(c, stable)
        wait_for(lambda: c.status().get("phase") == "Ready", 180)
        ip = wait_for(lambda: c.ready_ips("story"), 60)[0]
        wait_for(lambda: router_weight(ip) == 0, 30)
        client = Client(ip)
        try:
            apply(c, d / "Q8_0.gguf")
            wait_phase(c, "Promoted", 600)
            good = canary(c)["quality"]
            apply(c, d / "Q2_K.gguf")
            wait_phase(c, "RolledBack", 600)
            bad = canary(c)["quality"]["start"]
        finally:
            client.finish()
        print("gemma Q8_0", json.dumps(good), "\ngemma Q2_K", json.dumps(bad))
        assert client.failures == [], client.failures[:5]
        for stage in ("start", "promotion"):
            assert good[stage]["result"] == "Pass" and good[stage]["positions"] >= 1000, good
        cond = c.cond("CanaryRolledBack")
        assert cond["reason"] == "QualityRegression" and bad["result"] == "Fail" and bad["meanKL"] > 0.1, (cond, bad)
