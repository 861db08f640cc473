"""Speculative decoding (--speculative ngram, and draft with a draft model) through llm-server and the official `openai` client, on Gemma 3 270M
(a real pretrained model): a server that guesses answers every request - greedy, seeded sampling with n > 1,
streamed, with logprobs, constrained by a JSON schema - exactly as a server that does not, byte for byte and
logprob for logprob; its guesses are taken on prompts an answer copies from (vLLM's spec_decode counters, read
with prometheus_client, say how many); a request may opt out; bad settings and fields are refused by name."""
import json
import subprocess

import pytest

from harness import NAME, Server, failed_detail, story, tool

CODE = "\n".join(f"    total_{i} = values[{i}] * scale + offset  # step {i}" for i in range(12))
GROUNDED = [
    "Repeat this function exactly, renaming `scale` to `factor`:\n\ndef combine(values, scale, offset):\n" + CODE +
    "\n    return total_0\n",
    'Quote the following passage word for word:\n"The river ran past the old mill, where the miller kept his '
    'books in a wooden chest, and every evening he counted the sacks of flour that the carts had taken to town."',
]
OPEN = "Write a short story about a robot who learns to paint."


@pytest.fixture(scope="module")
def pair(gemma):
    plain, spec = Server(gemma), Server(gemma, "--speculative", "ngram")
    yield plain, spec
    assert plain.stop() == 0 and spec.stop() == 0


def spec_counts(srv):
    """vLLM's spec_decode counters; None for one the server does not export."""
    m = srv.metrics()
    lab = (("model_name", NAME),)
    return {k: m.get((f"vllm:spec_decode_num_{k}_total", lab)) for k in ("drafts", "draft_tokens", "accepted_tokens")}


def chat(srv, prompt, **kw):
    return srv.client().chat.completions.create(model=NAME, messages=[{"role": "user", "content": prompt}],
                                                max_tokens=kw.pop("max_tokens", 120), **kw)


def test_same_answers(pair):
    """Greedy, seeded sampled (n = 2) and logprob answers are the same with and without guesses; guesses were
    taken on the grounded prompts, and the accepted tokens by position add up to the accepted total."""
    plain, spec = pair
    before = spec_counts(spec)
    for prompt in GROUNDED + [OPEN]:
        for kw in ({"temperature": 0}, {"temperature": 0.8, "seed": 7, "n": 2},
                   {"temperature": 0, "logprobs": True, "top_logprobs": 2}):
            a, b = chat(plain, prompt, **kw), chat(spec, prompt, **kw)
            for ca, cb in zip(a.choices, b.choices, strict=True):
                assert ca.message.content == cb.message.content, (prompt[:40], kw)
                assert ca.finish_reason == cb.finish_reason
                if kw.get("logprobs"):
                    assert [(t.token, t.logprob) for t in ca.logprobs.content] == \
                           [(t.token, t.logprob) for t in cb.logprobs.content]
            assert a.usage.completion_tokens == b.usage.completion_tokens
    after = spec_counts(spec)
    taken = after["accepted_tokens"] - before["accepted_tokens"]
    assert after["drafts"] > before["drafts"] and taken > 0
    assert taken <= after["draft_tokens"] - before["draft_tokens"]
    m = spec.metrics()
    per_pos = sum(v for (name, labels), v in m.items()
                  if name == "vllm:spec_decode_num_accepted_tokens_per_pos_total")
    assert per_pos == after["accepted_tokens"]
    assert not any(name.startswith("vllm:spec_decode") for name, _ in plain.metrics())  # off: not exported


def test_stream_and_schema(pair):
    """A streamed answer and a json_schema-constrained one (the grammar's mask applies to every guessed row,
    and guesses are taken under it) are the same on both servers."""
    plain, spec = pair
    stream = [
        "".join(c.choices[0].delta.content or "" for c in s.client().chat.completions.create(
            model=NAME, messages=[{"role": "user", "content": GROUNDED[1]}], max_tokens=80, temperature=0,
            stream=True) if c.choices)
        for s in pair]
    assert stream[0] == stream[1] and stream[0]
    schema = {"type": "object", "properties": {"quote": {"type": "string"}, "words": {"type": "integer"}},
              "required": ["quote", "words"], "additionalProperties": False}
    rf = {"type": "json_schema", "json_schema": {"name": "q", "schema": schema, "strict": True}}
    before = spec_counts(spec)
    texts = [chat(s, GROUNDED[1], temperature=0, response_format=rf).choices[0].message.content for s in pair]
    assert texts[0] == texts[1]
    json.loads(texts[0])
    assert spec_counts(spec)["accepted_tokens"] > before["accepted_tokens"], texts[0]


def test_opt_out(pair):
    """"speculative": false: the request guesses nothing and answers the same."""
    plain, spec = pair
    before = spec_counts(spec)
    b = chat(spec, GROUNDED[0], temperature=0, extra_body={"speculative": False})
    assert spec_counts(spec) == before
    assert b.choices[0].message.content == chat(plain, GROUNDED[0], temperature=0).choices[0].message.content
    st, r, _ = spec.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                  "speculative": "yes"})
    assert st == 400 and r["error"]["param"] == "speculative", r


def test_draft_model(gemma, pair):
    """--speculative draft with Gemma drafting for itself: its greedy guesses are its own greedy picks, so a greedy
    answer takes every guess it checks; greedy and seeded sampled answers equal the plain server's; the draft's
    time is exported."""
    plain, _ = pair
    srv = Server(gemma, "--speculative", "draft", "--spec_draft_model", gemma)
    try:
        for prompt in (GROUNDED[0], OPEN):
            before = spec_counts(srv)
            a, b = chat(plain, prompt, temperature=0, max_tokens=60), chat(srv, prompt, temperature=0, max_tokens=60)
            assert a.choices[0].message.content == b.choices[0].message.content
            after = spec_counts(srv)
            drafted = after["draft_tokens"] - before["draft_tokens"]
            assert drafted > 0 and after["accepted_tokens"] - before["accepted_tokens"] == drafted, (before, after)
        kw = {"temperature": 0.8, "seed": 3, "n": 2, "max_tokens": 40}
        a, b = chat(plain, OPEN, **kw), chat(srv, OPEN, **kw)
        assert [c.message.content for c in a.choices] == [c.message.content for c in b.choices]
        m = srv.metrics()
        assert m[("llm_spec_draft_seconds_total", (("model_name", NAME),))] > 0
        assert m[("llm_spec_draft_failures_total", (("model_name", NAME),))] == 0
    finally:
        assert srv.stop() == 0


def test_draft_of_another_vocabulary(gemma):
    """A draft whose vocabulary is not the model's fails the load, saying so on /startupz."""
    srv = Server(gemma, "--speculative", "draft", "--spec_draft_model", story(), wait=False)
    try:
        assert "vocabulary" in failed_detail(srv)
    finally:
        srv.stop()


@pytest.mark.parametrize("args,msg", [
    (["--speculative", "draft"], "spec_draft_model is required with speculative draft"),
    (["--spec_draft_model", "d.gguf"], "spec_draft_model is set but speculative is not draft"),
    (["--speculative", "eagle"], "speculative 'eagle' is not off, ngram or draft"),
    (["--speculative", "ngram", "--spec_ngram_min", "5", "--spec_ngram_max", "3"], "spec_ngram_min 5 is above"),
    (["--spec_tokens", "33"], "spec_tokens"),
])
def test_settings_refused(args, msg, tmp_path):
    r = subprocess.run([tool("llm-server"), "-m", str(tmp_path / "none.gguf"), *args], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and msg in r.stderr, r.stderr
