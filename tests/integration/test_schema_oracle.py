"""llm-server's JSON Schema to grammar conversion (tests/oracle/
schema_grammar.c), its grammars run by the engine's matcher
(grammar_match), held against the `jsonschema` package on random input:
- integer and number bounds (inclusive, exclusive, negative, unbounded):
  for every numeral in a window around the bounds, the grammar accepts it
  exactly when jsonschema validates it;
- string patterns (random regular expressions, anchored or not):
  accepted => valid, and valid (with the escapes the grammar writes) =>
  accepted;
- random composite schemas (objects with required and optional
  properties, additionalProperties, arrays with bounds, enum, const,
  anyOf, $ref and recursion, nullable, formats): every accepted instance
  is valid; every valid instance in the grammar's canonical form (the
  schema's property order) is accepted;
- unsupported keywords are refused by name."""
import json
import random
import subprocess

import jsonschema
import pytest
import regex

from harness import BUILD, run_matcher


TOOL = BUILD / "tests" / "schema_grammar"


def grammar_of(schema):
    r = subprocess.run([str(TOOL)], input=json.dumps(schema), capture_output=True, text=True, timeout=60)
    if r.returncode:
        return None, r.stdout.strip()
    return r.stdout, None


def verdicts(schema, texts, tmp_path):
    g, err = grammar_of(schema)
    assert g is not None, (schema, err)
    return run_matcher(g, [t.encode() for t in texts], tmp_path)


def denull(s):
    """OpenAPI's nullable (which jsonschema does not know) as anyOf with null."""
    if isinstance(s, list):
        return [denull(x) for x in s]
    if not isinstance(s, dict):
        return s
    d = {k: denull(v) for k, v in s.items() if k != "nullable"}
    if s.get("nullable") is True:
        defs = {k: d.pop(k) for k in ("$defs",) if k in d}
        return {"anyOf": [d, {"type": "null"}], **defs}
    return d


def valid(schema, inst):
    fc = jsonschema.Draft202012Validator.FORMAT_CHECKER  # (FormatChecker() would mix in draft 3's time)
    return jsonschema.Draft202012Validator(denull(schema), format_checker=fc).is_valid(inst)


@pytest.mark.parametrize("seed", range(4))
def test_integer_bounds(seed, tmp_path):
    r = random.Random(seed)
    for _ in range(25):
        s = {"type": "integer"}
        lo, hi = sorted([r.randint(-1200, 1200), r.randint(-1200, 1200)])
        if r.random() < 0.8:
            s["exclusiveMinimum" if r.random() < 0.3 else "minimum"] = lo if r.random() < 0.8 else lo + 0.5
        if r.random() < 0.8:
            s["exclusiveMaximum" if r.random() < 0.3 else "maximum"] = hi
        texts = [str(n) for n in range(lo - 40, hi + 40)] + [str(r.randint(-10**6, 10**6)) for _ in range(50)]
        texts += ["-0", "01", "1.0", "1e2", "+5"]
        g, err = grammar_of(s)
        if g is None:
            assert "no integer satisfies" in err, (s, err)
            continue
        for t, v in zip(texts, run_matcher(g, [t.encode() for t in texts], tmp_path)):
            try:
                ok = valid(s, json.loads(t)) and t == str(json.loads(t)) and isinstance(json.loads(t), int)
            except ValueError:
                ok = False
            assert (v == "full") == ok, (s, t, v)


@pytest.mark.parametrize("seed", range(4))
def test_number_bounds(seed, tmp_path):
    r = random.Random(100 + seed)
    for _ in range(25):
        s = {"type": "number"}
        lo, hi = sorted([r.randint(-60, 60), r.randint(-60, 60)])
        if r.random() < 0.8:
            s["exclusiveMinimum" if r.random() < 0.4 else "minimum"] = lo
        if r.random() < 0.8:
            s["exclusiveMaximum" if r.random() < 0.4 else "maximum"] = hi
        texts = []
        for n in range(lo - 3, hi + 4):
            texts += [str(n), f"{n}.0", f"{n}.5", f"{n}.00", f"{n}.25", f"{n}.001"]
        texts += ["-0", "-0.0", "-0.5", "0.5", "1e1", "-1E-1"]
        g, err = grammar_of(s)
        if g is None:
            assert "no number satisfies" in err, (s, err)
            continue
        got = run_matcher(g, [t.encode() for t in texts], tmp_path)
        for t, v in zip(texts, got):
            if t.startswith("-") and float(t) == 0:
                assert v != "full" or valid(s, 0), (s, t, v)  # negative zero: accepted only where 0 is valid
                continue
            ok = ("e" not in t.lower() or len(s) == 1) and valid(s, json.loads(t))  # exponents only when unbounded
            assert (v == "full") == ok, (s, t, v)


