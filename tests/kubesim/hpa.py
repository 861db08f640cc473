"""hpa.py - the HorizontalPodAutoscaler controller (autoscaling/v2), as
kube-controller-manager runs it: for each metric a desired count
ceil(current * value / target) (within a 10% tolerance nothing changes),
the largest wins, clamped to [minReplicas, maxReplicas]; scale-down takes
the highest recommendation of its stabilization window (default 300 s),
scale-up of its own (default 0 s); the target is scaled through its scale
paths. Pods metrics are read from each ready pod's /metrics (Prometheus
text, all series of the name summed; port from the kubesim.io/metrics-port
annotation or the first containerPort); Resource cpu from the pod process's
CPU time."""
import math
import os
import re
import threading
import time
import urllib.request

from paths import jsonpath, set_path
from store import ApiError, now

HPA = ("autoscaling", "horizontalpodautoscalers", "HorizontalPodAutoscaler")
POD = ("", "pods", "Pod")
TOLERANCE = 0.1


def quantity(q):
    m = re.fullmatch(r"([0-9.]+)([mkMG]?)", str(q).strip())
    if not m:
        raise ValueError(f"bad quantity {q!r}")
    return float(m.group(1)) * {"": 1, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9}[m.group(2)]


def scrape(ip, port, name):
    text = urllib.request.urlopen(f"http://{ip}:{port}/metrics", timeout=2).read().decode()
    total, seen = 0.0, False
    for line in text.splitlines():
        if line.startswith("#") or not line.strip():
            continue
        m = re.match(r"([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)", line)
        if m and m.group(1) == name:
            total += float(m.group(3))
            seen = True
    if not seen:
        raise ValueError(f"metric {name} not exported")
    return total


