"""The hand-written BPE pre-tokenizers against the reference regular
expressions (as llama.cpp and the original tokenizers define them), run by
the `regex` module, on llama.cpp's tokenizer test strings plus extra mixed
Unicode text. Covers llama3 and qwen2, whose vocab files are not in
../shared."""

import pytest
import regex

from harness import SHARED, run, tool


GPT2 = r"""'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
LLAMA3 = (r"""(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"""
          r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
QWEN2 = LLAMA3.replace(r"\p{N}{1,3}", r"\p{N}")

EXTRA = [
    "Hello, world! It's 2024-11-30 and I'll pay $1234.56 for 7 apples.\n\n\tDone.  ",
    "  leading and trailing spaces   ",
    "mixed\r\nline\rendings\n\n\n and\u00a0nbsp\u3000ideographic",
    "ÀÉÎÕÜ ñ ß ø Ω д 中文字符 日本語 한국어 १२३ ٣٤٥ Ⅻ ½",
    "emoji 🦙🦙 and symbols ©®™ ±×÷ → ← «quotes» „more“",
    "WE'LL SEE THEY'RE HERE, YOU'VE I'D 'S 'T",
    "code: if (a<=b) { return x->y[3]; } // comment\n\t\tfoo_bar = 0x1F;",
    "numbers 1 12 123 1234 12345 123456 3.14159 1e-10 ١٢٣٤",
    "'''''' ''' '' ' s't 're",
    "\n \n  \n   x",
]


def split_ref(pattern, text):
    return [m.group(0) for m in regex.finditer(pattern, text)]


def split_starcoder(text):
    out = []
    for part in regex.split(r"(\p{N})", text):
        if regex.fullmatch(r"\p{N}", part):
            out.append(part)
        elif part:
            out.extend(split_ref(GPT2, part))
    return out


def texts():
    inp = SHARED / "testdata/tokenizer/ggml-vocab-gpt-2.gguf.inp"
    base = []
    if inp.exists():
        base = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")
        if base and base[-1] == "":
            base.pop()
    return base + EXTRA


def split_ours(model, text, tmp_path):
    f = tmp_path / "in.txt"
    f.write_bytes(text.encode("utf-8"))
    out = run(tool("llm-tokenize"), "-m", model, "--words", "--file", f).stdout.split()
    return [bytes.fromhex(w).decode("utf-8") for w in out]


@pytest.mark.parametrize("shape,ref", [
    ("tiny", lambda t: split_ref(GPT2, t)),
    ("tiny-llama3", lambda t: split_ref(LLAMA3, t)),
    ("tiny-qwen2", lambda t: split_ref(QWEN2, t)),
    ("tiny-starcoder", split_starcoder),
])
def test_split_matches_reference_regex(models, tmp_path, shape, ref):
    model = models(shape)
    checked = 0
    for text in texts():
        assert split_ours(model, text, tmp_path) == ref(text), repr(text)
        checked += 1
    assert checked >= len(EXTRA)
