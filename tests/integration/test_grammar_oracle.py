"""The engine's grammar matcher (tests/oracle/grammar_match.c) held against
oracles no one here wrote, on random input:
- random regular grammars (literals, classes with multi-byte UTF-8,
  groups, alternation, every repetition, rule references) written both as
  GBNF and as a Python regular expression: the verdict on each string
  (whole match / viable prefix / no) equals the `regex` module's
  fullmatch, partial=True included;
- a recursive grammar (nested brackets) against a stack recognizer;
- the engine's JSON grammar against Python's `json` parser."""
import json
import random
import re
import subprocess

import pytest
import regex

from harness import TOOL, run_matcher


ALPHABET = ["a", "b", "c", "x", "\u00e9", "\u20ac", "\U0001F600", '"', "\\", "\n", "-", "]"]


def gbnf_char(c):
    esc = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "]": "\\]", "-": "\\-", "[": "\\[", "^": "\\^"}
    return esc.get(c, c)


class Gen:
    """Random expressions as (gbnf, regex, nullable, sampler)."""

    def __init__(self, rnd):
        self.r = rnd
        self.rules = []

    def literal(self):
        s = "".join(self.r.choice(ALPHABET) for _ in range(self.r.randint(1, 3)))
        return '"' + "".join(gbnf_char(c) for c in s) + '"', regex.escape(s), False, lambda: s

    def cls(self):
        chars = sorted(set(self.r.sample(ALPHABET, self.r.randint(1, 4))))
        parts, rx, pool = [], [], set(chars)
        if self.r.random() < 0.4:  # a range
            lo, hi = sorted([self.r.choice("abcx"), self.r.choice("abcx")])
            parts.append(f"{lo}-{hi}")
            rx.append(f"{lo}-{hi}")
            pool |= {chr(c) for c in range(ord(lo), ord(hi) + 1)}
        parts += [gbnf_char(c) for c in chars]
        rx += [regex.escape(c) if c not in "-]" else "\\" + c for c in chars]
        neg = self.r.random() < 0.3
        g = "[" + ("^" if neg else "") + "".join(parts) + "]"
        x = "[" + ("^" if neg else "") + "".join(rx) + "]"
        if neg:
            rest = [c for c in ALPHABET if c not in pool] or ["z"]
            return g, x, False, lambda: self.r.choice(rest)
        pool = sorted(pool)
        return g, x, False, lambda: self.r.choice(pool)

    def expr(self, depth):
        k = self.r.random() if depth < 4 else 0
        if k < 0.3:
            return self.literal() if self.r.random() < 0.6 else self.cls()
        if k < 0.45:
            return '.', '.', False, lambda: self.r.choice(ALPHABET)
        if k < 0.6:
            parts = [self.expr(depth + 1) for _ in range(self.r.randint(2, 3))]
            return (" ".join(p[0] for p in parts), "".join("(?:" + p[1] + ")" for p in parts),
                    all(p[2] for p in parts), lambda: "".join(p[3]() for p in parts))
        if k < 0.75:
            parts = [self.expr(depth + 1) for _ in range(self.r.randint(2, 3))]
            return ("( " + " | ".join(p[0] for p in parts) + " )", "(?:" + "|".join(p[1] for p in parts) + ")",
                    any(p[2] for p in parts), lambda: self.r.choice(parts)[3]())
        if k < 0.85:
            g, x, n, s = self.expr(depth + 1)
            name = f"r{len(self.rules)}"
            self.rules.append(f"{name} ::= {g}")
            return name, "(?:" + x + ")", n, s
        g, x, n, s = self.expr(depth + 1)
        ops = ["?", "{0,2}", "{2}", "{1,3}"] if n else ["*", "+", "?", "{2}", "{1,3}", "{2,}", "{0,2}"]
        op = self.r.choice(ops)
        lo, hi = {"*": (0, 3), "+": (1, 3), "?": (0, 1), "{2}": (2, 2), "{1,3}": (1, 3), "{2,}": (2, 4),
                  "{0,2}": (0, 2)}[op]
        return ("( " + g + " )" + op, "(?:" + x + ")" + op, n or lo == 0,
                lambda: "".join(s() for _ in range(self.r.randint(lo, hi))))


