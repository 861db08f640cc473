"""The OCI archives `make images` builds (docker/oci-image.sh: a debootstrap
root committed by buildah), run as a container runtime would run them - but
without one, since the OCI runtimes are refused here: each archive is read
through its index, manifest and config, its layers unpacked into a folder,
and its configured entrypoint started there with chroot as its configured
user, with /proc, the usual /dev nodes and nothing else of this machine
(the network is the host's, as with hostNetwork). So a library missing from
an image, a package list gone short, a wrong USER or ENTRYPOINT fails here.

Skips where the archives have not been built (`make images-test` builds
them and runs this; it needs root, as chroot and mount do)."""
import contextlib
import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest

from harness import BUILD, NAME, ROOT, Cluster, Server, free_port, http_code, wait_for

OCI = BUILD / "oci"
VERSION = re.search(r'^appVersion:\s*"?([^"\s]+)', (ROOT / "charts/llm-operator/Chart.yaml").read_text(), re.M)[1]
STORIES = ROOT.parent / "shared" / "models" / "stories260K.gguf"
DEV_NODES = ("null", "zero", "random", "urandom")


def tag(name):
    """The name:tag make images gives llm-NAME (the CUDA server beside the CPU one)."""
    return f"llm-server:{VERSION}-cuda" if name == "server-cuda" else f"llm-{name}:{VERSION}"


def archive(name):
    path = OCI / f"llm-{name}-{VERSION}.tar"
    if not path.exists():
        pytest.skip(f"{path} not built (make images-test builds the images and runs these tests)")
    return path


def unpack(name, into):
    """(root folder, OCI config) of llm-NAME's archive, unpacked under into."""
    path = archive(name)
    if os.geteuid() != 0:
        pytest.skip("chroot and mount need root")
    oci, root = into / "oci", into / "root"
    oci.mkdir()
    root.mkdir()
    with tarfile.open(path) as t:
        t.extractall(oci, filter="data")
    blob = lambda digest: oci / "blobs" / digest.replace(":", "/")  # noqa: E731
    index = json.loads((oci / "index.json").read_text())
    assert [m["annotations"]["org.opencontainers.image.ref.name"] for m in index["manifests"]] == \
        [tag(name)], index
    manifest = json.loads(blob(index["manifests"][0]["digest"]).read_text())
    config = json.loads(blob(manifest["config"]["digest"]).read_text())
    assert config["os"] == "linux" and config["architecture"] == "amd64", config
    for layer in manifest["layers"]:
        # GNU tar as root keeps owners and modes, as a runtime's unpacking does (gzip found by itself)
        subprocess.run(["tar", "--numeric-owner", "-xf", str(blob(layer["digest"])), "-C", str(root)], check=True)
        blob(layer["digest"]).unlink()
    return root, config["config"]


@contextlib.contextmanager
def container(root, config, *args):
    """The image's entrypoint with args, chrooted into root as the image's
    user, with /proc and /dev's usual nodes mounted: the Popen (stderr to a
    file, read by log()). Everything is unmounted after."""
    mounts = []
    try:
        (root / "proc").mkdir(exist_ok=True)
        subprocess.run(["mount", "-t", "proc", "proc", str(root / "proc")], check=True)
        mounts.append(root / "proc")
        for node in DEV_NODES:
            (root / "dev" / node).touch()
            subprocess.run(["mount", "--bind", f"/dev/{node}", str(root / "dev" / node)], check=True)
            mounts.append(root / "dev" / node)
        env = dict(e.split("=", 1) for e in config.get("Env", []))
        log = open(root.parent / "stderr", "w+")
        p = subprocess.Popen(["chroot", f"--userspec={config['User']}", str(root), *config["Entrypoint"], *args],
                             env=env, stdout=log, stderr=subprocess.STDOUT, cwd="/")
        p.log = lambda: (log.flush(), (root.parent / "stderr").read_text())[1]
        try:
            yield p
        finally:
            if p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
            log.close()
    finally:
        for m in reversed(mounts):
            subprocess.run(["umount", "-l", str(m)], check=False)


