"""Request fields through the official `openai` client and raw HTTP: every
field is honoured, refused with a 400 naming it, or (never heard of) logged
once per name; logit_bias bans and boosts exactly."""
import re

import pytest

from harness import NAME, Server, story


@pytest.fixture(scope="module")
def srv():
    s = Server(story())
    yield s
    assert s.stop() == 0


def ids_of(srv, text):
    st, body, _ = srv.post("/tokenize", {"content": text, "add_special": False})
    assert st == 200, body
    return body["tokens"]


def vocab_size(srv):
    st, body, _ = srv.post("/v1/completions", {"prompt": "a", "max_tokens": 1, "logit_bias": {"999999": 1}})
    assert st == 400 and body["error"]["param"] == "logit_bias", body
    m = re.search(r"not in \[0, (\d+)\)", body["error"]["message"])
    assert m, body
    return int(m.group(1))


def test_bias_bans_all_but_two(srv):
    """With every token but two banned, sampled text at temperature 1.5 is
    made of those two pieces only: the ban holds at any temperature and
    over the fallback."""
    the, time = ids_of(srv, "the"), ids_of(srv, "time")  # SentencePiece: "▁the", "▁time"
    assert len(the) == 1 and len(time) == 1
    keep = {the[0], time[0]}
    n_vocab = vocab_size(srv)
    bias = {str(i): -100 for i in range(n_vocab) if i not in keep}
    c = srv.client()
    for seed in range(5):
        r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=1.5, seed=seed,
                                 logit_bias=bias)
        assert re.fullmatch(r"( the| time)+", r.choices[0].text), r.choices[0].text
        assert r.usage.completion_tokens == 12


def test_bias_boost(srv):
    """+100 on one token makes greedy decoding repeat it; a chat request
    takes the same field."""
    cat = ids_of(srv, "the")[0]
    c = srv.client()
    r = c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=6, temperature=0,
                             logit_bias={str(cat): 100})
    assert r.choices[0].text == " the" * 6
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "hi"}], max_tokens=4,
                                  temperature=0, logit_bias={str(cat): 100})
    assert r.choices[0].message.content.strip() == "the the the the"


@pytest.mark.parametrize("body,param", [
    ({"logit_bias": {"x1": 5}}, "logit_bias"),
    ({"logit_bias": {"007": 5}}, "logit_bias"),  # "7" and "007" would both bias token 7
    ({"logit_bias": {"+7": 5}}, "logit_bias"),
    ({"logit_bias": {"-1": 5}}, "logit_bias"),
    ({"logit_bias": {"3": 101}}, "logit_bias"),
    ({"logit_bias": {"3": "5"}}, "logit_bias"),
    ({"logit_bias": [3]}, "logit_bias"),
    ({"logit_bias": {str(i): 1 for i in range(4097)}}, "logit_bias"),
    ({"suffix": "the end"}, "suffix"),
    ({"best_of": 3}, "best_of"),
    ({"echo": True}, "echo"),
])
def test_completions_refusals(srv, body, param):
    st, r, _ = srv.post("/v1/completions", {"prompt": "Once", "max_tokens": 2, **body})
    assert st == 400 and r["error"]["param"] == param, r


CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}


@pytest.mark.parametrize("body,param", [
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"function_call": "auto"}, "function_call"),
    ({"audio": {"voice": "alloy"}}, "audio"),
    ({"modalities": ["text", "audio"]}, "modalities"),
    ({"reasoning_effort": "high"}, "reasoning_effort"),
    ({"tool_choice": "required"}, "tool_choice"),
])
def test_chat_refusals(srv, body, param):
    st, r, _ = srv.post("/v1/chat/completions", {**CHAT, **body})
    assert st == 400 and r["error"]["param"] == param, r


def test_neutral_values_accepted(srv):
    """The values that ask for nothing are accepted, through the client."""
    c = srv.client()
    r = c.chat.completions.create(model=NAME, messages=CHAT["messages"], max_tokens=2, response_format={"type": "text"},
                                  tools=[], tool_choice="none", modalities=["text"], store=False,
                                  metadata={"k": "v"}, user="u", parallel_tool_calls=True)
    assert r.choices[0].message.content is not None
    r = c.completions.create(model=NAME, prompt="Once", max_tokens=2, n=2, best_of=2, suffix="")
    assert len(r.choices) == 2


def test_unknown_fields_logged_once(model):
    s = Server(model)
    try:
        for _ in range(3):
            st, r, _ = s.post("/v1/completions", {"prompt": "Once", "max_tokens": 1, "guided_whatever": 1,
                                                  "x\nforged log line": 2})
            assert st == 200, r
    finally:
        assert s.stop() == 0
    assert s.log.count("unknown request field 'guided_whatever'") == 1, s.log
    assert "forged log line" not in s.log.replace("x?forged", "")  # the newline never reaches the log
    assert s.log.count("x?forged") == 1, s.log
