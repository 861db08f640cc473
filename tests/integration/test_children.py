"""What the spec says is what the children carry, on kubesim with the real
controller: its server-side applies merge podTemplate labels, take out
what the spec no longer names (nodeSelector, tolerations, affinity,
priorityClassName), put a hand-edited field of ours back while leaving
other managers' fields alone, write nothing at rest, and never take over
an object of a child's name that is not theirs."""
import json

from harness import api_requests, metrics, wait_for


PLACEMENT = """  nodeSelector: {disk: ssd}
  tolerations: [{key: gpu, operator: Exists, effect: NoSchedule}]
  affinity: {nodeAffinity: {requiredDuringSchedulingIgnoredDuringExecution: {nodeSelectorTerms: [{matchExpressions: [{key: zone, operator: In, values: [a]}]}]}}}
  priorityClassName: high
  podTemplate:
    metadata: {labels: {team: search}, annotations: {note: kept}}
"""


def template(c):
    dep = c.get("deployment", "story") or {}
    return (dep.get("spec") or {}).get("template") or {}


def test_spec_removals_drift_and_other_managers(cluster):  # noqa: F811
    c = cluster
    _, url = c.controller()
    c.apply(replicas=0, extra=PLACEMENT)
    t = wait_for(lambda: (t := template(c)).get("spec", {}).get("nodeSelector") and t, 30)
    labels = t["metadata"]["labels"]
    assert labels["team"] == "search" and labels["app.kubernetes.io/instance"] == "story"  # merged, selector kept
    assert t["metadata"]["annotations"]["note"] == "kept"
    pod = t["spec"]
    assert pod["tolerations"][0]["key"] == "gpu" and pod["priorityClassName"] == "high" and "nodeAffinity" in pod["affinity"]
    # Pod Security "restricted" asks for these of every pod
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"} and pod["securityContext"]["runAsNonRoot"]
    ctr = pod["containers"][0]["securityContext"]
    assert ctr["allowPrivilegeEscalation"] is False and ctr["capabilities"] == {"drop": ["ALL"]}
    # another manager's field on the Deployment: kept through our applies
    c.k("annotate", "deployment", "story", "example.com/owner=platform")
    # the spec loses its placement: the Deployment does too
    c.apply(replicas=0)
    t = wait_for(lambda: "nodeSelector" not in (t := template(c)).get("spec", {}) and t, 30)
    assert not {"tolerations", "affinity", "priorityClassName"} & set(t["spec"]), t["spec"]
    assert "team" not in t["metadata"]["labels"] and "note" not in t["metadata"].get("annotations", {})
    # a hand edit of a field of ours is put back (the Deployment's change queues its owner)
    c.k("set", "image", "deployment/story", "llm-server=evil:1")
    wait_for(lambda: template(c)["spec"]["containers"][0]["image"] == "llm-server:test", 30)
    # ... and said: the event names the manager whose field was taken back (kubectl's)
    taken = wait_for(lambda: [e for e in json.loads(c.k("get", "events", "--field-selector", "reason=FieldsTakenBack",
                                                        "-o", "json").stdout)["items"]], 30)
    assert any("kubectl" in e["message"] and "image" in e["message"] for e in taken), [e["message"] for e in taken]
    # two of our fields at once (the API server lists them): both back, both named
    c.k("patch", "deployment", "story", "--type=json", "-p",
        '[{"op":"replace","path":"/spec/template/spec/containers/0/image","value":"evil:2"},'
        '{"op":"replace","path":"/spec/strategy/rollingUpdate/maxSurge","value":3}]')
    wait_for(lambda: (d := c.get("deployment", "story"))["spec"]["strategy"]["rollingUpdate"]["maxSurge"] != 3
             and d["spec"]["template"]["spec"]["containers"][0]["image"] == "llm-server:test", 30)
    taken = wait_for(lambda: [e["message"] for e in json.loads(c.k("get", "events", "--field-selector",
                                                                   "reason=FieldsTakenBack", "-o", "json").stdout)["items"]
                              if "2 conflicts" in e["message"]], 30)
    assert "maxSurge" in taken[0] and "image" in taken[0], taken
    dep = c.get("deployment", "story")
    assert dep["metadata"]["annotations"]["example.com/owner"] == "platform"
    managers = {m["manager"] for m in json.loads(c.k("get", "deployment", "story", "-o", "json",
                                                      "--show-managed-fields").stdout)["metadata"]["managedFields"]}
    assert "llm-controller" in managers, managers
    # at rest: a reconcile (queued by another manager's change to a child) writes nothing
    def writes():
        return api_requests(url, "PATCH") + api_requests(url, "POST") + api_requests(url, "PUT")

    def reconciles():
        return metrics(url)[("llm_controller_reconciles_total", (("result", "success"),))]
    wait_for(lambda: c.status().get("phase") == "Idle", 30)
    for poke in ("1", "2"):  # the first flushes what the image fix left queued
        w0, r0 = writes(), reconciles()
        c.k("annotate", "deployment", "story", f"example.com/poke={poke}", "--overwrite")
        wait_for(lambda: reconciles() > r0, 30)
    assert writes() == w0, "a reconcile at rest wrote"
    # nor read: the LLMDeployment and its children come from the informers' caches
    a0, r0 = api_requests(url), reconciles()
    c.k("annotate", "deployment", "story", "example.com/poke=3", "--overwrite")
    wait_for(lambda: reconciles() > r0, 30)
    assert api_requests(url) == a0, "a reconcile at rest asked the API server"

