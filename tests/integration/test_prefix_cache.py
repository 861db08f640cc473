"""The prefix cache changes no answer, through llm-server and the official
`openai` client: a growing multi-turn chat served with the cache gives, turn
by turn, the same greedy text and logprobs as a server without it answering
each turn's whole history alone; the `prefix_cache` key turns it off; and
tenants (API keys, cache_salt) do not share cached prefixes."""

from harness import NAME, Server, metric


# Six turns whose history passes 600 prompt tokens on the synthetic
# vocabulary (about two tokens per character of this text).
TURNS = [
    "Tell me a story about a lighthouse keeper.",
    "Describe the keeper's morning on the stairs.",
    "A small boat runs aground in a gale. Who is aboard?",
    "What do the strangers learn of the light?",
    "The supply ship is a month late. What now?",
    "End it years later, when the keeper returns.",
]


def plain(text):
    """The answer as the history carries it: a random-weight model's text
    has stray bytes (U+FFFD) and long pieces that would re-tokenize to many
    tokens, so printable ASCII, cut to 80 characters."""
    return "".join(ch for ch in text if ch.isascii() and ch.isprintable())[:80]


def ask(client, msgs):
    r = client.chat.completions.create(model=NAME, messages=msgs, max_tokens=16, temperature=0, logprobs=True,
                                       top_logprobs=2)
    ch = r.choices[0]
    lps = [(t.token, t.logprob, [(a.token, a.logprob) for a in t.top_logprobs]) for t in ch.logprobs.content]
    return ch.message.content, ch.finish_reason, lps, r.usage


def test_multi_turn_chat_equals_fresh(models):
    """Six turns on llama-110m (seeded random weights, 1024 context, block
    16): the cached server's answers and logprobs equal, bit for bit as
    JSON carries them, a no-cache server's answering each history alone;
    later turns are served mostly from the cache."""
    model = models("llama-110m", "Q8_0")
    cached, fresh = Server(model), Server(model, "--prefix_cache", "false")
    try:
        a, b = cached.client(), fresh.client()
        msgs = [{"role": "system", "content": "You are a patient storyteller."}]
        hits, prompts = [], []
        for i, turn in enumerate(TURNS):
            msgs.append({"role": "user", "content": turn})
            got, want = ask(a, msgs), ask(b, msgs)
            assert got[:3] == want[:3], f"turn {i + 1}: the cached server's answer differs"
            assert got[3].prompt_tokens == want[3].prompt_tokens
            assert want[3].prompt_tokens_details.cached_tokens == 0
            hits.append(got[3].prompt_tokens_details.cached_tokens)
            prompts.append(got[3].prompt_tokens)
            msgs.append({"role": "assistant", "content": plain(got[0])})
        assert got[3].prompt_tokens > 600, got[3].prompt_tokens
        # from turn 2 on, every whole block of the previous turn's prompt (a
        # prefix of this one) comes from the cache, including the blocks that
        # turn added after its own hit
        assert all(h >= p // 16 * 16 for h, p in zip(hits[1:], prompts)), (hits, prompts)
        assert metric(fresh.metrics(), "llm_prefix_cache_hits_total") == 0
        assert metric(cached.metrics(), "llm_prefix_cache_hits_total") == sum(hits)
    finally:
        assert cached.stop() == 0
        assert fresh.stop() == 0


def test_prefix_cache_key(tmp_path, models):
    """prefix_cache: false (flag or YAML) serves the same prompt twice with
    nothing cached; a value other than true/false is refused at start,
    naming the key."""
    model = models("tiny", "Q8_0")
    cfg = tmp_path / "c.yaml"
    cfg.write_text("prefix_cache: false\n")
    for args in (["--prefix_cache", "false"], ["--config", cfg]):
        s = Server(model, *args)
        try:
            c = s.client()
            prompt = "the cat sat on the mat " * 12
            for _ in range(2):
                r = c.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0)
                assert r.usage.prompt_tokens_details.cached_tokens == 0
            assert metric(s.metrics(), "llm_prefix_cache_hits_total") == 0
        finally:
            assert s.stop() == 0
    on = Server(model)
    try:
        c = on.client()
        for _ in range(2):
            r = c.completions.create(model=NAME, prompt=prompt, max_tokens=2, temperature=0)
        assert r.usage.prompt_tokens_details.cached_tokens > 0
    finally:
        assert on.stop() == 0
    bad = Server(model, "--prefix_cache", "maybe", wait=False)
    assert bad.proc.wait(30) == 2
    err = bad.proc.stderr.read()
    assert "prefix_cache" in err and "'maybe' is not true or false" in err, err
    bad.proc.stdout.close()
    bad.proc.stderr.close()


def test_cache_partitions(models):
    """With API keys each key has its own prefix cache (no tenant can learn
    from usage.cached_tokens what another sent), and a cache_salt field
    partitions further; the answers are the same whatever the partition."""
    model = models("tiny", "Q8_0")
    s = Server(model, env={"LLM_SERVER_API_KEYS": "key-a,key-b"})
    try:
        a, b = s.client("key-a"), s.client("key-b")
        prompt = "the cat sat on the mat and looked at the dog " * 6

        def ask(c, **kw):
            r = c.completions.create(model=NAME, prompt=prompt, max_tokens=3, temperature=0, **kw)
            return r.choices[0].text, r.usage.prompt_tokens_details.cached_tokens
        first = ask(a)
        assert first[1] == 0
        again = ask(a)
        assert again[0] == first[0] and again[1] > 0  # the same tenant hits
        other = ask(b)
        assert other == (first[0], 0)  # another key: nothing cached for it
        salted = ask(a, extra_body={"cache_salt": "project-1"})
        assert salted == (first[0], 0)
        assert ask(a, extra_body={"cache_salt": "project-1"})[1] > 0
        st, text, _ = s.request("POST", "/v1/completions", {"prompt": "x", "cache_salt": 5},
                                headers={"Content-Type": "application/json", "Authorization": "Bearer key-a"})
        assert st == 400 and "cache_salt" in text
    finally:
        assert s.stop() == 0
