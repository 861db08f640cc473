#!/usr/bin/env python3
"""layers.py - holds the include directions of ../shared/docs/architecture.md.

Every `#include "..."` in a library or program is resolved as the compiler
would (the including file's folder first, then the include paths) and the
header's layer must be one the file's layer may use:

    tools, server -> engine -> text -> common      tools, server -> net
    router, controller -> kube -> net -> common    testkit -> engine
    the engine reaches kernels/ only through its CUDA backend

Exit status 1 with one line per wrong include (file:line, the header, the
rule). Run by `make lint` (and so by `make test`)."""
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]

# where each layer's headers are found, in search order
INCLUDE_DIRS = [
    ("common", "common/include"), ("text", "text/include"), ("text", "text"), ("net", "net"), ("kube", "kube"),
    ("engine", "engine/include"), ("engine-private", "engine/model"), ("engine-private", "engine/compute"),
    ("engine-private", "engine/constrain"), ("engine-private", "engine/serve"), ("engine-private", "engine/backend"),
    ("engine-private", "engine/backend/cpu"),
    ("testkit", "testkit/include"), ("server", "server"), ("router", "router"), ("controller", "controller"),
    ("tools", "tools"), ("kernels", "kernels"),
]
# what each layer's sources may include
ALLOWED = {
    "common": {"common"},
    "text": {"text", "common"},
    "net": {"net", "common"},
    "kube": {"kube", "net", "common"},
    "engine": {"engine", "engine-private", "text", "common"},
    "testkit": {"testkit", "engine", "text", "common"},
    "server": {"server", "engine", "text", "net", "common"},
    "router": {"router", "kube", "net", "common"},
    "controller": {"controller", "kube", "net", "common"},
    "tools": {"tools", "engine", "text", "testkit", "net", "common"},
}
RULES = {
    "common": "common/ uses nothing but itself",
    "text": "text/ knows no engine, no HTTP and no Kubernetes",
    "net": "net/ is plain HTTP over common/",
    "kube": "kube/ uses net/ and common/ only",
    "engine": "the engine uses text/ and common/, never the server, net/ or kube/",
    "testkit": "the testkit builds on the engine's public headers",
    "server": "llm-server uses the engine's public headers, text/, net/ and common/",
    "router": "llm-router links kube/, net/ and common/: no engine, text or server header",
    "controller": "llm-controller links kube/, net/ and common/: no engine, text or server header",
    "tools": "the tools use the engine's public headers, text/, the testkit, net/ (llm-fetch) and common/",
}
# the one engine file that may reach the CUDA kernels
KERNEL_USERS = {"engine/backend/cuda/backend_cuda.c", "engine/backend/cuda/cuda_impl.h"}


def layer_of(rel):
    top = rel.split("/")[0]
    return top if top in ALLOWED else None


def resolve(src, name):
    here = (ROOT / src).parent / name
    if here.is_file():
        return layer_of(str(here.resolve().relative_to(ROOT))) or "?", str(here.relative_to(ROOT))
    for layer, d in INCLUDE_DIRS:
        p = ROOT / d / name
        if p.is_file():
            return layer, str(p.relative_to(ROOT))
    return None, None


def check(paths):
    bad = []
    for src in paths:
        layer = layer_of(src)
        if layer is None:
            continue
        for n, line in enumerate((ROOT / src).read_text(errors="replace").splitlines(), 1):
            m = re.match(r'\s*#\s*include\s+"([^"]+)"', line)
            if not m:
                continue
            got, path = resolve(src, m.group(1))
            if got is None:
                bad.append(f"{src}:{n}: \"{m.group(1)}\" is in no library's include path")
            elif got == "kernels":
                if src not in KERNEL_USERS:
                    bad.append(f"{src}:{n}: {path}: the engine reaches kernels/ only through engine/backend/cuda/backend_cuda.c")
            elif got not in ALLOWED[layer]:
                bad.append(f"{src}:{n}: {path} ({got}): {RULES[layer]}")
    return bad


def main(argv):
    paths = argv or sorted(str(p.relative_to(ROOT)) for d in ALLOWED for p in (ROOT / d).rglob("*.[ch]"))
    bad = check(paths)
    for b in bad:
        print("lint:", b)
    print(f"lint: layers: {len(paths)} files, {len(bad)} wrong includes")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