# Regular expressions in the syntax text/schema.c takes, generated with a
# sampler of matching strings.
PCHARS = ["a", "b", "c", "1", "-", " ", "\u00e9", '"', "\\", "\n", "/"]


def rx_atom(r):
    k = r.random()
    if k < 0.4:
        c = r.choice(PCHARS)
        return (regex.escape(c) if c not in "\n" else "\\n"), lambda: c
    if k < 0.6:
        chars = sorted(set(r.sample(PCHARS, r.randint(1, 4))))
        body = "".join("\\" + c if c in "\\]-^" else ("\\n" if c == "\n" else c) for c in chars)
        if r.random() < 0.3:
            rest = [c for c in PCHARS if c not in chars] or ["z"]
            return "[^" + body + "]", lambda: r.choice(rest)
        return "[" + body + "]", lambda: r.choice(chars)
    if k < 0.75:
        cls, pool = r.choice([("\\d", "0123456789"), ("\\w", "abcXYZ_09"), ("\\s", " \t\n")])
        return cls, lambda: r.choice(pool)
    if k < 0.85:
        return ".", lambda: r.choice([c for c in PCHARS if c != "\n"])
    a, sa = rx_atom(r)
    b, sb = rx_atom(r)
    return f"(?:{a}|{b})" if r.random() < 0.5 else f"({a}{b})", (lambda: r.choice([sa, sb])()) if True else None


def rx_make(r):
    parts, samplers = [], []
    for _ in range(r.randint(1, 4)):
        a, s = rx_atom(r)
        q = r.choice(["", "", "*", "+", "?", "{2}", "{1,3}"])
        lo, hi = {"": (1, 1), "*": (0, 3), "+": (1, 3), "?": (0, 1), "{2}": (2, 2), "{1,3}": (1, 3)}[q]
        parts.append(a + q)
        samplers.append((s, lo, hi))
    a0, a1 = r.random() < 0.5, r.random() < 0.5
    pat = ("^" if a0 else "") + "".join(parts) + ("$" if a1 else "")

    def sample():
        body = "".join(s() for s, lo, hi in samplers for _ in range(r.randint(lo, hi)))
        pre = "" if a0 else "".join(r.choice(PCHARS) for _ in range(r.randint(0, 2)))
        post = "" if a1 else "".join(r.choice(PCHARS) for _ in range(r.randint(0, 2)))
        return pre + body + post
    return pat, sample


def dumps_like_grammar(s):
    """json.dumps, except the controls other than \\n \\t \\r (which the
    grammar cannot write) make the string unusable here."""
    if any(ord(c) < 0x20 and c not in "\n\t\r" for c in s):
        return None
    return json.dumps(s, ensure_ascii=False)


@pytest.mark.parametrize("seed", range(4))
def test_patterns(seed, tmp_path):
    r = random.Random(200 + seed)
    for _ in range(30):
        pat, sample = rx_make(r)
        schema = {"type": "string", "pattern": pat}
        strs = [sample() for _ in range(15)] + ["".join(r.choice(PCHARS) for _ in range(r.randint(0, 5)))
                                               for _ in range(15)]
        texts = [t for t in (dumps_like_grammar(s) for s in strs) if t is not None]
        g, err = grammar_of(schema)
        assert g is not None, (pat, err)
        got = run_matcher(g, [t.encode() for t in texts], tmp_path)
        ecma = pat[:-1] + "\\Z" if pat.endswith("$") else pat  # ECMA's $: the very end (Python's also before a final \n)
        for t, v in zip(texts, got):
            assert v != "full" or valid(schema, json.loads(t)), (pat, t, v)  # sound against jsonschema itself
            # \d \w \s: ASCII in ECMA-262, Unicode in Python; the grammar takes what both accept
            s = json.loads(t)
            ok = regex.search(ecma, s, flags=regex.ASCII) is not None and regex.search(ecma, s) is not None
            assert (v == "full") == ok, (pat, t, v)


