"""llm-controller's Kubernetes client against kubesim: kubeconfig (TLS CA
data + bearer token) and in-cluster service-account credentials, listing
LLMDeployments; clear errors for a missing CRD, bad credentials, an
unreachable server and a malformed kubeconfig."""
import os
import pathlib

import pytest
import yaml

from harness import ROOT, free_port, http_code, run, tool, wait_for


CRD = ROOT / "manifests" / "crd" / "llmdeployments.yaml"


def ctl(*args, env=None):
    e = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST")}
    return run(tool("llm-controller"), *args, check=False, env={**e, **(env or {})})


def sa_dir(sim, tmp_path, token=None):  # noqa: F811
    cfg = yaml.safe_load((sim / "kubeconfig").read_text())
    d = tmp_path / "sa"
    d.mkdir(exist_ok=True)
    (d / "token").write_text(token or cfg["users"][0]["user"]["token"])
    (d / "ca.crt").write_bytes((sim / "ca.crt").read_bytes())
    (d / "namespace").write_text("default\n")
    return {"KUBERNETES_SERVICE_HOST": "127.0.0.1", "KUBERNETES_SERVICE_PORT": (sim / "port").read_text().strip(),
            "KUBESIM_SERVICEACCOUNT_DIR": str(d)}


def test_lists_with_kubeconfig_and_in_cluster(sim, kubectl, tmp_path):  # noqa: F811
    r = ctl("--kubeconfig", sim / "kubeconfig", "--check")
    assert r.returncode == 1 and "CRD is not installed" in r.stderr
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    n = 0
    for f in sorted((ROOT / "manifests" / "samples").glob("*.yaml")):
        kubectl("apply", "--validate=false", "-f", str(f))
        n += sum(1 for d in yaml.safe_load_all(f.read_text()) if d and d.get("kind") == "LLMDeployment")
    count = f"llmdeployments: {n}"
    r = ctl("--kubeconfig", sim / "kubeconfig", "--check")
    assert r.returncode == 0, r.stderr
    assert n >= 3 and count in r.stdout
    assert "default/tinyllama model=/models/tinyllama-1.1b-chat.Q4_K_M.gguf replicas=2" in r.stdout
    r = ctl("--check", env={"KUBECONFIG": str(sim / "kubeconfig")})  # $KUBECONFIG
    assert r.returncode == 0 and count in r.stdout
    r = ctl("--check", env=sa_dir(sim, tmp_path))  # in-cluster
    assert r.returncode == 0 and "in-cluster service account" in r.stdout and count in r.stdout
    r = ctl("--check", "--namespace", "kube-system", env=sa_dir(sim, tmp_path))
    assert r.returncode == 0 and "llmdeployments: 0" in r.stdout


