"""workload.py - what kube-controller-manager and the kubelet would do, in
one loop: Deployments own a ReplicaSet per template (NAME-HASH, the
template's pod-template-hash), which owns its Pods, and roll them honouring
maxSurge/maxUnavailable; Pods
run as local processes when their image is mapped to a command, each on
its own loopback address 127.0.0.N, their output kept for kubectl logs, with readiness probes over HTTP and
restart with back-off; deleting a Pod sends SIGTERM, waits the grace
period, then SIGKILL; Services get Endpoints of their ready pods.

ConfigMap and Secret volumes: their keys are written as files under the
data directory, and container args and env values that start with a
volume's mountPath, and such paths inside those files, are rewritten to
its directory (a process cannot be given a mount namespace of its own
here). PersistentVolumeClaims are bound at once, each to a directory of
its own under the data directory that outlives the pods mounting it (as a
dynamic provisioner's volume would); a pod whose claim is missing stays
Pending.

restartPolicy: Always (Deployment pods) restarts an exited container with
back-off, OnFailure only one that failed; a Never pod ends Succeeded (exit
0) or Failed, an OnFailure pod Succeeded.

A container's resources.limits.memory is enforced as the cgroup OOM killer
would: past it (resident memory of its processes) it is killed and its
lastState says OOMKilled (exit code 137).

One node, "kubesim", with KUBESIM_NODE_GPUS nvidia.com/gpu (default 0): a
pod asking for more GPUs than are free stays Pending with PodScheduled
False, reason Unschedulable and the scheduler's message. Its file system
is this machine's: a hostPath volume is its path (types Directory and
DirectoryOrCreate checked and made as the kubelet does). Init containers
are not run.

Image map (--image-map FILE, YAML): {image: [command, arg, ...]}; the
container's own command/args are appended, its env is passed."""
import copy
import hashlib
import json
import os
import re
import signal
import subprocess
import sys
import threading
import tempfile
import time
import traceback
import base64
import urllib.request

from store import ApiError

KUBELET_FINALIZER = "kubesim.io/kubelet"
POD = ("", "pods", "Pod")
DEPLOY = ("apps", "deployments", "Deployment")
RS = ("apps", "replicasets", "ReplicaSet")
SVC = ("", "services", "Service")
EP = ("", "endpoints", "Endpoints")
SLICE = ("discovery.k8s.io", "endpointslices", "EndpointSlice")
CM = ("", "configmaps", "ConfigMap")
SECRET = ("", "secrets", "Secret")
PVC = ("", "persistentvolumeclaims", "PersistentVolumeClaim")


def template_hash(tpl):
    return hashlib.sha256(json.dumps(tpl, sort_keys=True).encode()).hexdigest()[:10]


def controller_uid(o):
    """The uid of o's controlling owner, or None."""
    return next((r.get("uid") for r in o["metadata"].get("ownerReferences") or [] if r.get("controller")), None)


def selector_ok(sel, labels):
    return all((labels or {}).get(k) == v for k, v in (sel or {}).items())