def test_foreign_child_is_not_taken(cluster):  # noqa: F811
    c = cluster
    c.controller()
    c.k("create", "service", "clusterip", "story", "--tcp=80:8080")
    before = c.get("service", "story")
    c.apply(replicas=0)
    cond = wait_for(lambda: (d := c.cond("Degraded")).get("reason") == "ChildConflict" and d, 30)
    assert "Service story exists and is not this LLMDeployment's" in cond["message"], cond
    assert "no controlling owner" in cond["message"] and "kubectl-create" in cond["message"]
    svc = c.get("service", "story")
    assert svc["spec"]["selector"] == before["spec"]["selector"] and not svc["metadata"].get("ownerReferences")
    assert svc["metadata"]["resourceVersion"] == before["metadata"]["resourceVersion"]
    events = c.k("get", "events", "--field-selector", "reason=ChildConflict", "-o", "name").stdout
    assert events.strip(), "no ChildConflict event"
    # its owner removes it: the controller makes its own and the condition clears
    c.k("delete", "service", "story")
    wait_for(lambda: ((c.get("service", "story") or {}).get("metadata") or {}).get("ownerReferences"), 40)
    wait_for(lambda: c.cond("Degraded").get("status") == "False", 30)


def test_one_namespace_and_a_long_model_path(cluster):  # noqa: F811
    """--namespace: only that namespace's LLMDeployments are managed (the
    chart's watchNamespace). A model path as long as the CRD allows reaches
    llm-server's configuration whole (it was cut at 4 KiB of YAML)."""
    c = cluster
    c.k("create", "namespace", "team-a")
    c.controller("--namespace", "team-a")
    long_dir = "/m/" + "d" * 4000
    doc = ("apiVersion: llmk8s.io/v1alpha1\nkind: LLMDeployment\nmetadata: {{name: s, namespace: {ns}}}\n"
           "spec: {{replicas: 0, model: {{path: {path}}}}}\n")
    c.k("apply", "-f", "-", stdin=doc.format(ns="team-a", path=long_dir + "/x.gguf"))
    c.k("apply", "-f", "-", stdin=doc.format(ns="default", path="/m/x.gguf"))
    cm = wait_for(lambda: json.loads(r.stdout) if not (r := c.k("-n", "team-a", "get", "cm", "s-config", "-o", "json",
                                                                 check=False)).returncode else None, 30)
    assert f'model: "{long_dir}/x.gguf"' in cm["data"]["config.yaml"]
    assert cm["data"]["config.yaml"].rstrip().endswith("drain_timeout_s: 30")
    wait_for(lambda: json.loads(c.k("-n", "team-a", "get", "llmd", "s", "-o", "json").stdout).get("status"), 30)
    assert c.get("deployment", "s") is None and not (c.get("llmd", "s") or {}).get("status")  # default: not ours


def test_router_children_at_rest(cluster):  # noqa: F811
    """With spec.router the router's Deployment, Services, ServiceAccount,
    Role and RoleBinding are read from the informers' caches too: a
    reconcile at rest asks the API server nothing."""
    c = cluster
    _, url = c.controller()
    c.apply(replicas=0, extra="  router: {enabled: true, image: llm-router:test, replicas: 1}\n")
    wait_for(lambda: c.get("rolebinding", "story-router") is not None and c.status().get("phase") == "Idle", 60)

    def reconciles():
        return metrics(url)[("llm_controller_reconciles_total", (("result", "success"),))]
    for poke in ("1", "2"):  # the first flushes what creating them left queued
        a0, r0 = api_requests(url), reconciles()
        c.k("annotate", "llmd", "story", f"example.com/poke={poke}", "--overwrite")
        wait_for(lambda: reconciles() > r0, 30)
    assert api_requests(url) == a0, f"{api_requests(url) - a0} API requests for a reconcile at rest"
