"""What we ship, held to readers we did not write: every YAML file (and the
chart as rendered) through yaml.v3 - the decoder kustomize, Flux and Helm's
Go tooling use, which refuses duplicate keys PyYAML takes silently - and
every Dockerfile to the build's own list of what its image ships (`make
image-files IMAGE=x`), with a runtime package for each shared library
those files need (readelf's NEEDED, mapped to packages by dpkg)."""
import re
import subprocess

import pytest

from harness import BUILD, ROOT, render


STRICT = BUILD / "bin" / "yaml-strict"
CHART = ROOT / "charts" / "llm-operator"
SHIPPED = sorted([*ROOT.glob("manifests/**/*.yaml"), *CHART.glob("crds/*.yaml"), CHART / "values.yaml",
                  CHART / "Chart.yaml"])
# shared libraries the base images carry (glibc, the compiler's runtime; CUDA's own in nvidia/cuda runtime)
# (and the sanitizers' runtimes, in make asan/tsan's builds: never shipped)
BASE = re.compile(r"^(libc|libm|libpthread|libdl|librt|ld-linux-x86-64|libgcc_s|libstdc\+\+)\.so|^libcublas(Lt)?\.so"
                  r"|^lib(a|ub|t|l)san\.so")
NOT_DPKG = {"libnccl.so.2": "libnccl2"}  # NVIDIA's apt repository: not installed through dpkg here
# the same library under the CUDA images' Ubuntu 24.04 name, where Debian 12 (here, and the other images) has
# another version (the t64 suffix is dropped apart)
NOBLE_NAMES = {"libhiredis1.1.0": "libhiredis0.14"}


def strict(*args, stdin=None):
    if not STRICT.exists():
        pytest.skip("build/bin/yaml-strict missing (needs golang-go and golang-gopkg-yaml.v3-dev)")
    return subprocess.run([str(STRICT), *map(str, args)], input=stdin, capture_output=True, text=True, timeout=60)


def test_yaml_strict_catches_duplicates():
    """The check can fail: a duplicated key (as engine.backend once was in the CRD) is refused, naming it."""
    r = strict("-", stdin="spec:\n  engine:\n    backend: auto\n    threads: 1\n    backend: cpu\n")
    assert r.returncode == 1 and 'mapping key "backend" already defined at line 3' in r.stderr, r.stderr


def test_shipped_yaml_is_strict():
    r = strict(*SHIPPED)
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("sets", [[], ["--set", "serviceMonitor.enabled=true", "--set", "podMonitor.enabled=true",
                                       "--set", "prometheusRule.enabled=true", "--set", "grafanaDashboard.enabled=true"]])
def test_rendered_chart_is_strict(sets):
    r = strict("-", stdin=render("-n", "llm-system", *sets))
    assert r.returncode == 0, r.stderr


def stages(dockerfile):
    """[(FROM line, [instructions])] with continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", dockerfile.read_text())
    out = []
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("FROM "):
            out.append((line, []))
        elif out:
            out[-1][1].append(line)
    return out


def image_files(name):
    r = subprocess.run(["make", "-s", "--no-print-directory", "image-files", f"IMAGE={name}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout.split()


def package_of(soname):
    if soname in NOT_DPKG:
        return NOT_DPKG[soname]
    r = subprocess.run(["dpkg", "-S", f"*/{soname}"], capture_output=True, text=True)
    if r.returncode:
        pytest.skip(f"dpkg does not know {soname} here")
    return r.stdout.split(":")[0]


def needed(path):
    r = subprocess.run(["readelf", "-d", str(path)], capture_output=True, text=True, check=True)
    return re.findall(r"\(NEEDED\).*\[(.+)\]", r.stdout)


@pytest.mark.parametrize("dockerfile", sorted((ROOT / "docker").glob("*.Dockerfile")), ids=lambda p: p.stem)
def test_dockerfile_ships_what_it_needs(dockerfile):
    name = dockerfile.name.removesuffix(".Dockerfile")
    files = image_files(name)
    assert files, f"the Makefile lists nothing for IMAGE={name}"
    (build_from, build), (run_from, run) = stages(dockerfile)[0], stages(dockerfile)[-1]
    assert "AS build" in build_from
    assert f"RUN make image IMAGE={name}" in build, f"{dockerfile.name} does not build its image's file list"
    assert "COPY --from=build /src/build/image/ /usr/local/" in run, f"{dockerfile.name} does not copy the staged files"
    entry = next(i for i in run if i.startswith("ENTRYPOINT"))
    binary = re.search(r'"/usr/local/(bin/[^"]+)"', entry).group(1)
    assert binary in files, f"{dockerfile.name}: ENTRYPOINT {binary} is not among {files}"
    if "cuda" in run_from or any("llm-server" in f for f in files):
        # llm-server's cuda backend is the plugin at ../lib: a CUDA image without it cannot run on a GPU
        assert ("lib/libllm_cuda.so" in files) == ("cuda" in run_from), (name, files)
    install = next((i for i in run if "apt-get install" in i), "")
    packages = {NOBLE_NAMES.get(p, p).removesuffix("t64") for p in install.split() if re.match(r"^lib[\w.+-]+$", p)}
    missing = []
    for f in files:
        path = BUILD / f
        if not path.exists():
            assert f.endswith("libllm_cuda.so"), f"{path} not built"
            continue  # built only where nvcc is
        for so in needed(path):
            if not BASE.match(so) and package_of(so).removesuffix("t64") not in packages:
                missing.append(f"{f} needs {so} ({package_of(so)})")
    assert not missing, f"{dockerfile.name}'s runtime stage lacks: {missing}"


def engine_symbols():
    """Every function libllm.a defines that the common library does not:
    the engine's own."""
    def defined(path):
        out = subprocess.run(["nm", "--defined-only", str(path)], capture_output=True, text=True, check=True).stdout
        return {ln.split()[-1] for ln in out.splitlines() if re.match(r"^[0-9a-f]+ T ", ln)}
    return defined(BUILD / "libllm.a") - defined(BUILD / "libllmcommon.a")


@pytest.mark.parametrize("prog", ["llm-controller", "llm-router"])
def test_operator_programs_link_no_engine_code(prog):
    """llm-controller and llm-router are built from the Kubernetes and the
    common libraries: none of the engine's functions is in them."""
    engine = engine_symbols()
    assert len(engine) > 100, "libllm.a has no engine in it?"
    out = subprocess.run(["nm", "--defined-only", str(BUILD / "bin" / prog)], capture_output=True, text=True,
                         check=True).stdout
    mine = {ln.split()[-1] for ln in out.splitlines() if re.match(r"^[0-9a-f]+ [Tt] ", ln)}
    assert not (mine & engine), sorted(mine & engine)[:20]
    assert "llm_errf" in mine  # the common library is (a check that reads symbols at all)
