"""The OCI archives `make images` builds (docker/oci-image.sh: a debootstrap
root committed by buildah), run as a container runtime would run them - but
without one, since the OCI runtimes are refused here: each archive is read
through its index, manifest and config, its layers unpacked into a folder,
and its configured entrypoint started there with chroot as its configured
user, with /proc, the usual /dev nodes and nothing else of this machine
(the network is the host's, as with hostNetwork). So a library missing from
an image, a package list gone short, a wrong USER or ENTRYPOINT fails here.

make test builds the archives first where it can (root, a Debian mirror
reachable); elsewhere, or when an archive is older than the programs it
ships, these skip and say so (`make images-test` builds and runs them)."""
import contextlib
import json
import re
import os
import shutil
import signal
import stat
import subprocess
import tarfile

import pytest

from harness import (BUILD, NAME, ROOT, STORIES, Cluster, Endpoint, Server, failed_detail, free_port, http_code,
                     tool, wait_for)

OCI = BUILD / "oci"
DEV_NODES = ("null", "zero", "random", "urandom")
# what each image ships, and so must start in its root
PROGRAMS = {"server": ["llm-server", "llm-router", "llm-fetch"], "server-cuda": ["llm-server", "llm-router"],
            "router": ["llm-router"], "controller": ["llm-controller"]}


