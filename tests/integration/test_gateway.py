"""LLMGateway on kubesim, through real clients (kubectl, the official openai
client): llm-controller runs the gateway's llm-router pods (their own
ServiceAccount reading EndpointSlices and ConfigMaps, a Service, a
disruption budget) and writes the route table of the LLMDeployments its
selector picks; one endpoint serves every model and adapter, a name no
deployment serves gets 404 naming what is served, a deployment that
leaves the selector leaves the table, and a deployment serving a name
another already serves is left out and named in the status."""
import json
import subprocess
import urllib.error
import urllib.request

import openai
import pytest

from harness import tool, wait_for

DEPLOYMENT = """apiVersion: llmk8s.io/v1alpha1
kind: LLMDeployment
metadata: {{name: {name}, labels: {{team: {team}}}}}
spec:
  image: llm-server:test
  replicas: 1
  model:
    path: {model}
    name: {served}
    volume: {{hostPath: {{path: {dir}}}}}
  engine: {{threads: 1, contextLength: 128, maxSeqs: 4}}
  probes: {{shutdownDelaySeconds: 1, drainSeconds: 5}}
{extra}"""

GATEWAY = """apiVersion: llmk8s.io/v1alpha1
kind: LLMGateway
metadata: {name: front}
spec:
  selector: {matchLabels: {team: a}}
  replicas: 2
  image: llm-router:test
"""


def deploy(c, name, team, served, model, extra=""):
    c.k("apply", "-f", "-", stdin=DEPLOYMENT.format(name=name, team=team, served=served, model=model, dir=model.parent,
                                                     extra=extra))


def gw_status(c):
    return (c.get("llmgw", "front") or {}).get("status") or {}


def test_gateway_fronts_the_deployments_it_selects(cluster, tmp_path):
    pytest.importorskip("kubernetes")
    c = cluster
    files = tmp_path / "files"
    files.mkdir()
    base = files / "model.gguf"
    base.symlink_to(c.model)
    subprocess.run([tool("llm-mkmodel"), "--lora-of", str(c.model), "--rank", "4", "-o", str(files / "ad.gguf")],
                   check=True, capture_output=True)
    c.controller()
    deploy(c, "base", "a", "base-m", base)
    deploy(c, "tuned", "a", "tuned-m", base, f"  adapters:\n  - {json.dumps({'name': 'ad', 'path': str(files / 'ad.gguf')})}\n")
    deploy(c, "other", "b", "other-m", base)
    for bad in ("g" * 56, "1front"):  # its Service and NAME-gateway Deployment are named from it
        r = c.k("apply", "-f", "-", check=False, stdin=GATEWAY.replace("name: front", f"name: {bad}"))
        assert r.returncode and "DNS-1035 label of at most 55" in r.stderr, (bad, r.stderr)
    c.k("apply", "-f", "-", stdin=GATEWAY)
    st = wait_for(lambda: (s := gw_status(c)).get("phase") == "Ready" and s.get("deployments") == 2 and s, 120,
                  "the gateway ready in front of two deployments")
    assert st["models"] == [{"name": "base-m", "deployment": "base", "adapter": False},
                            {"name": "tuned-m", "deployment": "tuned", "adapter": False},
                            {"name": "ad", "deployment": "tuned", "adapter": True}], st
    assert st["endpoint"] == "http://front.default.svc:8000" and st["conflicts"] == []
    assert c.get("pdb", "front-gateway")["spec"]["maxUnavailable"] == 1
    rules = c.get("role", "front-gateway")["rules"]
    assert {r["resources"][0] for r in rules} == {"endpointslices", "configmaps"}
    assert all(set(r["verbs"]) == {"get", "list", "watch"} for r in rules)
    table = json.loads(c.get("configmap", "front-gateway-routes")["data"]["routes.json"])
    assert [r["name"] for r in table["routes"]] == ["base", "tuned"]
    ips = wait_for(lambda: len(ips := c.ready_ips("front")) == 2 and ips, 60, "both gateway pods ready")

    oa = openai.OpenAI(base_url=f"http://{ips[0]}:8000/v1", api_key="none", max_retries=0, timeout=60)
    wait_for(lambda: {m.id for m in oa.models.list().data} == {"base-m", "tuned-m", "ad"}, 60,
             "the gateway listing every model and the adapter its pod loaded")
    for model in ("base-m", "tuned-m", "ad"):
        r = oa.completions.create(model=model, prompt="Once upon a time", max_tokens=2)
        assert r.model == model and r.choices[0].text is not None
    with pytest.raises(openai.NotFoundError) as e:
        oa.completions.create(model="other-m", prompt="x", max_tokens=1)
    assert "model 'other-m' is not served here; served: base-m, tuned-m, ad" in str(e.value), e.value

    # a deployment serving a name another serves: left out, said in the status
    deploy(c, "dup", "a", "base-m", base)
    wait_for(lambda: gw_status(c).get("conflicts") == ["dup: base-m is served by base"], 60, "the conflict named")
    # a deployment that leaves the selector leaves the table (a reload of the running pods, no restart)
    c.k("label", "llmd", "tuned", "team=b", "--overwrite")
    wait_for(lambda: gw_status(c).get("deployments") == 1 and [m["name"] for m in gw_status(c)["models"]] == ["base-m"],
             60, "tuned left the gateway")
    wait_for(lambda: {m.id for m in oa.models.list().data} == {"base-m"}, 60, "the pods following the new table")
    with pytest.raises(openai.NotFoundError):
        oa.completions.create(model="tuned-m", prompt="x", max_tokens=1)
    assert oa.completions.create(model="base-m", prompt="Once", max_tokens=1).model == "base-m"
    out = c.k("get", "llmgw").stdout
    assert "front" in out and "True" in out, out
    oa.close()
    c.k("delete", "llmgw", "front")
    wait_for(lambda: all(c.get(kind, name) is None for kind, name in
                         (("deployment", "front-gateway"), ("service", "front"), ("configmap", "front-gateway-routes"),
                          ("pdb", "front-gateway"))), 60, "the gateway's children gone with it")