def test_errors_are_clear(sim, tmp_path):  # noqa: F811
    r = ctl("--check", env=sa_dir(sim, tmp_path, token="wrong"))
    assert r.returncode == 1 and "HTTP 401" in r.stderr
    bad = tmp_path / "bad-kubeconfig"
    bad.write_text("apiVersion: v1\nclusters: [\n")
    r = ctl("--kubeconfig", bad, "--check")
    assert r.returncode == 1 and str(bad) in r.stderr and "line" in r.stderr
    cfg = yaml.safe_load((sim / "kubeconfig").read_text())
    cfg["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:1"
    down = tmp_path / "down-kubeconfig"
    down.write_text(yaml.safe_dump(cfg))
    r = ctl("--kubeconfig", down, "--check")
    assert r.returncode == 1 and "127.0.0.1:1" in r.stderr
    cfg["current-context"] = "nope"
    down.write_text(yaml.safe_dump(cfg))
    r = ctl("--kubeconfig", down, "--check")
    assert r.returncode == 1 and "current-context 'nope' not found" in r.stderr
    assert ctl("--bogus").returncode == 2


def test_rbac_is_enough_and_needed(sim, kubectl, tmp_path):  # noqa: F811
    """The controller's service account can list LLMDeployments with the
    RBAC of manifests/operator (the chart's) bound, and gets 403 (a clear
    message) without it."""
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    kubectl("create", "namespace", "llm-system")
    kubectl("-n", "llm-system", "create", "serviceaccount", "llm-operator")
    token = kubectl("-n", "llm-system", "create", "token", "llm-operator").stdout.strip()
    env = sa_dir(sim, tmp_path, token=token)
    r = ctl("--check", env=env)
    assert r.returncode == 1 and "HTTP 403" in r.stderr and "llmdeployments" in r.stderr
    docs = yaml.safe_load_all((ROOT / "manifests" / "operator" / "llm-operator.yaml").read_text())
    rbac = [d for d in docs if d and d["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")]
    assert len(rbac) == 6
    kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(rbac))
    r = ctl("--check", env=env)
    assert r.returncode == 0, r.stderr
    assert "llmdeployments: 0" in r.stdout
    as_sa = ["--token", token, "-n", "default"]
    assert kubectl(*as_sa, "get", "deployments", check=False).returncode == 0
    kubectl(*as_sa, "create", "configmap", "cfg", "--from-literal=a=1")  # it manages configmaps
    kubectl(*as_sa, "delete", "configmap", "cfg")  # and deletes them (a canary's, after it ends)
    r = kubectl(*as_sa, "delete", "rolebinding", "x", check=False)  # a router turned off takes its binding along
    assert r.returncode and "not found" in r.stderr, r.stderr
    r = kubectl(*as_sa, "delete", "persistentvolumeclaim", "x", check=False)
    assert r.returncode and "cannot delete" in r.stderr  # but nothing it never makes (models' volumes are the users')
    r = kubectl(*as_sa, "delete", "pod", "x", check=False)
    assert r.returncode and 'cannot delete resource "pods"' in r.stderr  # pods: read only
    r = kubectl(*as_sa, "get", "secrets", check=False)
    assert r.returncode and 'cannot list resource "secrets"' in r.stderr  # never lists secrets
    kubectl("create", "secret", "generic", "story-admin-0123456789", "--from-literal=token=x")
    r = kubectl(*as_sa, "get", "secret", "story-admin-0123456789", check=False)  # nor reads one
    assert r.returncode and 'cannot get resource "secrets"' in r.stderr, r.stderr
    r = kubectl(*as_sa, "delete", "secret", "story-admin-0123456789", check=False)
    assert r.returncode and 'cannot delete resource "secrets"' in r.stderr
    kubectl(*as_sa, "create", "secret", "generic", "made-by-it", "--from-literal=token=x")  # it creates them
    own = ["--token", token, "-n", "llm-system"]  # and reads its key, in its own namespace, by that name alone
    r = kubectl(*own, "get", "secret", "llm-operator-admin-key", check=False)
    assert r.returncode and "NotFound" in r.stderr, r.stderr
    kubectl("-n", "llm-system", "create", "secret", "generic", "other", "--from-literal=a=1")
    r = kubectl(*own, "get", "secret", "other", check=False)
    assert r.returncode and 'cannot get resource "secrets"' in r.stderr, r.stderr