def expected(rx, s):
    try:
        t = s.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if regex.fullmatch(rx, t, flags=regex.DOTALL):
        return "full"
    m = regex.fullmatch(rx, t, flags=regex.DOTALL, partial=True)
    return "prefix" if m is not None else "no"


def mutate(r, s):
    s = list(s)
    for _ in range(r.randint(1, 2)):
        op = r.random()
        i = r.randint(0, len(s))
        if op < 0.4:
            s.insert(i, r.choice(ALPHABET))
        elif s and op < 0.7:
            del s[min(i, len(s) - 1)]
        elif s:
            s[min(i, len(s) - 1)] = r.choice(ALPHABET)
    return "".join(s)


@pytest.mark.parametrize("seed", range(6))
def test_random_regular_grammars(seed, tmp_path):
    """60 random grammars a seed, 40 strings each: positives, their
    prefixes, mutations and random strings."""
    r = random.Random(seed)
    n_full = n_prefix = n_no = 0
    for gi in range(60):
        gen = Gen(r)
        g, x, _, sample = gen.expr(0)
        text = "\n".join([f"root ::= {g}"] + gen.rules) + "\n"
        strings = []
        for _ in range(10):
            pos = sample()
            strings += [pos, pos[: r.randint(0, len(pos))], mutate(r, pos),
                        "".join(r.choice(ALPHABET) for _ in range(r.randint(0, 5)))]
        enc = [s.encode("utf-8") for s in strings]
        got = run_matcher(text, enc, tmp_path)
        for s, v in zip(enc, got):
            want = expected(x, s)
            assert v == want, f"grammar:\n{text}\nregex: {x}\nstring: {s!r}: ours {v}, regex {want}"
            n_full += v == "full"
            n_prefix += v == "prefix"
            n_no += v == "no"
    assert n_full > 100 and n_prefix > 50 and n_no > 100  # every verdict is exercised


def brackets(s):
    """Oracle for root ::= item*, item ::= "(" item* ")" | "[" item* "]" | [a-c]."""
    st = []
    for c in s:
        if c in "([":
            st.append(c)
        elif c in ")]":
            if not st or st.pop() != "(["[")]".index(c)]:
                return "no"
        elif c not in "abc":
            return "no"
    return "prefix" if st else "full"


def test_recursive_grammar(tmp_path):
    r = random.Random(5)
    g = 'root ::= item*\nitem ::= "(" item* ")" | "[" item* "]" | [a-c]\n'
    strings = ["".join(r.choice("()[]abcd") for _ in range(r.randint(0, 14))) for _ in range(3000)]
    strings += ["(" * 300 + "a" + ")" * 300, "[" * 300 + "]" * 299]
    got = run_matcher(g, [s.encode() for s in strings], tmp_path)
    for s, v in zip(strings, got):
        assert v == brackets(s), (s, v)


def rand_json(r, depth=0):
    k = r.random() if depth < 4 else r.random() * 0.6
    if k < 0.15:
        return r.choice([True, False, None])
    if k < 0.3:
        return r.choice([0, -1, 7, 12345678901234, 3.5, -0.25, 1e-7, 2.5e300])
    if k < 0.6:
        return "".join(r.choice(["a", "\u00e9", "\"", "\\", "\n", "\u0001", "\U0001F600", " ", "/"])
                       for _ in range(r.randint(0, 6)))
    if k < 0.8:
        return [rand_json(r, depth + 1) for _ in range(r.randint(0, 3))]
    return {rand_json(r, 9) if r.random() < 0 else f"k{i}": rand_json(r, depth + 1) for i in range(r.randint(0, 3))}


GAP = re.compile(r"(?: |\n[ \t]{0,20})?")  # llm/gbnf.h: a gap between JSON tokens


def gaps_ok(t):
    """Every whitespace run outside strings is a gap the grammar allows, and none is before or after the value."""
    if t[:1].isspace() or t[-1:].isspace():
        return False
    outside = re.sub(r'"(?:[^"\\]|\\.)*"', '""', t)
    return all(GAP.fullmatch(run) for run in re.findall(r"[ \t\r\n]+", outside))