class Autoscaler:
    def __init__(self, api, workloads, period):
        self.api, self.workloads, self.period = api, workloads, period
        self.history = {}   # hpa uid -> [(time, recommendation)]
        self.cpu = {}       # pod uid -> (time, cpu seconds)
        threading.Thread(target=self.loop, daemon=True).start()

    def loop(self):
        while True:
            time.sleep(self.period)
            items, _ = self.api.store.list(HPA)
            for h in items:
                try:
                    self.sync(h)
                except (ApiError, ValueError, OSError) as e:
                    self.condition(h, "ScalingActive", "False", "FailedGetMetrics", str(e))

    def target(self, h):
        ref = h["spec"]["scaleTargetRef"]
        group = ref.get("apiVersion", "").rpartition("/")[0]
        for r in self.api.resources.values():
            if r.group == group and r.kind == ref["kind"] and r.scale:
                return r, self.api.store.get(r.key, h["metadata"]["namespace"], ref["name"])
        raise ValueError(f"scale target {ref.get('kind')}/{ref.get('name')} has no scale subresource")

    def pods(self, ns, selector):
        want = dict(kv.split("=", 1) for kv in selector.split(",") if "=" in kv)
        items, _ = self.api.store.list(POD, ns)
        return [p for p in items if all((p["metadata"].get("labels") or {}).get(k) == v for k, v in want.items())
                and any(c.get("type") == "Ready" and c.get("status") == "True"
                        for c in (p.get("status") or {}).get("conditions") or [])]

    def metric_ratio(self, m, pods):
        if m["type"] == "Pods":
            name, target = m["pods"]["metric"]["name"], quantity(m["pods"]["target"]["averageValue"])
            vals = [scrape(p["status"]["podIP"], metrics_port(p), name) for p in pods]
            avg = sum(vals) / len(vals)
            return avg / target, {"type": "Pods", "pods": {"metric": {"name": name},
                                                           "current": {"averageValue": f"{avg:g}"}}}
        if m["type"] == "Resource" and m["resource"]["name"] == "cpu":
            util = [self.cpu_util(p) for p in pods]
            util = [u for u in util if u is not None]
            if not util:
                raise ValueError("no CPU samples yet")
            avg = sum(util) / len(util)
            target = m["resource"]["target"]["averageUtilization"]
            return avg / target, {"type": "Resource", "resource": {"name": "cpu",
                                                                   "current": {"averageUtilization": round(avg)}}}
        raise ValueError(f"metric type {m.get('type')} not supported")

    def cpu_util(self, p):
        """Percent of the pod's cpu request used since the last sample."""
        pid = self.workloads.pid_of(p["metadata"]["uid"])
        req = (((p["spec"].get("containers") or [{}])[0].get("resources") or {}).get("requests") or {}).get("cpu")
        if pid is None or not req:
            return None
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        t, last = time.monotonic(), self.cpu.get(p["metadata"]["uid"])
        self.cpu[p["metadata"]["uid"]] = (t, cpu)
        if last is None or t <= last[0]:
            return None
        return (cpu - last[1]) / (t - last[0]) / quantity(req) * 100

    def sync(self, h):
        r, obj = self.target(h)
        spec, ns = h["spec"], h["metadata"]["namespace"]
        cur = jsonpath(obj, r.scale["specReplicasPath"]) or 0
        sel = jsonpath(obj, r.scale.get("labelSelectorPath", "")) or ""
        pods = self.pods(ns, sel) if sel else []
        if not pods:
            raise ValueError("no ready pods to read metrics from")
        proposals, current = [], []
        for m in spec.get("metrics") or []:
            ratio, c = self.metric_ratio(m, pods)
            current.append(c)
            proposals.append(cur if abs(ratio - 1) <= TOLERANCE else math.ceil(len(pods) * ratio))
        desired = max(proposals) if proposals else cur
        desired = min(max(desired, spec.get("minReplicas", 1)), spec["maxReplicas"])
        desired = self.stabilize(h, cur, desired)
        if desired != cur:
            obj["metadata"].pop("resourceVersion", None)
            set_path(obj, r.scale["specReplicasPath"], desired)
            self.api.store.update(r.key, ns, obj["metadata"]["name"], obj, status_sub="status" in r.subresources)
        hs = self.api.store.get(HPA, ns, h["metadata"]["name"])
        hs["status"] = {"currentReplicas": cur, "desiredReplicas": desired, "currentMetrics": current,
                        "lastScaleTime": now() if desired != cur else (h.get("status") or {}).get("lastScaleTime"),
                        "conditions": [{"type": "ScalingActive", "status": "True", "reason": "ValidMetricFound"}]}
        self.api.store.update(HPA, ns, h["metadata"]["name"], hs, "status")

    def stabilize(self, h, cur, desired):
        t = time.monotonic()
        beh = h["spec"].get("behavior") or {}
        down = (beh.get("scaleDown") or {}).get("stabilizationWindowSeconds", 300)
        up = (beh.get("scaleUp") or {}).get("stabilizationWindowSeconds", 0)
        hist = [(ts, v) for ts, v in self.history.get(h["metadata"]["uid"], []) if t - ts <= max(down, up)]
        hist.append((t, desired))
        self.history[h["metadata"]["uid"]] = hist
        if desired < cur:  # scale down to the highest recommendation in the window
            return min(cur, max(v for ts, v in hist if t - ts <= down))
        if desired > cur:  # scale up to the lowest recommendation in the window
            return max(cur, min(v for ts, v in hist if t - ts <= up))
        return cur

    def condition(self, h, ctype, status, reason, message):
        try:
            hs = self.api.store.get(HPA, h["metadata"]["namespace"], h["metadata"]["name"])
            st = hs.get("status") or {}
            st["conditions"] = [{"type": ctype, "status": status, "reason": reason, "message": message}]
            hs["status"] = st
            self.api.store.update(HPA, h["metadata"]["namespace"], h["metadata"]["name"], hs, "status")
        except ApiError:
            pass


def metrics_port(p):
    ann = (p["metadata"].get("annotations") or {}).get("kubesim.io/metrics-port")
    if ann:
        return int(ann)
    for c in p["spec"].get("containers") or []:
        for port in c.get("ports") or []:
            return port["containerPort"]
    raise ValueError(f"pod {p['metadata']['name']} has no port to scrape")