def int_or_pct(v, total, up):
    if isinstance(v, str) and v.endswith("%"):
        x = total * int(v[:-1]) / 100
        return int(-(-x // 1)) if up else int(x)
    return int(v)


def memory_bytes(q):
    """A memory quantity ("512Mi", "1G", "1048576") in bytes; None when not one."""
    m = re.fullmatch(r"([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|k|M|G|T)?", str(q).strip())
    if not m:
        return None
    mul = {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "k": 10**3, "M": 10**6, "G": 10**9,
           "T": 10**12}[m.group(2)]
    return int(float(m.group(1)) * mul)


def rss_bytes(pid):
    """The resident memory of pid and its children (what a container's cgroup would count, near enough)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
            with open(f"/proc/{p}/task/{p}/children") as f:
                todo += [int(c) for c in f.read().split()]
        except (OSError, ValueError):
            pass
    return total


class ProbeState:
    def __init__(self):
        self.ok = self.fail = 0
        self.next = 0.0
        self.passed = False


class Proc:
    """One container process and its probe state."""

    def __init__(self):
        self.popen = None
        self.restarts = 0
        self.next_start = 0.0
        self.started = 0.0
        self.ready = False
        self.exit_reason = None
        self.last_state = None
        self.ended = None  # "Succeeded" or "Failed": a pod that is not restarted
        self.reset_probes()

    def reset_probes(self):
        self.probes = {"startup": ProbeState(), "readiness": ProbeState(), "liveness": ProbeState()}


def http_probe(pr, ip):
    hg = pr.get("httpGet") or {}
    url = f"http://{ip}:{hg.get('port', 80)}{hg.get('path', '/')}"
    try:
        return urllib.request.urlopen(url, timeout=pr.get("timeoutSeconds", 1)).status < 400
    except Exception:
        return False


def step_probe(pr, st, ip, started, now):
    """Runs pr when due; returns "ok", "fail" (threshold reached) or None."""
    if now < st.next or now < started + pr.get("initialDelaySeconds", 0):
        return None
    st.next = now + pr.get("periodSeconds", 10)
    if http_probe(pr, ip):
        st.ok, st.fail = st.ok + 1, 0
        return "ok" if st.ok >= pr.get("successThreshold", 1) else None
    st.ok, st.fail = 0, st.fail + 1
    return "fail" if st.fail >= pr.get("failureThreshold", 3) else None


class Workloads:
    def __init__(self, store, image_map, incluster=None, data_dir=None):
        """incluster: {"dir", "host", "port", "ca", "mint"} to give pods the
        in-cluster configuration (service-account token, CA, API address)."""
        self.store = store
        self.images = image_map or {}
        self.incluster = incluster
        self.data_dir = data_dir or tempfile.mkdtemp(prefix="kubesim-")
        self.procs = {}      # (ns, name, uid) -> Proc
        self.terminating = set()
        self.dying = {}      # key -> Proc of pods in their grace period
        self.ips = {}        # uid -> ip
        self.gpus = int(os.environ.get("KUBESIM_NODE_GPUS", "0"))
        self.bound = {}      # uid -> GPUs of pods placed on the node
        self.next_ip = 2
        self.stop = threading.Event()
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while not self.stop.wait(0.2):
            for step in (self.deployments, self.claims, self.pods, self.endpoints):
                try:
                    step()
                except ApiError:
                    pass  # raced with a client write: the next pass sees the new state
                except Exception:  # an object no real controller would meet must not stop every other one
                    traceback.print_exc(file=sys.stderr)

    # ---- deployments -----------------------------------------------------------
    def deployments(self):
        items, _ = self.store.list(DEPLOY)
        for d in items:
            if not d["metadata"].get("deletionTimestamp"):
                self.sync_deployment(d)

    def replica_sets(self, d):
        """d's ReplicaSets (controlled by it), by uid."""
        rsets, _ = self.store.list(RS, d["metadata"]["namespace"])
        return {r["metadata"]["uid"]: r for r in rsets if controller_uid(r) == d["metadata"]["uid"]}

    def owned_pods(self, d, rsets=None):
        """d's pods: those its ReplicaSets control (not deleted)."""
        rsets = self.replica_sets(d) if rsets is None else rsets
        pods, _ = self.store.list(POD, d["metadata"]["namespace"])
        return [p for p in pods if controller_uid(p) in rsets and not p["metadata"].get("deletionTimestamp")]

    def replica_set(self, d, h):
        """d's ReplicaSet of template hash h, made when missing (as the Deployment controller does)."""
        ns, name = d["metadata"]["namespace"], f"{d['metadata']['name']}-{h}"
        try:
            return self.store.get(RS, ns, name)
        except ApiError as e:
            if e.code != 404:
                raise
        tpl = copy.deepcopy(d["spec"].get("template", {}))
        labels = dict((tpl.get("metadata") or {}).get("labels") or {}, **{"pod-template-hash": h})
        tpl.setdefault("metadata", {})["labels"] = labels
        sel = copy.deepcopy(d["spec"].get("selector") or {"matchLabels": {}})
        sel.setdefault("matchLabels", {})["pod-template-hash"] = h
        rs = {"apiVersion": "apps/v1", "kind": "ReplicaSet",
              "metadata": {"name": name, "labels": labels, "ownerReferences": [
                  {"apiVersion": "apps/v1", "kind": "Deployment", "name": d["metadata"]["name"],
                   "uid": d["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]},
              "spec": {"replicas": 0, "selector": sel, "template": tpl}}
        return self.store.create(RS, ns, rs)

    def replica_set_counts(self, rsets, pods):
        """Each ReplicaSet's spec and status: the pods it has now."""
        for uid, rs in rsets.items():
            mine = [p for p in pods if controller_uid(p) == uid]
            fields = {"spec": dict(rs.get("spec") or {}, replicas=len(mine)),
                      "status": {"replicas": len(mine), "readyReplicas": sum(1 for p in mine if pod_ready(p)),
                                 "availableReplicas": sum(1 for p in mine if pod_ready(p)),
                                 "observedGeneration": rs["metadata"].get("generation", 1)}}
            self.put(RS, rs["metadata"]["namespace"], rs["metadata"]["name"], fields, rs)

    def sync_deployment(self, d):
        spec = d.get("spec", {})
        want = spec.get("replicas", 1)
        h = template_hash(spec.get("template", {}))
        rs = self.replica_set(d, h)
        pods = self.owned_pods(d)
        new = [p for p in pods if p["metadata"].get("labels", {}).get("pod-template-hash") == h]
        old = [p for p in pods if p not in new]
        ready = [p for p in pods if pod_ready(p)]
        roll = (spec.get("strategy") or {}).get("rollingUpdate") or {}
        surge = int_or_pct(roll.get("maxSurge", "25%"), want, True)
        unavail = int_or_pct(roll.get("maxUnavailable", "25%"), want, False)
        if surge == 0 and unavail == 0:
            unavail = 1
        # scale the new revision up within the surge budget
        for _ in range(max(0, min(want - len(new), want + surge - len(pods)))):
            self.create_pod(d, h, rs)
        # remove old pods while enough stay available; extra new pods when scaling down
        min_avail = want - unavail
        for p in sorted(old, key=lambda p: pod_ready(p)):
            if len(ready) - (1 if pod_ready(p) else 0) >= min_avail or not old:
                self.delete_pod(p)
                if pod_ready(p):
                    ready.remove(p)
        for p in new[want:]:
            self.delete_pod(p)
        rsets = self.replica_sets(d)
        self.replica_set_counts(rsets, self.owned_pods(d, rsets))
        self.revision(d, h)
        self.deployment_status(d, h)

    def create_pod(self, d, h, rs):
        tpl = copy.deepcopy(d["spec"].get("template", {}))
        md = tpl.setdefault("metadata", {})
        md["labels"] = dict(md.get("labels") or {}, **{"pod-template-hash": h})
        md["generateName"] = f"{d['metadata']['name']}-{h}-"
        md["finalizers"] = [KUBELET_FINALIZER]
        md["ownerReferences"] = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": rs["metadata"]["name"],
                                  "uid": rs["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": md, "spec": tpl.get("spec", {}),
               "status": {"phase": "Pending"}}
        self.store.create(POD, d["metadata"]["namespace"], pod)

    def delete_pod(self, p):
        md = p["metadata"]
        cur = self.store.get(POD, md["namespace"], md["name"])
        cur["metadata"].setdefault("deletionTimestamp", time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        self.store.update(POD, md["namespace"], md["name"], cur, internal=True)

    def revision(self, d, h):
        """deployment.kubernetes.io/revision: 1 for the first template, +1 per new one."""
        ann = d["metadata"].get("annotations") or {}
        rev, seen = int(ann.get("deployment.kubernetes.io/revision", "0")), ann.get("kubesim.io/template-hash")
        if seen == h:
            return
        cur = self.store.get(DEPLOY, d["metadata"]["namespace"], d["metadata"]["name"])
        a = cur["metadata"].setdefault("annotations", {})
        a["deployment.kubernetes.io/revision"] = str(rev + 1)
        a["kubesim.io/template-hash"] = h
        self.store.update(DEPLOY, d["metadata"]["namespace"], d["metadata"]["name"], cur, status_sub=True)

    def deployment_status(self, d, h):
        pods = self.owned_pods(d)
        want = d["spec"].get("replicas", 1)
        updated = [p for p in pods if p["metadata"]["labels"].get("pod-template-hash") == h]
        ready = [p for p in pods if pod_ready(p)]
        st = {"observedGeneration": d["metadata"].get("generation", 1), "replicas": len(pods),
              "updatedReplicas": len(updated), "readyReplicas": len(ready), "availableReplicas": len(ready),
              "unavailableReplicas": max(0, want - len(ready)),
              "selector": ",".join(f"{k}={v}" for k, v in
                                   ((d["spec"].get("selector") or {}).get("matchLabels") or {}).items()),
              "conditions": [
                  {"type": "Available", "status": "True" if len(ready) >= want - 0 else "False",
                   "reason": "MinimumReplicasAvailable" if len(ready) >= want else "MinimumReplicasUnavailable"},
                  {"type": "Progressing", "status": "True",
                   "reason": "NewReplicaSetAvailable" if len(updated) == want == len(ready) == len(pods)
                   else "ReplicaSetUpdated"}]}
        if d.get("status") != st:
            cur = self.store.get(DEPLOY, d["metadata"]["namespace"], d["metadata"]["name"])
            cur["status"] = st
            self.store.update(DEPLOY, d["metadata"]["namespace"], d["metadata"]["name"], cur, "status")

    # ---- persistent volume claims ----------------------------------------------------
    def claim_dir(self, ns, name):
        """The claim's folder; ValueError when its names would lead outside
        the volumes folder (the store refuses such names: this is a second lock)."""
        root = os.path.realpath(os.path.join(self.data_dir, "volumes"))
        d = os.path.realpath(os.path.join(root, ns, name))
        if os.path.dirname(os.path.dirname(d)) != root:
            raise ValueError(f"claim {ns}/{name}: not a folder of its own under {root}")
        return d

    def claims(self):
        """Binds every pending claim to a directory of its own, as a default
        StorageClass with a dynamic provisioner and Immediate binding would."""
        items, _ = self.store.list(PVC)
        for c in items:
            if (c.get("status") or {}).get("phase") != "Bound":
                try:
                    self.bind(c["metadata"]["namespace"], c["metadata"]["name"])
                except (ValueError, OSError) as e:
                    print(f"kubesim: claim not bound: {e}", file=sys.stderr)

    def bind(self, ns, name):
        os.makedirs(self.claim_dir(ns, name), exist_ok=True)
        cur = self.store.get(PVC, ns, name)
        spec = cur.setdefault("spec", {})
        if not spec.get("volumeName"):
            spec["volumeName"] = "pvc-" + cur["metadata"]["uid"]
            cur = self.store.update(PVC, ns, name, cur, internal=True)
        size = ((cur["spec"].get("resources") or {}).get("requests") or {}).get("storage", "1Gi")
        cur["status"] = {"phase": "Bound", "accessModes": cur["spec"].get("accessModes") or ["ReadWriteOnce"],
                         "capacity": {"storage": size}}
        self.store.update(PVC, ns, name, cur, "status")

    # ---- kubelet -----------------------------------------------------------------
    def pods(self):
        items, _ = self.store.list(POD)
        for p in items:
            key = (p["metadata"]["namespace"], p["metadata"]["name"], p["metadata"]["uid"])
            proc = self.procs.setdefault(key, Proc())
            if p["metadata"].get("deletionTimestamp"):
                if key not in self.terminating:  # the grace period must not stall the loop
                    self.terminating.add(key)
                    self.dying[key] = self.procs.pop(key)
                    threading.Thread(target=self.terminate, args=(p, self.dying[key]), daemon=True).start()
                continue
            try:
                self.run_pod(p, proc)
            except ApiError:
                raise
            except Exception:  # one odd pod must not stop the others
                traceback.print_exc(file=sys.stderr)

    def service_account(self, p):
        """What a pod finds in-cluster: the API address and, in a directory
        named by KUBESIM_SERVICEACCOUNT_DIR (kubesim cannot mount
        /var/run/secrets/kubernetes.io/serviceaccount), token, ca.crt and
        namespace files for its service account."""
        ic = self.incluster
        if not ic or p["spec"].get("automountServiceAccountToken") is False:
            return {}
        ns, sa = p["metadata"]["namespace"], p["spec"].get("serviceAccountName") or "default"
        d = os.path.join(ic["dir"], "pods", p["metadata"]["uid"], "serviceaccount")
        if not os.path.exists(os.path.join(d, "token")):
            os.makedirs(d, exist_ok=True)
            with open(os.path.join(d, "namespace"), "w") as f:
                f.write(ns)
            if ic.get("ca"):
                with open(ic["ca"]) as src, open(os.path.join(d, "ca.crt"), "w") as f:
                    f.write(src.read())
            with open(os.path.join(d, "token"), "w") as f:
                f.write(ic["mint"](ns, sa))
        return {"KUBERNETES_SERVICE_HOST": ic["host"], "KUBERNETES_SERVICE_PORT": str(ic["port"]),
                "KUBESIM_SERVICEACCOUNT_DIR": d}

    def env_value(self, e, p, ip):
        """A container env var: its value, the downward-API field it refers
        to, or a key of a Secret or ConfigMap (LookupError when missing;
        None when missing and the reference is optional: no variable)."""
        vf = e.get("valueFrom") or {}
        ref = (vf.get("fieldRef") or {}).get("fieldPath")
        fields = {"status.podIP": ip, "metadata.name": p["metadata"]["name"],
                  "metadata.namespace": p["metadata"]["namespace"], "spec.nodeName": "kubesim"}
        if ref:
            return fields.get(ref, "")
        for kind, rkey in (("secretKeyRef", SECRET), ("configMapKeyRef", CM)):
            kr = vf.get(kind)
            if kr:
                try:
                    data = self.store.get(rkey, p["metadata"]["namespace"], kr["name"]).get("data") or {}
                except ApiError:
                    if kr.get("optional"):
                        return None
                    raise LookupError(f'{rkey[2].lower()} "{kr["name"]}" not found')
                if kr.get("key") not in data and kr.get("optional"):
                    return None
                if kr.get("key") not in data:
                    raise LookupError(f'couldn\'t find key {kr.get("key")} in {rkey[2]} '
                                      f'{p["metadata"]["namespace"]}/{kr["name"]}')
                v = data[kr["key"]]
                return base64.b64decode(v).decode() if kind == "secretKeyRef" else v
        return str(e.get("value", ""))

    def volumes(self, p, c):
        """Finds the pod's claims' directories, makes its emptyDirs, writes its
        configMap and secret volumes; returns {mountPath: directory}, or raises LookupError
        naming what is missing. Paths under a mountPath inside the written
        files (a config file naming the model on a claim) are rewritten too."""
        ns, uid = p["metadata"]["namespace"], p["metadata"]["uid"]
        mounts = lambda v: [m["mountPath"].rstrip("/") for m in c.get("volumeMounts") or []  # noqa: E731
                            if m.get("name") == v["name"]]
        dirs, files = {}, []
        for v in p["spec"].get("volumes") or []:
            claim = (v.get("persistentVolumeClaim") or {}).get("claimName")
            if claim:
                try:
                    self.store.get(PVC, ns, claim)
                except ApiError:
                    raise LookupError(f'persistentvolumeclaim "{claim}" not found')
                try:
                    d = self.claim_dir(ns, claim)
                    os.makedirs(d, exist_ok=True)
                except (ValueError, OSError) as e:
                    raise LookupError(f'MountVolume.SetUp failed for volume "{v["name"]}": {e}')
                dirs.update({mp: d for mp in mounts(v)})
                continue
            if "hostPath" in v:  # the node is this machine: the path itself
                hp = v["hostPath"] or {}
                path, kind = str(hp.get("path") or ""), hp.get("type") or ""
                if not path.startswith("/") or any(x in ("", ".", "..") for x in path.split("/")[1:]):
                    raise LookupError(f'hostPath "{path}": not a clean absolute path')
                if kind == "DirectoryOrCreate":
                    os.makedirs(path, exist_ok=True)
                elif kind == "Directory" and not os.path.isdir(path):
                    raise LookupError(f'MountVolume.SetUp failed for volume "{v["name"]}": hostPath type check '
                                      f'failed: {path} is not a directory')
                dirs.update({mp: path for mp in mounts(v)})
                continue
            if "emptyDir" in v:  # the pod's own folder, gone with the pod's data
                d = os.path.join(self.data_dir, "pods", uid, "volumes", v["name"])
                os.makedirs(d, exist_ok=True)
                dirs.update({mp: d for mp in mounts(v)})
                continue
            src = v.get("configMap") or v.get("secret")
            if not src:
                continue
            kind, key = ("configmap", CM) if v.get("configMap") else ("secret", SECRET)
            ref = src.get("name") or src.get("secretName")
            try:
                obj = self.store.get(key, ns, ref)
            except ApiError:
                raise LookupError(f'MountVolume.SetUp failed for volume "{v["name"]}": {kind} "{ref}" not found')
            d = os.path.join(self.data_dir, "pods", uid, "volumes", v["name"])
            os.makedirs(d, exist_ok=True)
            data = dict(obj.get("data") or {})
            if kind == "secret":
                data = {k: base64.b64decode(x).decode() for k, x in data.items()}
            files += [(os.path.join(d, k), x) for k, x in data.items()]
            dirs.update({mp: d for mp in mounts(v)})
        if "" in dirs:
            raise LookupError('a volume mounted at "/" cannot be given here (no mount namespaces)')
        # one pass, the longest mountPath first, only where a path starts (not inside a longer one)
        alts = "|".join(re.escape(mp) for mp in sorted(dirs, key=len, reverse=True))
        pat = re.compile(r"(?<![\w./-])(" + alts + r")(?=[/\s\"']|$)") if dirs else None
        for path, text in files:
            with open(path, "w") as f:
                f.write(pat.sub(lambda m: dirs[m.group(1)], text) if pat else text)
        return dirs

    @staticmethod
    def remap(value, dirs):
        for mp, d in sorted(dirs.items(), key=lambda kv: len(kv[0]), reverse=True):
            if value == mp or value.startswith(mp + "/"):
                return d + value[len(mp):]
        return value

    def command(self, c, env):
        """The image's command plus the container's, with $(VAR) expanded as the kubelet does."""
        base = self.images.get(c.get("image"))
        if base is None:
            return None
        expand = lambda a: re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1), m.group(0)), str(a))  # noqa: E731
        return [expand(a) for a in list(base) + list(c.get("command") or []) + list(c.get("args") or [])]

    @staticmethod
    def gpus_of(p):
        n = 0
        for c in p["spec"].get("containers") or []:
            r = c.get("resources") or {}
            n += int((r.get("limits") or {}).get("nvidia.com/gpu") or (r.get("requests") or {}).get("nvidia.com/gpu") or 0)
        return n

    def schedule(self, p):
        """Places the pod on the node if its GPUs fit; False leaves it Pending."""
        uid = p["metadata"]["uid"]
        if uid in self.bound:
            return True
        want, used = self.gpus_of(p), sum(self.bound.values())
        if want > self.gpus - used:
            msg = ("0/1 nodes are available: 1 Insufficient nvidia.com/gpu. preemption: 0/1 nodes are available: "
                   "1 No preemption victims found for incoming pod.")
            st = {"phase": "Pending", "conditions": [{"type": "PodScheduled", "status": "False",
                                                      "reason": "Unschedulable", "message": msg}]}
            if p.get("status") != st:
                cur = self.store.get(POD, p["metadata"]["namespace"], p["metadata"]["name"])
                cur["status"] = st
                self.store.update(POD, p["metadata"]["namespace"], p["metadata"]["name"], cur, "status")
            return False
        self.bound[uid] = want
        return True

    def log_path(self, uid, container):
        """Where a pod's container writes its output (kubectl logs reads it)."""
        return os.path.join(self.data_dir, "pods", uid, "logs", container.replace("/", "_") + ".log")

    def run_pod(self, p, proc):
        c = (p["spec"].get("containers") or [{}])[0]
        uid = p["metadata"]["uid"]
        if proc.ended:  # a pod that ran to its end holds nothing and needs nothing any more
            return self.set_status(p, proc.ended, False, self.ips.get(uid), proc)
        if not self.schedule(p):
            return
        if uid not in self.ips:
            self.ips[uid] = f"127.0.0.{self.next_ip}"
            self.next_ip = self.next_ip + 1 if self.next_ip < 254 else 2
        ip, now = self.ips[uid], time.monotonic()
        if KUBELET_FINALIZER not in (p["metadata"].get("finalizers") or []):
            cur = self.store.get(POD, p["metadata"]["namespace"], p["metadata"]["name"])
            cur["metadata"]["finalizers"] = (cur["metadata"].get("finalizers") or []) + [KUBELET_FINALIZER]
            p = self.store.update(POD, p["metadata"]["namespace"], p["metadata"]["name"], cur, internal=True)
        env = dict(os.environ, POD_IP=ip, POD_NAME=p["metadata"]["name"], POD_NAMESPACE=p["metadata"]["namespace"],
                   **self.service_account(p))
        try:
            env.update({e["name"]: v for e in c.get("env") or [] if (v := self.env_value(e, p, ip)) is not None})
        except LookupError as e:
            return self.set_status(p, "Pending", False, ip, proc, waiting=("CreateContainerConfigError", str(e)))
        try:
            dirs = self.volumes(p, c) if proc.popen is None else {}
        except LookupError as e:
            return self.set_status(p, "Pending", False, ip, proc, waiting=("ContainerCreating", str(e)))
        env = {k: self.remap(v, dirs) for k, v in env.items()}
        cmd = self.command(c, env)
        cmd = cmd and [self.remap(a, dirs) for a in cmd]
        if cmd is None:
            return self.set_status(p, "Pending", False, ip, proc, waiting=("ErrImagePull",
                                   f'image "{c.get("image")}" is not in the image map'))
        self.enforce_memory(c, proc)
        if proc.popen is not None and proc.popen.poll() is not None:
            rc = proc.popen.returncode
            if not proc.exit_reason:
                proc.exit_reason = f"exit code {rc}"
            oom = proc.exit_reason.startswith("OOMKilled")
            proc.last_state = {"terminated": {"exitCode": 137 if oom else rc,
                                              "reason": "OOMKilled" if oom else "Completed" if rc == 0 else "Error",
                                              "message": proc.exit_reason}}
            proc.popen, proc.ready = None, False
            policy = p["spec"].get("restartPolicy", "Always")
            if policy == "Never" or (policy == "OnFailure" and rc == 0):
                proc.ended = "Succeeded" if rc == 0 else "Failed"
                self.bound.pop(uid, None)  # an ended pod's GPUs are free again
                return self.set_status(p, proc.ended, False, ip, proc)
            proc.reset_probes()
            proc.restarts += 1
            proc.next_start = now + min(10.0, 0.5 * 2 ** (proc.restarts - 1))
        if proc.popen is None and now >= proc.next_start:
            # the container's output, both streams as the kubelet keeps them, for kubectl logs
            log = self.log_path(uid, c.get("name") or "main")
            os.makedirs(os.path.dirname(log), exist_ok=True)
            with open(log, "ab") as out:
                proc.popen = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            proc.started = now
            proc.exit_reason = None
        self.probe(c, ip, proc, now)
        waiting = None if proc.popen else ("CrashLoopBackOff", proc.exit_reason)
        self.set_status(p, "Running" if proc.popen else "Pending", proc.ready, ip, proc, waiting)

    def enforce_memory(self, c, proc):
        """resources.limits.memory: a container past it is killed (SIGKILL) and said OOMKilled, as the
        kernel's cgroup OOM killer and the kubelet do; without a limit nothing is checked."""
        limit = memory_bytes(((c.get("resources") or {}).get("limits") or {}).get("memory", ""))
        if not limit or proc.popen is None or proc.popen.poll() is not None:
            return
        # KUBESIM_MEMORY_SCALE (make asan: 4): a sanitized build's shadow memory and quarantine make its resident
        # memory several times the program's own, which the limits were not set for
        limit = int(limit * float(os.environ.get("KUBESIM_MEMORY_SCALE") or 1))
        used = rss_bytes(proc.popen.pid)
        if used > limit:
            proc.exit_reason = f"OOMKilled: {used >> 20} MiB resident, over the memory limit of {limit >> 20} MiB"
            try:
                os.killpg(proc.popen.pid, signal.SIGKILL)
            except OSError:
                pass
            proc.popen.wait()

    def probe(self, c, ip, proc, now):
        """Startup gates the others; liveness failure restarts; readiness sets Ready."""
        if proc.popen is None:
            return
        sp, st = c.get("startupProbe"), proc.probes["startup"]
        if sp and not st.passed:
            r = step_probe(sp, st, ip, proc.started, now)
            if r == "fail":
                return self.kill(proc, "startup probe failed")
            st.passed = r == "ok"
            if not st.passed:
                return
        lp = c.get("livenessProbe")
        if lp and step_probe(lp, proc.probes["liveness"], ip, proc.started, now) == "fail":
            return self.kill(proc, "liveness probe failed")
        rp = c.get("readinessProbe")
        if not rp:
            proc.ready = True
            return
        r = step_probe(rp, proc.probes["readiness"], ip, proc.started, now)
        if r is not None:
            proc.ready = r == "ok"

    def kill(self, proc, reason):
        """The kubelet restarts a container that fails its probes."""
        proc.ready = False
        proc.exit_reason = reason
        try:
            os.killpg(proc.popen.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def set_status(self, p, phase, ready, ip, proc, waiting=None):
        state = {"waiting": {"reason": waiting[0], "message": waiting[1]}} if waiting else {"running": {}}
        if proc.ended:  # the last run's end is the state, not a last state
            state = proc.last_state
        cs = {"name": (p["spec"].get("containers") or [{}])[0].get("name", "c"), "ready": ready,
              "restartCount": proc.restarts, "started": proc.popen is not None, "state": state}
        if proc.last_state and not proc.ended:
            cs["lastState"] = proc.last_state
        st = {"phase": phase, "podIP": ip, "podIPs": [{"ip": ip}], "containerStatuses": [cs],
              "conditions": [{"type": "PodScheduled", "status": "True"},
                             {"type": "Ready", "status": "True" if ready else "False"},
                             {"type": "ContainersReady", "status": "True" if ready else "False"}]}
        if p.get("status") != st:
            cur = self.store.get(POD, p["metadata"]["namespace"], p["metadata"]["name"])
            cur["status"] = st
            self.store.update(POD, p["metadata"]["namespace"], p["metadata"]["name"], cur, "status")

    def terminate(self, p, proc):
        """SIGTERM, the grace period, SIGKILL; then the pod object goes."""
        self.bound.pop(p["metadata"]["uid"], None)
        if proc.popen is not None and proc.popen.poll() is None:
            grace = p["spec"].get("terminationGracePeriodSeconds", 30)
            os.killpg(proc.popen.pid, signal.SIGTERM)
            try:
                proc.popen.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(proc.popen.pid, signal.SIGKILL)
                proc.popen.wait()
        try:
            cur = self.store.get(POD, p["metadata"]["namespace"], p["metadata"]["name"])
            cur["metadata"]["finalizers"] = [f for f in cur["metadata"].get("finalizers") or []
                                             if f != KUBELET_FINALIZER]
            self.store.update(POD, p["metadata"]["namespace"], p["metadata"]["name"], cur, internal=True)
        except ApiError:
            pass

    # ---- services -----------------------------------------------------------------
    def endpoints(self):
        svcs, _ = self.store.list(SVC)
        self.drop_orphan_endpoints(svcs)
        for s in svcs:
            sel = s.get("spec", {}).get("selector")
            if not sel:
                continue
            ns, name = s["metadata"]["namespace"], s["metadata"]["name"]
            pods, _ = self.store.list(POD, ns)
            ready = [p for p in pods if selector_ok(sel, p["metadata"].get("labels")) and pod_ready(p)
                     and not p["metadata"].get("deletionTimestamp")]
            ports = [{"name": pt.get("name", ""), "port": pt.get("targetPort", pt.get("port")),
                      "protocol": pt.get("protocol", "TCP")} for pt in s["spec"].get("ports") or []]
            subsets = [{"addresses": [{"ip": p["status"]["podIP"], "targetRef": {"kind": "Pod", "name":
                        p["metadata"]["name"], "namespace": ns}} for p in sorted(ready, key=lambda p: p["status"]["podIP"])],
                        "ports": ports}] if ready else []
            self.put(EP, ns, name, {"subsets": subsets}, {"apiVersion": "v1", "kind": "Endpoints"})
            members = [p for p in pods if selector_ok(sel, p["metadata"].get("labels"))
                       and (p.get("status") or {}).get("podIP")]
            eps = [{"addresses": [p["status"]["podIP"]],
                    "conditions": {"ready": pod_ready(p) and not p["metadata"].get("deletionTimestamp"),
                                   "terminating": bool(p["metadata"].get("deletionTimestamp"))},
                    "targetRef": {"kind": "Pod", "name": p["metadata"]["name"], "namespace": ns,
                                  "uid": p["metadata"]["uid"]}}
                   for p in sorted(members, key=lambda p: p["status"]["podIP"])]
            owner = [{"apiVersion": "v1", "kind": "Service", "name": name, "uid": s["metadata"]["uid"],
                      "controller": True, "blockOwnerDeletion": True}]
            self.put(SLICE, ns, f"{name}-kubesim", {"endpoints": eps, "ports": ports},
                     {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice", "addressType": "IPv4",
                      "metadata": {"labels": {"kubernetes.io/service-name": name,
                                              "endpointslice.kubernetes.io/managed-by": "kubesim"},
                                   "ownerReferences": owner}})

    def drop_orphan_endpoints(self, svcs):
        """The Endpoints (and our EndpointSlices) of a Service deleted or no
        longer selecting go, as kube-controller-manager removes them: a
        stale one would keep listing the pods it had as ready."""
        live = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in svcs
                if (s.get("spec") or {}).get("selector")}
        names = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in svcs}
        eps, _ = self.store.list(EP)
        for e in eps:
            key = (e["metadata"]["namespace"], e["metadata"]["name"])
            # (a Service without a selector keeps the Endpoints its owner writes by hand)
            if key not in names:
                self.delete_quietly(EP, *key)
        slices, _ = self.store.list(SLICE)
        for sl in slices:
            lab = sl["metadata"].get("labels") or {}
            key = (sl["metadata"]["namespace"], lab.get("kubernetes.io/service-name"))
            if lab.get("endpointslice.kubernetes.io/managed-by") == "kubesim" and key not in live:
                self.delete_quietly(SLICE, sl["metadata"]["namespace"], sl["metadata"]["name"])

    def delete_quietly(self, rkey, ns, name):
        try:
            self.store.delete(rkey, ns, name)
        except ApiError:
            pass

    def put(self, rkey, ns, name, fields, base):
        """Creates the object or updates the given top-level fields when they changed."""
        try:
            cur = self.store.get(rkey, ns, name)
            if any(cur.get(k) != v for k, v in fields.items()):
                cur.update(fields)
                self.store.update(rkey, ns, name, cur)
        except ApiError as e:
            if e.code != 404:
                raise
            obj = copy.deepcopy(base)
            obj.setdefault("metadata", {})["name"] = name
            obj.update(fields)
            self.store.create(rkey, ns, obj)

    def pid_of(self, uid):
        for (_, _, u), proc in list(self.procs.items()):
            if u == uid and proc.popen is not None and proc.popen.poll() is None:
                return proc.popen.pid
        return None

    def shutdown(self):
        self.stop.set()
        for proc in list(self.procs.values()) + list(self.dying.values()):
            if proc.popen is not None and proc.popen.poll() is None:
                os.killpg(proc.popen.pid, signal.SIGKILL)


def pod_ready(p):
    return any(c.get("type") == "Ready" and c.get("status") == "True"
               for c in (p.get("status") or {}).get("conditions") or [])
