"""Constrained decoding through llm-server and the official `openai` client:
the `grammar` field (GBNF, llama.cpp's extension) and response_format
json_object. Every sampled completion (temperature 1, many seeds, n > 1,
streamed or not) matches the grammar, checked by Python's `regex` and
`json`; a constrained request gives the same text alone and in a batch with
others; bans and grammars compose; errors name the field."""
import concurrent.futures
import json

import pytest
import regex

from harness import NAME, Server, run_matcher, story


# A finite language: every completion ends by itself (finish_reason stop).
RECORD = 'root ::= "{\\"n\\": " [0-9]{1,3} ", \\"w\\": \\"" [a-z]{1,8} "\\"}"\n'
RECORD_RX = r'\{"n": [0-9]{1,3}, "w": "[a-z]{1,8}"\}'


@pytest.fixture(scope="module")
def srv():
    s = Server(story(), "--max_seqs", 8)
    yield s
    assert s.stop() == 0


def test_grammar_every_sample(srv):
    c = srv.client()
    n_stop = 0
    for seed in range(12):
        r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=80, temperature=1.0, seed=seed, n=3,
                                 extra_body={"grammar": RECORD})
        for ch in r.choices:
            assert regex.fullmatch(RECORD_RX, ch.text), ch.text
            assert ch.finish_reason == "stop"
            n_stop += 1
    assert n_stop == 36


def test_grammar_stream_equals_whole(srv):
    c = srv.client()
    kw = dict(model=NAME, prompt="The cat", max_tokens=80, temperature=1.0, seed=42, extra_body={"grammar": RECORD})
    whole = c.completions.create(**kw).choices[0]
    chunks = list(c.completions.create(stream=True, **kw))
    assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == whole.text
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] == "stop"


def test_grammar_chat(srv):
    c = srv.client()
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Give me a record."}], max_tokens=60,
                                  temperature=1.0, seed=3, extra_body={"grammar": RECORD})
    assert regex.fullmatch(RECORD_RX, r.choices[0].message.content), r.choices[0].message.content
    assert r.choices[0].finish_reason == "stop"


def test_batch_equals_alone(srv):
    """A seeded constrained request gives the same text while three other
    requests (constrained and not) share its steps."""
    c = srv.client()
    kw = dict(model=NAME, prompt="Once upon a time", max_tokens=80, temperature=1.0, seed=7, extra_body={"grammar": RECORD})
    alone = c.completions.create(**kw).choices[0].text
    others = [dict(model=NAME, prompt="The dog ran", max_tokens=60, temperature=1.0, seed=1),
              dict(model=NAME, prompt="Lily had", max_tokens=80, temperature=0.8, seed=2, extra_body={"grammar": RECORD}),
              dict(model=NAME, prompt="Tom", max_tokens=60, temperature=1.0, seed=3, n=2)]
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        futs = [ex.submit(c.completions.create, **o) for o in others] + [ex.submit(c.completions.create, **kw)]
        got = [f.result() for f in futs]
    assert got[-1].choices[0].text == alone
    assert regex.fullmatch(RECORD_RX, got[1].choices[0].text)


def test_ban_inside_grammar(srv):
    """A logit_bias ban holds inside a grammar: of "a" and "b" only "a" is left."""
    st, toks, _ = srv.post("/tokenize", {"content": "b", "add_special": False})
    assert st == 200
    st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 1.5, "seed": 5,
                                             "grammar": 'root ::= [ab]{1,6} "."\n', "logit_bias": {}})
    assert st == 200 and regex.fullmatch(r"[ab]{1,6}\.", r["choices"][0]["text"]), r
    # every token whose text holds a "b" is banned: byte and merged pieces alike
    bias = {}
    for i in range(512):
        st, d, _ = srv.post("/detokenize", {"tokens": [i]})
        if st == 200 and "b" in d["content"]:
            bias[str(i)] = -100
    for seed in range(5):
        st, r, _ = srv.post("/v1/completions", {"prompt": "x", "max_tokens": 40, "temperature": 1.5, "seed": seed,
                                                 "grammar": 'root ::= [ab]{1,6} "."\n', "logit_bias": bias})
        assert st == 200 and regex.fullmatch(r"a{1,6}\.", r["choices"][0]["text"]), r


def test_json_object(srv):
    """Temperature 1 on a tiny story model: every completion that ends by
    itself is a JSON object; those cut by max_tokens are prefixes of one."""
    c = srv.client()
    n_stop = 0
    for seed in range(10):
        r = c.completions.create(model=NAME, prompt="JSON:", max_tokens=110, temperature=1.0, seed=seed,
                                 extra_body={"response_format": {"type": "json_object"}})
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.text), dict), ch.text
            n_stop += 1
        else:
            assert ch.text.lstrip()[:1] in ("{", ""), ch.text
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "JSON"}], max_tokens=40,
                                  temperature=1.0, seed=1, response_format={"type": "json_object"})
    assert r.choices[0].message.content.lstrip()[:1] in ("{", "")
    print(f"json_object: {n_stop} of 10 completed within 110 tokens")


@pytest.mark.parametrize("body,param,msg", [
    ({"grammar": "root ::= x\n"}, "grammar", "rule 'x' is used but never defined"),
    ({"grammar": "root ::= root \"a\"\n"}, "grammar", "left-recursive"),
    ({"grammar": 5}, "grammar", "must be a string"),
    ({"grammar": "root ::= \u00e9\n"}, "grammar", "unexpected"),  # the client's byte reaches the message: still JSON
    ({"grammar": "root ::= \"a\"\n", "response_format": {"type": "json_object"}}, "grammar", "cannot both"),
    ({"response_format": {"type": "yaml"}}, "response_format", "not supported"),
    ({"response_format": "json"}, "response_format", "must be an object"),
])
def test_errors(srv, body, param, msg):
    st, r, _ = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 4, **body})
    assert st == 400 and r["error"]["param"] == param and msg in r["error"]["message"], r


@pytest.fixture(scope="module")
def gemma_srv(gemma):
    s = Server(gemma)
    yield s
    assert s.stop() == 0


def test_json_object_gemma(gemma_srv, tmp_path):
    """Gemma 3 270M (a real pretrained model, 262k vocabulary) at
    temperature 1, 20 seeds: each completion that ends by itself is a JSON
    object Python parses; each cut by max_tokens is a prefix of one (our
    matcher's verdict, itself held against Python's json in
    test_grammar_oracle.py); most end by themselves."""
    c = gemma_srv.client()
    texts, n_stop = [], 0
    for seed in range(20):
        r = c.completions.create(model=NAME, prompt='A cat described as a JSON object with the keys "name" and "age":\n',
                                 max_tokens=100, temperature=1.0, seed=seed,
                                 extra_body={"response_format": {"type": "json_object"}})
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            assert isinstance(json.loads(ch.text), dict), ch.text
            n_stop += 1
        else:
            texts.append(ch.text.encode())
    assert all(v == "prefix" for v in run_matcher("@jsonobject", texts, tmp_path)) if texts else True
    assert n_stop >= 10, f"only {n_stop} of 20 ended within 100 tokens"