def py_json(b):
    """What Python's json makes of b (NaN and Infinity refused, as JSON does); None when not JSON."""
    try:
        return [json.loads(b.decode("utf-8"), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))]
    except (ValueError, UnicodeDecodeError):
        return None


def json_ok(b, want_object):
    v = py_json(b)
    return v is not None and gaps_ok(b.decode()) and (isinstance(v[0], dict) or not want_object)


@pytest.mark.parametrize("root", ["json", "jsonobject"])
def test_json_grammar(root, tmp_path):
    """Valid JSON (json.dumps with several spacings, some of them more than a gap allows), each prefix of it, and
    mutations: "full" exactly when Python's json parses it (an object for jsonobject) and its whitespace keeps
    the rule of llm/gbnf.h (a gap is nothing, one space, or a line break and at most 20 spaces or tabs; nothing
    before or after the value); no prefix of such JSON is "no"."""
    r = random.Random(11)
    strings, prefixes = [], []
    for _ in range(400):
        v = rand_json(r)
        if root == "jsonobject" and not isinstance(v, dict):
            v = {"v": v}
        seps = r.choice([(",", ":"), (", ", ": "), (",", ": "), (" ,", " :  ")])
        t = json.dumps(v, ensure_ascii=r.random() < 0.5, separators=seps, indent=r.choice([None, None, 1, 2, 21, "\t"]))
        if r.random() < 0.1:
            t = r.choice([" ", "\n", "\r\n"]) + t if r.random() < 0.5 else t + r.choice([" ", "\n"])
        b = t.encode("utf-8")
        strings.append(b)
        if json_ok(b, root == "jsonobject"):
            prefixes += [b[:r.randint(0, len(b))] for _ in range(3)]
        m = bytearray(b)
        for _ in range(r.randint(1, 2)):
            i = r.randrange(len(m) or 1)
            m[i:i + 1] = r.choice([b"", b",", b"}", b"]", b"\"", b"0", b"-", b"e", b"\\", b"\x00", b"\xc3", b" ",
                                   b"\n", b"\t"])
        strings.append(bytes(m))
    got = run_matcher("@" + root, strings + prefixes, tmp_path)
    n_valid = n_spaced = 0
    for s, v in zip(strings, got):
        want = json_ok(s, root == "jsonobject")
        n_valid += want
        n_spaced += not want and py_json(s) is not None  # JSON Python takes that the gap rule refuses
        assert (v == "full") == want, (s, v)
    for s, v in zip(prefixes, got[len(strings):]):
        assert v != "no", (s, v)
    assert n_valid >= 200 and n_spaced >= 40, (n_valid, n_spaced)


def test_compile_errors(tmp_path):
    """Errors name the line, the column and the construct."""
    cases = {
        'root ::= "a" b\n': "rule 'b' is used but never defined",
        'root ::= root "a"\n': "rule 'root' is left-recursive",
        'root ::= x\nx ::= "a"? root\n': "left-recursive",
        'root ::= ("a"?)*\n': "left-recursive",
        'root ::= "a\n': "unterminated",
        'root ::= [z-a]\n': "reversed",
        'root ::= "a"{3,2}\n': "max below min",
        'root ::= "a"{99999}\n': "repetition count above",
        'root ::= "\\q"\n': "unknown escape",
        'other ::= "a"\n': "no rule named 'root'",
        'root ::= "a"\nroot ::= "b"\n': "defined twice",
        'root ::= ( "a" \n': "not closed",
        'root ::= "a" )\n': "')' without '('",
        'root ::= "a" @\n': "unexpected '@'",
        "root ::= " + "(" * 200 + '"a"' + ")" * 200 + "\n": "nested deeper",
        "\n\nroot = 'a'\n": "line 3, column 1",
    }
    for text, want in cases.items():
        gf = tmp_path / "bad.gbnf"
        gf.write_text(text)
        r = subprocess.run([str(TOOL), str(gf)], input="", capture_output=True, text=True, timeout=60)
        assert r.returncode == 2 and want in r.stdout, (text, r.stdout)