def test_gateway_keys_and_limits_from_a_secret(cluster, tmp_path):
    """spec.auth.secretName: the gateway's pods read the keys from the Secret (mounted, the CRD's path):
    without a key 401, a tenant over its rpm 429 through the openai client; each pod holds its share
    (status.quotas says so: no Redis named)."""
    c = cluster
    files = tmp_path / "files"
    files.mkdir()
    base = files / "model.gguf"
    base.symlink_to(c.model)
    c.controller()
    deploy(c, "base", "a", "base-m", base)
    c.k("create", "secret", "generic", "front-keys", "--from-literal=keys=sk-a tenant=A rpm=3\nsk-b tenant=B\n")
    c.k("apply", "-f", "-", stdin=GATEWAY.replace("replicas: 2", "replicas: 1") +
        "  auth: {secretName: front-keys}\n")
    st = wait_for(lambda: (s := gw_status(c)).get("phase") == "Ready" and s, 120, "the gateway ready")
    assert "each of the 1 gateway pods holds 1/1" in st["quotas"], st
    ip = wait_for(lambda: (ips := c.ready_ips("front")) and ips[0], 60, "the gateway pod ready")
    base_url = f"http://{ip}:8000/v1"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=60).models.list()
    b = openai.OpenAI(base_url=base_url, api_key="sk-b", max_retries=0, timeout=60)
    wait_for(lambda: {m.id for m in b.models.list().data} == {"base-m"}, 60, "the gateway listing the model")
    a = openai.OpenAI(base_url=base_url, api_key="sk-a", max_retries=0, timeout=60)
    for _ in range(3):
        assert a.completions.create(model="base-m", prompt="Once", max_tokens=1).model == "base-m"
    with pytest.raises(openai.RateLimitError) as e:
        a.completions.create(model="base-m", prompt="Once", max_tokens=1)
    assert "tenant 'A' is over its rpm of 3" in str(e.value), e.value
    assert b.completions.create(model="base-m", prompt="Once", max_tokens=1).model == "base-m"  # B has no limit
    # /metrics (every route's traffic): a tenant key on the API port, none on the health port, which the
    # Service does not carry and the probes use
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(f"http://{ip}:8000/metrics", timeout=5)
    assert e.value.code == 401
    page = urllib.request.urlopen(f"http://{ip}:8001/metrics?route=base", timeout=5).read().decode()
    assert "llm_router_requests_total{" in page and 'route="base"' in page, page[:500]
    pod = json.loads(c.k("get", "deploy", "front-gateway", "-o", "json").stdout)["spec"]["template"]["spec"]
    ctr = pod["containers"][0]
    assert ctr["readinessProbe"]["httpGet"]["port"] == 8001 and ctr["livenessProbe"]["httpGet"]["port"] == 8001
    svc = json.loads(c.k("get", "svc", "front", "-o", "json").stdout)["spec"]["ports"]
    assert [p["port"] for p in svc] == [8000], svc
    # the CRD's rules: an ACL user needs its password, and both need a Redis
    for quotas, why in (("{redis: 'redis.x:6379', user: gw}", "quotas.user needs quotas.passwordSecret"),
                        ("{passwordSecret: rpw}", "are for quotas.redis")):
        r = c.k("apply", "-f", "-", check=False, stdin=GATEWAY.replace("name: front", "name: bad") +
                f"  auth: {{secretName: front-keys}}\n  quotas: {quotas}\n")
        assert r.returncode != 0 and why in r.stderr, r.stderr