def run_in(root, config, *args, entry=None, timeout=60):
    """One command in the image's root as its user: (rc, output)."""
    cmd = ["chroot", f"--userspec={config['User']}", str(root), *(entry or config["Entrypoint"]), *args]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                       env=dict(e.split("=", 1) for e in config.get("Env", [])))
    return r.returncode, r.stdout + r.stderr


def put_model(root):
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing (../shared)")
    (root / "models").mkdir()
    shutil.copy(STORIES, root / "models" / STORIES.name)
    return f"/models/{STORIES.name}"


def test_every_image_runs_as_its_user_and_finds_its_libraries(tmp_path):
    """Each image's configuration is the Dockerfile's runtime stage's (USER
    65532, the ENTRYPOINT), and every program it ships starts in its root:
    no shared library missing (ld.so would refuse it before --help)."""
    for name, programs in (("server", ["llm-server", "llm-router", "llm-fetch"]), ("router", ["llm-router"]),
                           ("controller", ["llm-controller"]), ("server-cuda", ["llm-server", "llm-router"])):
        if name == "server-cuda" and not (OCI / f"llm-{name}-{VERSION}.tar").exists():
            continue  # built where nvcc is; its own test below says so when it skips
        d = tmp_path / name
        d.mkdir()
        root, config = unpack(name, d)
        assert config["User"] == "65532:65532", (name, config)
        entry = re.search(r'ENTRYPOINT \["([^"]+)"', (ROOT / "docker" / f"{name}.Dockerfile").read_text())[1]
        assert config["Entrypoint"] == [entry], (name, config)
        for prog in programs:
            rc, out = run_in(root, config, "--help", entry=[f"/usr/local/bin/{prog}"])
            assert "error while loading shared libraries" not in out and "usage" in out.lower(), (name, prog, out)
        shutil.rmtree(d)


def test_cpu_image_answers_a_completion(tmp_path):
    """llm-server from inside the CPU image's root answers the openai client,
    and as the same program built here answers it (greedy)."""
    openai = pytest.importorskip("openai")
    root, config = unpack("server", tmp_path)
    model = put_model(root)
    port = free_port()
    with container(root, config, "-m", model, "--model_name", NAME, "--host", "127.0.0.1", "--port", str(port),
                   "--threads", "1") as p:
        url = f"http://127.0.0.1:{port}"
        wait_for(lambda: p.poll() is not None or http_code(url + "/health") == 200, 60, "the image's llm-server ready")
        assert p.poll() is None, p.log()
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        r = client.completions.create(model=NAME, prompt="Once upon a time", max_tokens=12, temperature=0)
        text = r.choices[0].text
    assert text.strip() and r.usage.completion_tokens == 12, r
    host = Server(STORIES, "--threads", "1")
    try:
        again = host.client().completions.create(model=NAME, prompt="Once upon a time", max_tokens=12,
                                                 temperature=0)
    finally:
        host.stop()
    assert again.choices[0].text == text


def test_router_image_routes_to_a_server(tmp_path):
    """llm-router from inside the router image's root, in front of a server
    on this machine: a completion through it, and its readiness."""
    if not STORIES.exists():
        pytest.skip(f"{STORIES} missing (../shared)")
    root, config = unpack("router", tmp_path)
    backend = Server(STORIES, "--threads", "1")
    try:
        port = free_port()
        with container(root, config, "--host", "127.0.0.1", "--port", str(port),
                       "--backend", f"http://127.0.0.1:{backend.port}") as p:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: p.poll() is not None or http_code(url + "/readyz") == 200, 60, "the router ready")
            assert p.poll() is None, p.log()
            r = backend.client().with_options(base_url=url + "/v1").completions.create(
                model=NAME, prompt="Once upon a time", max_tokens=4, temperature=0)
            assert r.usage.completion_tokens == 4, r
    finally:
        backend.stop()