# Random composite schemas and instances of them in canonical form.
def gen_schema(r, depth, defs):
    k = r.random() if depth < 3 else r.random() * 0.55
    if k < 0.12:
        return {"type": "string", "maxLength": r.randint(0, 6)}, lambda: "".join(r.choice("ab\u00e9\"\\ \n") for _ in range(r.randint(0, 3)))
    if k < 0.2:
        f = r.choice(["date", "uuid", "date-time", "time"])
        ex = {"date": "2024-02-28", "uuid": "123e4567-e89b-12d3-a456-426614174000",
              "date-time": "2024-12-31T23:59:59Z", "time": "08:30:00+01:00"}[f]
        return {"type": "string", "format": f}, lambda: ex
    if k < 0.28:
        lo = r.randint(-50, 50)
        return {"type": "integer", "minimum": lo, "maximum": lo + r.randint(0, 100)}, lambda: lo
    if k < 0.34:
        return {"type": "number"}, lambda: r.choice([0, -1.5, 2.25e10, 7])
    if k < 0.4:
        vals = r.sample(["red", "green", 3, None, True, "a\"b"], r.randint(1, 4))
        return {"enum": vals}, lambda: r.choice(vals)
    if k < 0.45:
        return {"const": "fixed"}, lambda: "fixed"
    if k < 0.5:
        return {"type": "boolean"}, lambda: r.random() < 0.5
    if k < 0.55:
        return {"type": ["string", "null"], "maxLength": 3}, lambda: None if r.random() < 0.5 else "xy"
    if k < 0.7:
        n = r.randint(0, 4)
        props, samplers = {}, {}
        for i in range(n):
            sub, samp = gen_schema(r, depth + 1, defs)
            props[f"p{i}"] = sub
            samplers[f"p{i}"] = samp
        req = [p for p in props if r.random() < 0.6]
        s = {"type": "object", "properties": props, "required": req}
        extra = r.random() < 0.2
        if extra:
            s["additionalProperties"] = {"type": "integer", "minimum": 0, "maximum": 9}
        elif r.random() < 0.5:
            s["additionalProperties"] = False

        def samp():
            d = {p: samplers[p]() for p in props if p in req or r.random() < 0.5}
            if extra and r.random() < 0.5:
                d["zz"] = 5
            return d
        return s, samp
    if k < 0.82:
        sub, samp = gen_schema(r, depth + 1, defs)
        lo = r.randint(0, 2)
        hi = lo + r.randint(0, 3)
        return ({"type": "array", "items": sub, "minItems": lo, "maxItems": hi},
                lambda: [samp() for _ in range(r.randint(lo, hi))])
    if k < 0.9:
        a, sa = gen_schema(r, depth + 1, defs)
        b, sb = gen_schema(r, depth + 1, defs)
        return {"anyOf": [a, b]}, lambda: r.choice([sa, sb])()
    if k < 0.95:
        name = f"d{len(defs)}"
        sub, samp = gen_schema(r, depth + 1, defs)
        defs[name] = sub
        return {"$ref": f"#/$defs/{name}"}, samp
    sub, samp = gen_schema(r, depth + 1, defs)
    if "$ref" in sub or "anyOf" in sub or "enum" in sub or "const" in sub:
        return sub, samp
    return {**sub, "nullable": True}, lambda: None if r.random() < 0.3 else samp()


def mutate(r, inst):
    t = json.dumps(inst, ensure_ascii=False)
    i = r.randrange(len(t) + 1)
    return t[:i] + r.choice(["", "1", "\"x\"", ",", "null", "-", "}", "]"]) + t[i + r.randint(0, 2):]