def test_watch_sync_changes_and_relist(tmp_path):
    """--watch: the current objects as SYNC, then ADDED/MODIFIED/DELETED as
    they happen; when the server expires the watch's resourceVersion (410,
    here forced by a small event window and no bookmarks) a RELIST and fresh
    SYNCs follow and events keep coming."""
    import shutil
    import subprocess
    import time
    if not shutil.which("kubectl"):
        pytest.skip("kubectl not installed")
    d = tmp_path / "ks"
    ks = subprocess.Popen([str(ROOT / "tests" / "kubesim" / "kubesim"), "--data-dir", str(d), "--tls",
                           "--watch-window", "5"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          env={**os.environ, "KUBESIM_BOOKMARK_SECONDS": "1000"})
    for _ in range(100):
        if (d / "kubeconfig").exists() and (d / "port").exists():
            break
        time.sleep(0.1)
    env = {**os.environ, "KUBECONFIG": str(d / "kubeconfig")}
    k = lambda *a: subprocess.run(["kubectl", *a], env=env, capture_output=True, text=True, check=True)  # noqa: E731
    w = None
    try:
        k("create", "configmap", "a", "--from-literal=x=1")
        w = subprocess.Popen([tool("llm-controller"), "--kubeconfig", str(d / "kubeconfig"), "--watch",
                              "/api/v1/namespaces/default/configmaps"], stdout=subprocess.PIPE, text=True)
        lines = []

        def expect(prefix):
            while True:
                line = w.stdout.readline()
                assert line, f"watch ended; saw {lines}"
                lines.append(line.strip())
                if line.startswith(prefix):
                    return line

        expect("SYNC default/a ")
        k("create", "configmap", "b", "--from-literal=x=1")
        expect("ADDED default/b ")
        k("patch", "configmap", "b", "--type", "merge", "-p", '{"data":{"x":"2"}}')
        expect("MODIFIED default/b ")
        k("delete", "configmap", "b")
        expect("DELETED default/b ")
        for i in range(8):  # other kinds push the configmaps' resourceVersion out of the window
            k("create", "secret", "generic", f"s{i}", "--from-literal=x=1")
        expect("RELIST")
        expect("SYNC default/a ")
        k("create", "configmap", "c", "--from-literal=x=1")
        expect("ADDED default/c ")
        w.terminate()
        assert w.wait(timeout=10) == 0
    finally:
        if w and w.poll() is None:
            w.kill()
        ks.terminate()
        ks.wait(timeout=10)


def test_token_rotation_and_late_rbac(sim, kubectl, tmp_path):  # noqa: F811
    """In-cluster, started before its RBAC is bound and with a token that is
    not (yet) valid: the controller keeps retrying with /readyz 503 and
    becomes ready, without a restart, once the projected token file is
    replaced by a valid one and the RBAC is applied (helm's install order
    does not wait for bindings)."""
    import subprocess
    import time
    kubectl("apply", "-f", str(CRD))
    kubectl("wait", "--for=condition=established", "crd/llmdeployments.llmk8s.io", "--timeout=10s")
    kubectl("create", "namespace", "llm-system")
    kubectl("-n", "llm-system", "create", "serviceaccount", "llm-operator")
    env = sa_dir(sim, tmp_path, token="not-a-token")
    port = free_port()
    e = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG",)}
    p = subprocess.Popen([tool("llm-controller"), "--http-addr", f"127.0.0.1:{port}"], env={**e, **env},
                         stderr=subprocess.PIPE, text=True)
    try:
        wait_for(lambda: http_code(f"http://127.0.0.1:{port}/healthz") == 200, 10)
        time.sleep(1.5)
        assert http_code(f"http://127.0.0.1:{port}/readyz") == 503
        token = kubectl("-n", "llm-system", "create", "token", "llm-operator").stdout.strip()
        tok = pathlib.Path(env["KUBESIM_SERVICEACCOUNT_DIR"]) / "token"
        new = tok.with_name("token.new")
        new.write_text(token)
        new.replace(tok)  # as the kubelet swaps projected files: a new inode
        time.sleep(2.5)
        assert http_code(f"http://127.0.0.1:{port}/readyz") == 503  # authenticated now, but not allowed
        docs = yaml.safe_load_all((ROOT / "manifests" / "operator" / "llm-operator.yaml").read_text())
        rbac = [d for d in docs if d and d["kind"] in ("ClusterRole", "ClusterRoleBinding")]
        kubectl("apply", "--validate=false", "-f", "-", stdin=yaml.safe_dump_all(rbac))
        wait_for(lambda: http_code(f"http://127.0.0.1:{port}/readyz") == 200, 40)
    finally:
        p.terminate()
        assert p.wait(timeout=20) == 0
    log = p.stderr.read()
    assert "HTTP 401" in log and "HTTP 403" in log, log[-2000:]