def test_controller_image_reconciles_on_kubesim(tmp_path):
    """llm-controller from inside the controller image's root reaches kubesim
    (TLS, a bearer token: the kubeconfig's CA and ca-certificates' bundle
    read inside the root) and reconciles: an LLMDeployment gets its
    Deployment."""
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    (tmp_path / "image").mkdir()
    root, config = unpack("controller", tmp_path / "image")
    c = Cluster(tmp_path, STORIES if STORIES.exists() else tmp_path / "none.gguf")
    try:
        cfg = root / "etc" / "kubeconfig"
        shutil.copy(c.dir / "kubeconfig", cfg)
        os.chmod(cfg, 0o644)
        port = free_port()
        with container(root, config, "--kubeconfig", "/etc/kubeconfig", "--http-addr", f"127.0.0.1:{port}") as p:
            url = f"http://127.0.0.1:{port}"
            wait_for(lambda: p.poll() is not None or http_code(url + "/readyz") == 200, 60, "the controller ready")
            assert p.poll() is None, p.log()
            c.apply()
            wait_for(lambda: c.get("deployment", "story"), 60, "the LLMDeployment's Deployment")
            assert p.poll() is None and '"level":"error"' not in p.log(), p.log()
    finally:
        c.close()


def test_cuda_image_loads_its_backend_and_finds_no_device(tmp_path):
    """The CUDA image's llm-server, asked for backend cuda on a machine with
    no GPU, loads its plugin (libllm_cuda.so, cuBLAS and NCCL from inside
    the root) far enough for CUDA's runtime to say that no device is there,
    and reports that on /health - not a library that failed to load."""
    root, config = unpack("server-cuda", tmp_path)
    assert (root / "usr/local/lib/libllm_cuda.so").exists()
    model = put_model(root)
    port = free_port()
    with container(root, config, "-m", model, "--host", "127.0.0.1", "--port", str(port), "--backend", "cuda") as p:
        url = f"http://127.0.0.1:{port}"

        def failed():
            if p.poll() is not None:
                return p.log()
            try:
                import urllib.request
                urllib.request.urlopen(url + "/health", timeout=2)
            except Exception as e:  # 503 while loading, and once failed
                body = getattr(e, "read", lambda: b"")().decode()
                return body if '"failed"' in body else None
            return None
        detail = wait_for(failed, 60, "the CUDA backend's verdict")
    assert "cuda backend: no CUDA device" in detail, detail
    assert not re.search(r"dlopen|cannot open shared object|undefined symbol", detail), detail


def test_images_push_to_a_registry(tmp_path):
    """make images REGISTRY=... pushes each archive with skopeo to a real
    registry (Debian's docker-registry: the CNCF distribution server), from
    which skopeo reads the image back: the tag, its configuration (user,
    entrypoint) and one layer."""
    archive("router")
    if not (shutil.which("skopeo") and shutil.which("docker-registry")):
        pytest.skip("skopeo and docker-registry not installed (make images-test installs them)")
    port = free_port()
    cfg = tmp_path / "registry.yml"
    cfg.write_text(f"version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: {tmp_path / 'store'}\n"
                   f"http:\n  addr: 127.0.0.1:{port}\n")
    reg = subprocess.Popen(["docker-registry", "serve", str(cfg)], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: http_code(f"http://127.0.0.1:{port}/v2/") == 200, 30, "the registry up")
        where = f"127.0.0.1:{port}/llm/"
        r = subprocess.run(["make", "--no-print-directory", "images", "IMAGES=router", f"REGISTRY={where}",
                            "SKOPEO_FLAGS=--dest-tls-verify=false", f"OCI_DIR={tmp_path / 'oci'}",
                            f"BUILD={BUILD}"], cwd=ROOT, capture_output=True, text=True, timeout=900)
        assert r.returncode == 0, r.stdout + r.stderr
        ref = f"docker://{where}llm-router:{VERSION}"
        got = json.loads(subprocess.run(["skopeo", "inspect", "--tls-verify=false", ref], capture_output=True,
                                        text=True, check=True).stdout)
        conf = json.loads(subprocess.run(["skopeo", "inspect", "--config", "--tls-verify=false", ref],
                                         capture_output=True, text=True, check=True).stdout)
    finally:
        reg.terminate()
        reg.wait(timeout=30)
    assert got["Name"] == f"{where}llm-router" and len(got["Layers"]) == 1, got
    assert conf["config"]["User"] == "65532:65532" and conf["config"]["Entrypoint"] == ["/usr/local/bin/llm-router"]
