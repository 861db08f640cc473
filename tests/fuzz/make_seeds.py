#!/usr/bin/env python3
"""Writes the fuzzer's seed corpus: small valid GGUF files (every metadata
type, a SentencePiece and a byte-level BPE vocab, tensors) and the
malformed cases kept as regression inputs. Usage: make_seeds.py DIR"""
import struct
import sys
from pathlib import Path

STR, ARR, U32, I32, F32, BOOL, U8, U64, F64 = 8, 9, 4, 5, 6, 7, 0, 10, 12


def s(x):
    b = x.encode() if isinstance(x, str) else x
    return struct.pack("<Q", len(b)) + b


def kv(key, t, payload):
    return s(key) + struct.pack("<I", t) + payload


def arr(t, items, fmt=None):
    body = b"".join(s(i) for i in items) if t == STR else b"".join(struct.pack(fmt, i) for i in items)
    return struct.pack("<IQ", t, len(items)) + body


def gguf(kvs, tensors=(), version=3):
    head = struct.pack("<IIQQ", 0x46554747, version, len(tensors), len(kvs)) + b"".join(kvs)
    info, data = b"", b""
    for name, ne, ttype, blob in tensors:
        info += s(name) + struct.pack("<I", len(ne)) + b"".join(struct.pack("<Q", n) for n in ne)
        info += struct.pack("<IQ", ttype, len(data))
        data += blob + b"\0" * ((32 - len(blob) % 32) % 32)
    out = head + info
    out += b"\0" * ((32 - len(out) % 32) % 32)
    return out + data


def spm():
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581", "\u2581H", "ello", "\u2581Hello"]
    types = [2, 3, 3] + [6] * 256 + [1] * 4
    return [kv("tokenizer.ggml.model", STR, s("llama")), kv("tokenizer.ggml.tokens", ARR, arr(STR, toks)),
            kv("tokenizer.ggml.scores", ARR, arr(F32, [float(-i) for i in range(len(toks))], "<f")),
            kv("tokenizer.ggml.token_type", ARR, arr(I32, types, "<i"))]


def bpe(pre="gpt-2"):
    byte = [chr(b) if 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255 else None for b in range(256)]
    n = 256
    for b in range(256):
        if byte[b] is None:
            byte[b] = chr(n)
            n += 1
    toks = byte + ["He", "ll", "Hell", "\u0120w", "<|end|>"]
    merges = ["H e", "l l", "He ll", "\u0120 w"]
    return [kv("tokenizer.ggml.model", STR, s("gpt2")), kv("tokenizer.ggml.pre", STR, s(pre)),
            kv("tokenizer.ggml.tokens", ARR, arr(STR, toks)),
            kv("tokenizer.ggml.token_type", ARR, arr(I32, [1] * (len(toks) - 1) + [3], "<i")),
            kv("tokenizer.ggml.merges", ARR, arr(STR, merges)),
            kv("tokenizer.ggml.eos_token_id", U32, struct.pack("<I", len(toks) - 1))]


def main(d):
    d = Path(d)
    d.mkdir(parents=True, exist_ok=True)
    scalars = [kv("a.u8", U8, b"\x07"), kv("a.bool", BOOL, b"\x01"), kv("a.f64", F64, struct.pack("<d", 2.5)),
               kv("a.u64", U64, struct.pack("<Q", 9)), kv("general.alignment", U32, struct.pack("<I", 32)),
               kv("a.nested", ARR, struct.pack("<IQ", ARR, 1) + arr(U32, [1, 2], "<I"))]
    q8 = struct.pack("<e", 0.5) + bytes(range(32))
    tensors = [("w.q8", [32, 2], 8, q8 * 2), ("w.f32", [3], 0, struct.pack("<3f", 1, 2, 3))]
    seeds = {
        "scalars.gguf": gguf(scalars, tensors),
        "spm.gguf": gguf(spm()),
        "bpe.gguf": gguf(bpe()),
        "bpe-llama3.gguf": gguf(bpe("llama-bpe")),
        "bpe-qwen2.gguf": gguf(bpe("qwen2"), version=2),
        # regression cases: each must be rejected with a message
        "bad-count.gguf": gguf(spm())[:16] + struct.pack("<Q", 1 << 62),
        "bad-strlen.gguf": gguf([kv("x", STR, struct.pack("<Q", 1 << 63))]),
        "bad-array.gguf": gguf([kv("x", ARR, struct.pack("<IQ", U32, 1 << 61))]),
        "bad-tensor.gguf": gguf([], [("t", [32, 1 << 40], 8, q8)]),
        "bad-merges.gguf": gguf(bpe()[:4] + [kv("tokenizer.ggml.merges", ARR, arr(STR, ["nospace"]))]),
    }
    for name, blob in seeds.items():
        (d / name).write_bytes(blob)


if __name__ == "__main__":
    main(sys.argv[1])