def tag(name):
    """The name:tag make images gives the image (the Makefile's image_tag, no REGISTRY)."""
    env = {k: v for k, v in os.environ.items() if k != "REGISTRY"}
    r = subprocess.run(["make", "-s", "--no-print-directory", "image-tag", f"IMAGE={name}"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60, check=True, env=env)
    return r.stdout.strip()


def archive(name):
    """llm-NAME's archive (named after its tag), built after the programs it ships, or a skip."""
    path = OCI / (tag(name).replace(":", "-") + ".tar")
    if not path.exists():
        pytest.skip(f"{path} not built (make images-test builds the images and runs these tests)")
    older = [p for p in PROGRAMS[name] if path.stat().st_mtime < os.stat(tool(p)).st_mtime]
    if older:
        pytest.skip(f"{path} is older than {older} (make images rebuilds it)")
    if os.geteuid() != 0 or subprocess.run(["unshare", "--mount", "--pid", "--fork", "true"]).returncode:
        pytest.skip("the entrypoints run as root in namespaces of their own (unshare), which this machine refuses")
    return path


def unpack(name, into):
    """(root folder, OCI config) of llm-NAME's archive, unpacked under into."""
    path = archive(name)
    oci, root = into / "oci", into / "root"
    oci.mkdir(parents=True)
    root.mkdir()
    with tarfile.open(path) as t:
        t.extractall(oci, filter="data")
    def blob(digest):  # (a digest is a path here: one out of the folder is refused)
        assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest), digest
        return oci / "blobs" / digest.replace(":", "/")
    index = json.loads((oci / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == [tag(name)], index
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    assert config["os"] == "linux" and config["architecture"] == "amd64", config
    for layer in manifest["layers"]:
        # GNU tar as root keeps owners and modes, as a runtime's unpacking does (gzip found by itself)
        subprocess.run(["tar", "--numeric-owner", "-xf", str(blob(layer["digest"])), "-C", str(root)], check=True)
        blob(layer["digest"]).unlink()
    return root, config["config"]


def chroot(root, config, args, entry=None):
    """(argv, env) that run the image's entrypoint (or entry) with args in
    root as the image's user, with the image's environment only."""
    argv = ["chroot", f"--userspec={config['User']}", str(root), *(entry or config["Entrypoint"]), *args]
    return argv, dict(e.split("=", 1) for e in config.get("Env", []))


# Run by sh as PID 1 of a new PID and mount namespace (unshare): a /proc of
# its own and /dev's usual nodes bound in, as a runtime gives them. The
# mounts live and die with the namespace, so nothing is left mounted here
# whatever becomes of the test; sh stays PID 1 (a PID 1 ignores the SIGTERM
# the test ends the program with), its child the program.
IN_NAMESPACE = """set -e
root=$1; shift
mount -t proc proc "$root/proc"
for n in %s; do : > "$root/dev/$n"; mount --bind "/dev/$n" "$root/dev/$n"; done
"$@"
""" % " ".join(DEV_NODES)


def die_with_parent():
    """preexec_fn: the namespace's holder is killed when the test process
    dies (unshare --kill-child then takes the namespace down)."""
    import ctypes
    ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


@contextlib.contextmanager
def container(root, config, *args):
    """The image's entrypoint with args, running in root (IN_NAMESPACE): the
    Popen and a function that returns its output so far. Ended with SIGTERM
    to its process group, SIGKILL after 30 s."""
    argv, env = chroot(root, config, args)
    out = root.parent / "output"
    (root / "proc").mkdir(exist_ok=True)
    with open(out, "w") as log:
        p = subprocess.Popen(["unshare", "--mount", "--propagation", "private", "--pid", "--fork", "--kill-child",
                              "sh", "-c", IN_NAMESPACE, "sh", str(root), *argv], env=env, stdout=log,
                             stderr=subprocess.STDOUT, cwd="/", start_new_session=True, preexec_fn=die_with_parent)
        try:
            yield p, lambda: (log.flush(), out.read_text())[1]
        finally:
            stop_group(p)


def stop_group(p, timeout=30):
    """SIGTERM to p's process group, SIGKILL after timeout seconds."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(p.pid, signal.SIGTERM)
    try:
        p.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(p.pid, signal.SIGKILL)
        p.wait()


def serving(p, output, url, path):
    """Waits until url+path answers 200 while p runs."""
    wait_for(lambda: p.poll() is not None or http_code(url + path) == 200, 60, f"{url}{path} answering")
    assert p.poll() is None, output()


def put_model(root):
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing (../shared)")
    (root / "models").mkdir()
    shutil.copy(STORIES, root / "models" / STORIES.name)
    return f"/models/{STORIES.name}"


def leftovers(root):
    """What an image should not carry: setuid/setgid files, the build host's
    name, resolver or machine id, apt's lists, writable or foreign-owned
    programs, files of its user's (it owns nothing: what it writes goes to
    volumes)."""
    bad = []
    for dirpath, dirs, files in os.walk(root):
        for f in [*files, *dirs]:
            path = os.path.join(dirpath, f)
            st = os.lstat(path)
            rel = "/" + os.path.relpath(path, root)
            if stat.S_ISREG(st.st_mode) and st.st_mode & (stat.S_ISUID | stat.S_ISGID):
                bad.append(f"setuid/setgid {rel}")
            if st.st_uid == 65532 or st.st_gid == 65532:
                bad.append(f"owned by the image's user: {rel}")
            if rel.startswith("/usr/local/") and (st.st_uid != 0 or (not stat.S_ISLNK(st.st_mode)
                                                                      and st.st_mode & 0o022)):
                bad.append(f"writable or not root's: {rel}")
    for rel in ("etc/hostname", "etc/machine-id"):
        if (root / rel).exists():
            bad.append(f"/{rel} kept")
    if (root / "etc/resolv.conf").exists() and (root / "etc/resolv.conf").read_text().strip():
        bad.append("/etc/resolv.conf of the build host")
    if any((root / "var/lib/apt/lists").glob("*_Packages*")):
        bad.append("apt's package lists")
    return bad


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_image_runs_as_its_user_and_finds_its_libraries(tmp_path, name):
    """The image's configuration is its Dockerfile runtime stage's (USER
    65532, the ENTRYPOINT), and every program it ships starts in its root:
    no shared library missing (ld.so would refuse it before --help, whose
    usage goes to stdout with exit status 0)."""
    root, config = unpack(name, tmp_path)
    assert config["User"] == "65532:65532", config
    entry = re.search(r'ENTRYPOINT \["([^"]+)"', (ROOT / "docker" / f"{name}.Dockerfile").read_text())[1]
    assert config["Entrypoint"] == [entry], config
    assert not leftovers(root), leftovers(root)
    for prog in PROGRAMS[name]:
        argv, env = chroot(root, config, ["--help"], entry=[f"/usr/local/bin/{prog}"])
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and "usage" in r.stdout.lower(), (prog, r.returncode, out)


def test_cpu_image_answers_a_completion(tmp_path):
    """llm-server from inside the CPU image's root answers the openai client,
    as the same program built here answers it (greedy)."""
    root, config = unpack("server", tmp_path)
    model = put_model(root)
    api = Endpoint(free_port())
    with container(root, config, "-m", model, "--model_name", NAME, "--host", "127.0.0.1", "--port", str(api.port),
                   "--threads", "1") as (p, output):
        serving(p, output, api.base, "/health")
        r = api.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
    assert r.choices[0].text.strip() and r.usage.completion_tokens == 12, r
    host = Server(STORIES, "--threads", "1")
    try:
        again = host.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
    finally:
        host.stop()
    assert again.choices[0].text == r.choices[0].text


def test_router_image_routes_to_a_server(tmp_path):
    """llm-router from inside the router image's root, in front of a server
    on this machine: ready, and a completion through it."""
    root, config = unpack("router", tmp_path)
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing (../shared)")
    backend = Server(STORIES, "--threads", "1")
    try:
        front = Endpoint(free_port())
        with container(root, config, "--host", "127.0.0.1", "--port", str(front.port),
                       "--backend", backend.base) as (p, output):
            serving(p, output, front.base, "/readyz")
            r = front.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=4, temperature=0)
            assert r.usage.completion_tokens == 4, r
    finally:
        backend.stop()


def test_controller_image_reconciles_on_kubesim(tmp_path):
    """llm-controller from inside the controller image's root reaches kubesim
    (TLS and a bearer token, from the kubeconfig read inside the root) and
    reconciles: an LLMDeployment gets its Deployment, with no error logged."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    root, config = unpack("controller", tmp_path / "image")
    c = Cluster(tmp_path, STORIES)
    try:
        shutil.copy(c.dir / "kubeconfig", root / "etc" / "kubeconfig")
        (root / "etc" / "kubeconfig").chmod(0o644)
        port = free_port()
        with container(root, config, "--kubeconfig", "/etc/kubeconfig", "--http-addr", f"127.0.0.1:{port}") as (p,
                                                                                                                output):
            serving(p, output, f"http://127.0.0.1:{port}", "/readyz")
            c.apply()
            wait_for(lambda: c.get("deployment", "story"), 60, "the LLMDeployment's Deployment")
            assert p.poll() is None and '"level":"error"' not in output(), output()
    finally:
        c.close()


def test_cuda_image_loads_its_backend_and_finds_no_device(tmp_path):
    """The CUDA image's llm-server, asked for backend cuda on a machine with
    no GPU, loads its plugin (libllm_cuda.so, cuBLAS and NCCL from inside
    the root) far enough for CUDA's runtime to say that no device is there,
    and reports that - not a library that failed to load."""
    root, config = unpack("server-cuda", tmp_path)
    assert (root / "usr/local/lib/libllm_cuda.so").exists()
    model = put_model(root)
    api = Endpoint(free_port())
    with container(root, config, "-m", model, "--host", "127.0.0.1", "--port", str(api.port), "--backend",
                   "cuda") as (p, output):
        detail = failed_detail(api, timeout=120)  # (600 MB of CUDA's libraries to load on a loaded machine)
        assert p.poll() is None, output()
    assert "cuda backend: no CUDA device" in detail, detail
    assert not re.search(r"dlopen|cannot open shared object|undefined symbol", detail), detail


def test_images_push_to_a_registry(tmp_path):
    """make images REGISTRY=... pushes an archive with skopeo to a real
    registry (Debian's docker-registry: the CNCF distribution server), from
    which skopeo reads the image back: the tag, its configuration (user,
    entrypoint) and one layer."""
    archive("router")
    if not (shutil.which("skopeo") and shutil.which("docker-registry")):
        pytest.skip("skopeo and docker-registry not installed (make images-deps installs them)")
    port = free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'store'}\n"
                   f"http:\n  addr: 127.0.0.1:{port}\n")
    reg = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: http_code(f"http://127.0.0.1:{port}/v2/") == 200, 30, "the registry up")
        where = f"127.0.0.1:{port}/llm/"
        # (its own process group: a timeout ends debootstrap and buildah too, not only make)
        build = subprocess.Popen(["make", "--no-print-directory", "images", "IMAGES=router", f"REGISTRY={where}",
                                  "SKOPEO_FLAGS=--dest-tls-verify=false", f"OCI_DIR={tmp_path / 'oci'}",
                                  f"BUILD={BUILD}"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                 text=True, start_new_session=True)
        try:
            log, _ = build.communicate(timeout=900)
        finally:
            stop_group(build)
        assert build.returncode == 0, log
        ref = f"docker://{where}{tag('router')}"
        inspect = ["skopeo", "inspect", "--tls-verify=false"]
        got = json.loads(subprocess.run([*inspect, ref], capture_output=True, text=True, check=True).stdout)
        conf = json.loads(subprocess.run([*inspect, "--config", ref], capture_output=True, text=True,
                                         check=True).stdout)
    finally:
        stop_group(reg)
    assert got["Name"] == f"{where}{tag('router').split(':')[0]}" and len(got["Layers"]) == 1, got
    assert conf["config"]["User"] == "65532:65532" and conf["config"]["Entrypoint"] == ["/usr/local/bin/llm-router"]