@pytest.mark.parametrize("seed", range(5))
def test_composite_schemas(seed, tmp_path):
    r = random.Random(300 + seed)
    n_valid = n_accepted = 0
    for _ in range(30):
        defs = {}
        schema, samp = gen_schema(r, 0, defs)
        if defs:
            schema = {**schema, "$defs": defs} if "$ref" not in schema else {"anyOf": [schema], "$defs": defs}
        insts = [samp() for _ in range(8)]
        # canonical texts (the grammar's escapes) first: those must be accepted when valid;
        # then \u-escaped forms and mutations, which must only never be accepted when invalid
        texts = [json.dumps(i, ensure_ascii=False, separators=r.choice([(",", ":"), (", ", ": ")])) for i in insts]
        texts += [json.dumps(i) for i in insts[:3]] + [mutate(r, i) for i in insts[:4]]
        g, err = grammar_of(schema)
        assert g is not None, (schema, err)
        got = run_matcher(g, [t.encode() for t in texts], tmp_path)
        for t, v in zip(texts, got):
            try:
                inst = json.loads(t)
                ok = valid(schema, inst)
            except ValueError:
                ok = False
            if v == "full":
                assert ok, ("accepted but invalid", schema, t)
                n_accepted += 1
            n_valid += ok
            if ok and t in texts[:len(insts)] and not any(ord(c) < 0x20 and c not in "\n\t\r" for c in t):
                assert v == "full", ("valid canonical instance refused", schema, t, v)
    assert n_accepted > 100


@pytest.mark.parametrize("schema,word", [
    ({"type": "string", "uniqueItems": True}, "uniqueItems"),
    ({"type": "object", "patternProperties": {}}, "patternProperties"),
    ({"not": {"type": "string"}}, "not"),
    ({"type": "string", "format": "email"}, "email"),
    ({"type": "string", "pattern": "(?=a)b"}, "lookaround"),
    ({"type": "string", "pattern": "\\bword"}, "\\b"),
    ({"type": "array", "prefixItems": [{}]}, "prefixItems"),
    ({"$ref": "https://example.com/s.json"}, "$ref"),
    ({"allOf": [{}, {}]}, "allOf"),
    ({"type": "number", "minimum": 0.5}, "whole numbers"),
    ({"type": "object", "properties": {"a": {}}, "required": ["b"]}, "'b'"),
    ({"type": "string", "pattern": "a", "maxLength": 3}, "pattern"),
    ({"type": "frob"}, "frob"),
    ({"type": "object", "properties": {"a": {}}, "required": ["a", "a"]}, "more names"),
    ({"type": ["string", "string"]}, "twice"),
    ({"$ref": "#/$defs/"}, "$ref"),
    ({"type": "string", "pattern": "^\\u+041$"}, "\\u"),
    ({"type": "string", "pattern": "^[^a-\\u-001]$"}, "\\u"),
    ({"type": "string", "pattern": "a{3,2}"}, "repetition"),
    ({"type": "string", "pattern": "a{99999}"}, "repetition"),
    ({"type": "string", "pattern": "^\\ud800$"}, "no character"),
    ({"type": "string", "pattern": "^x\\ude00$"}, "no character"),
    ({"type": "string", "pattern": "^[\\ud800-\\udfff]+$"}, "no character"),
    # a pair: one character to ECMA-262 without the u flag, two surrogates to Python's re
    ({"type": "string", "pattern": "^\\ud83d\\ude00$"}, "no character"),
])
def test_refused(schema, word):
    g, err = grammar_of(schema)
    assert g is None and word in err, (schema, err)


def test_surrogate_range_ends(tmp_path):
    """A surrogate \\u escape may end a class range or stand in a negated
    class ([^\\ud800-\\udfff] is common): the class keeps its characters and
    drops the surrogates, and what the grammar accepts is what jsonschema
    (Python's re) accepts. (A class of surrogates alone is refused above:
    compiled, it would let a request reach an element nothing matches and
    fail mid-generation with no token allowed.)"""
    texts = [json.dumps(c, ensure_ascii=False) for c in ("a", "\u00ed", "\ud7ff", "\ue000", "\U0001F600", "ab")]
    for pat in ("^[^\\ud800-\\udfff]$", "^[\\u0020-\\udfff]$", "^[\\ud800-\\uffff]$", "^[^\\ud83d]$"):
        schema = {"type": "string", "pattern": pat}
        got = [v == "full" for v in verdicts(schema, texts, tmp_path)]
        want = [valid(schema, json.loads(t)) for t in texts]
        assert got == want, (pat, got, want)
        assert any(got) and not all(got), (pat, got)  # each pattern takes some of these and refuses some
