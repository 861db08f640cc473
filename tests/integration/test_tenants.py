"""Tenants at the gateway (llm-router --api-keys-file): API keys checked at
the edge, each tenant's rpm, tpm and max_inflight held across two router
replicas through a real redis-server (Debian's), the fail modes when Redis
stops, and the tenant header only the gateway's own key may set at a pod -
through the official openai client and raw HTTP."""
import json
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import openai
import pytest

from harness import NAME, FakeBackend, Router, Server, free_port, tool, wait_for

PROMPT = "Once upon a time " + " ".join(f"the {k}th rabbit met the {k + 1}th fox by the river." for k in range(24))


def start_redis(tmp_path, *extra):
    """A redis-server on a free port (extra: its settings): (address, process)."""
    exe = shutil.which("redis-server")
    if not exe:
        pytest.skip("redis-server missing (Debian's redis-server package; make deps installs it)")
    port = free_port()
    p = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                          "--dir", str(tmp_path), *extra], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)

    def up():  # (with a password: NOAUTH, which is an answer too)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith((b"+PONG", b"-NOAUTH"))
        except OSError:
            return False
    wait_for(up, 30, "redis-server answering PING")
    return f"127.0.0.1:{port}", p


@pytest.fixture()
def redis(tmp_path):
    """A redis-server on a free port: (address, process)."""
    addr, p = start_redis(tmp_path)
    yield addr, p
    if p.poll() is None:
        p.terminate()
        p.wait(timeout=30)


def post(base, body, key=None, headers=None, timeout=120):
    h = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {}), **(headers or {})}
    req = urllib.request.Request(base + "/v1/completions", json.dumps(body).encode(), h)
    try:
        r = urllib.request.urlopen(req, timeout=timeout)
        return r.status, json.loads(r.read()), r.headers
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null"), e.headers


def ask(**kw):
    return {"model": NAME, "prompt": "Once upon a time", "max_tokens": 2, "temperature": 0, **kw}


@pytest.fixture()
def gateway(tmp_path, models, redis):
    """One pod that trusts the gateway's key, two router replicas sharing Redis."""
    (tmp_path / "pod-keys").write_text("sk-gw tenant=gateway gateway=1\nsk-direct tenant=B\n")
    (tmp_path / "keys").write_text("sk-a tenant=A rpm=30\nsk-b tenant=B tpm=300\nsk-c tenant=C max_inflight=1\n"
                                   "sk-d tenant=D\n")
    (tmp_path / "upstream").write_text("sk-gw\n")
    hp = free_port()  # the pod's /metrics needs a key on its API port: the routers poll its health port
    pod = Server(models("llama-110m", "Q8_0"), "--api_keys_file", tmp_path / "pod-keys", "--health_port", hp)
    args = ["--backend", pod.base, "--metrics-port", hp, "--api-keys-file", tmp_path / "keys", "--upstream-key-file", tmp_path / "upstream",
            "--quota-redis", redis[0], "--quota-share", 2, "--quota-prefix", f"test-{free_port()}",
            "--quota-timeout-ms", 2000]  # (100 by default: a loaded 2-core machine answers slower now and then)
    routers = [Router(*args), Router(*args)]
    for r in routers:
        wait_for(lambda: r.metrics().get(("llm_router_backend_up", (("backend", pod.base),))) == 1, 30,
                 "the router polling its pod")
    yield pod, routers, args, redis
    for r in routers:
        if r.proc.poll() is None:
            r.stop()
    pod.stop()


def test_keys_partitions_and_the_tenant_header(gateway):
    """401 without a gateway key; the pod sees the tenant the gateway found, not one the client names:
    a prompt tenant D sent is cached for D, and tenant A forging X-LLM-Tenant: D through the gateway gets
    none of it. At the pod, only the gateway's key may send the header (403 for another key), and with it the
    header does pick the tenant's partition."""
    pod, (r1, r2), _, _ = gateway
    with pytest.raises(openai.AuthenticationError) as e:
        r1.client().completions.create(**ask())
    assert e.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=r1.base + "/v1", api_key="sk-gw", max_retries=0).completions.create(**ask())
    # the API port's /metrics (every route's traffic) needs a tenant key; the health port's does not
    with pytest.raises(urllib.error.HTTPError) as e:
        r1.metrics(api=True)
    assert e.value.code == 401 and b"the health port serves it" in e.value.read()
    with pytest.raises(urllib.error.HTTPError) as e:
        r1.metrics(api=True, headers={"Authorization": "Bearer sk-gw"})  # the pods' key is no tenant's here
    assert e.value.code == 401
    m = r1.metrics(api=True, headers={"Authorization": "Bearer sk-d"})
    assert m[("llm_router_unauthorized_total", ())] == 4  # the two requests' 401s and the two pages'
    d = openai.OpenAI(base_url=r1.base + "/v1", api_key="sk-d", max_retries=0)
    assert [m.id for m in d.models.list().data] == [NAME]
    first = d.completions.create(**ask(prompt=PROMPT))
    again = d.completions.create(**ask(prompt=PROMPT))
    assert first.usage.prompt_tokens > 256
    assert again.usage.prompt_tokens_details.cached_tokens >= 256  # D's own partition: cached
    s, forged, _ = post(r2.base, ask(prompt=PROMPT), key="sk-a", headers={"X-LLM-Tenant": "D"})
    assert s == 200 and forged["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, forged["usage"]
    # at the pod itself: a client's key may not name a tenant; the gateway's may, and it counts
    s, body, _ = post(pod.base, ask(), key="sk-direct", headers={"X-LLM-Tenant": "D"})
    assert s == 403 and "gateway=1" in body["error"]["message"], body
    s, body, _ = post(pod.base, ask(), key="sk-gw", headers={"X-LLM-Tenant": "bad name"})
    assert s == 400, body
    s, body, _ = post(pod.base, ask(prompt=PROMPT), key="sk-gw", headers={"X-LLM-Tenant": "D"})
    assert s == 200 and body["usage"]["prompt_tokens_details"]["cached_tokens"] >= 256, body["usage"]


def test_rpm_and_tpm_hold_across_two_replicas_over_a_minute(gateway):
    """For a minute, tenant A (rpm 30) sends as fast as it can through one router replica, and tenant B
    (tpm 300) through both in turn: A gets exactly 30 requests in (its whole limit at one replica, where that
    replica's share alone would be 15) and is then refused at the other replica too, which it never used;
    B's answers carry 300 tokens and at most 5% more (an answer running when B reaches its limit still
    finishes). Every refusal is a 429 with Retry-After naming the limit; the openai client sees
    RateLimitError. So the limits are the tenant's, counted in Redis, not each replica's."""
    _, (r1, r2), _, _ = gateway
    results, other = {"A": [], "B": []}, []
    t_end = time.monotonic() + 60

    def at_the_other_replica():  # A, 30 s in (its limit long reached, its first requests still in the minute)
        try:
            openai.OpenAI(base_url=r2.base + "/v1", api_key="sk-a", max_retries=0).completions.create(**ask())
            other.append("let in")
        except openai.RateLimitError as e:
            other.append(e)

    def hammer(tenant, key, replicas):
        i = 0
        while time.monotonic() < t_end:
            if tenant == "A" and not other and time.monotonic() > t_end - 30:
                at_the_other_replica()
            s, body, h = post(replicas[i % len(replicas)].base, ask(max_tokens=8), key=key)
            results[tenant].append((s, body, h.get("Retry-After")))
            i += 1
            if s == 429:
                time.sleep(0.2)
    threads = [threading.Thread(target=hammer, args=a) for a in (("A", "sk-a", (r1,)), ("B", "sk-b", (r1, r2)))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    ok_a = [b for s, b, _ in results["A"] if s == 200]
    assert len(ok_a) == 30, (len(ok_a), len(results["A"]))
    tokens_b = sum(b["usage"]["total_tokens"] for s, b, _ in results["B"] if s == 200)
    assert 300 <= tokens_b <= 315, tokens_b
    refused = [(s, b, ra) for t in results for s, b, ra in results[t] if s != 200]
    assert refused and all(s == 429 and ra and int(ra) >= 1 for s, _, ra in refused), refused[:3]
    assert any(b["error"]["code"] == "rate_limit_exceeded" and "rpm of 30" in b["error"]["message"] and "Redis" in
               b["error"]["message"] for _, b, _ in refused)
    assert any(b["error"]["code"] == "tokens_limit_exceeded" and "tpm of 300" in b["error"]["message"]
               for _, b, _ in refused)
    assert len(other) == 1 and isinstance(other[0], openai.RateLimitError), other  # at the replica A never used
    m1, m2 = r1.metrics(), r2.metrics()
    n = sum(m[("llm_router_tenant_refused_total", (("limit", "rpm"),))] for m in (m1, m2))
    assert n >= 1 and m1[("llm_router_quota_shared", ())] == 1


def test_max_inflight_across_replicas_and_redis_stopping(gateway):
    """Tenant C (max_inflight 1): while its long request runs through one replica, the other refuses its
    next (429, concurrency); once it ends, the next goes in. Redis stopped: the replicas fail closed by
    default (503 naming the store) for tenants with limits, a tenant without limits is still served, and a
    replica started with --quota-fail open holds its own share instead."""
    pod, (r1, r2), args, (addr, redis_proc) = gateway
    long_done = {}

    def long_request():
        long_done["r"] = post(r1.base, ask(max_tokens=300, ignore_eos=True), key="sk-c")
    t = threading.Thread(target=long_request)
    t.start()
    wait_for(lambda: r1.metrics().get(("llm_router_backend_inflight", (("backend", pod.base),)), 0) >= 1, 30,
             "the long request running (300 tokens: seconds)")
    s, body, h = post(r2.base, ask(), key="sk-c")
    t.join(timeout=120)
    assert long_done["r"][0] == 200
    assert s == 429 and body["error"]["code"] == "concurrency_limit_exceeded" and h.get("Retry-After"), body
    assert post(r2.base, ask(), key="sk-c")[0] == 200
    redis_proc.terminate()
    redis_proc.wait(timeout=30)
    s, body, h = post(r1.base, ask(), key="sk-a")
    assert s == 503 and body["error"]["code"] == "quota_store_unavailable" and h.get("Retry-After"), body
    assert "fails closed" in body["error"]["message"]
    assert post(r2.base, ask(), key="sk-d")[0] == 200  # no limits: Redis is not needed
    r3 = Router(*args, "--quota-fail", "open")
    try:
        wait_for(lambda: r3.metrics().get(("llm_router_backend_up", (("backend", pod.base),))) == 1, 30,
                 "the router polling its pod")
        codes = [post(r3.base, ask(max_tokens=1), key="sk-a")[0] for _ in range(20)]
        assert codes.count(200) == 15 and codes.count(429) == 5, codes  # its share of 30, alone
        assert r3.metrics()[("llm_router_quota_store_errors_total", ())] >= 1
    finally:
        assert r3.stop() == 0


def test_what_the_pods_are_sent(tmp_path):
    """A backend that records its headers: with --upstream-key-file it gets the gateway's key and exactly one
    X-LLM-Tenant, the tenant of the client's key, whatever the client sent in that header; without, the
    client's key and no X-LLM-Tenant at all. A key's own rate= holds at the gateway too. A keys file with a
    key that names no tenant is refused at start when the pods are to be told tenants."""
    seen = []

    def answer(path, body, headers):
        seen.append((headers.get_all("X-LLM-Tenant") or [], headers.get_all("Authorization") or []))
        return 200, json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1, "total_tokens": 2}}).encode(), {}
    fake = FakeBackend(answer)
    (tmp_path / "keys").write_text("sk-d tenant=D rate=1\nsk-e tenant=E\n")
    (tmp_path / "upstream").write_text("sk-gw\n")
    try:
        for upstream in (True, False):
            extra = ["--upstream-key-file", tmp_path / "upstream"] if upstream else []
            r = Router("--backend", fake.base, "--api-keys-file", tmp_path / "keys", *extra)
            try:
                seen.clear()
                s, _, _ = post(r.base, ask(), key="sk-e", headers={"X-LLM-Tenant": "D"})
                assert s == 200
                assert seen == [(["E"], ["Bearer sk-gw"])] if upstream else seen == [([], ["Bearer sk-e"])], seen
                codes = [post(r.base, ask(), key="sk-d")[0] for _ in range(3)]  # rate=1: one a second
                assert codes[0] == 200 and 429 in codes, codes
            finally:
                assert r.stop() == 0
    finally:
        fake.close()
    (tmp_path / "bare").write_text("sk-x\n")
    p = subprocess.run([tool("llm-router"), "--backend", "http://127.0.0.1:9", "--api-keys-file", tmp_path / "bare",
                        "--upstream-key-file", tmp_path / "upstream"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "key 1 has no tenant=" in p.stderr, p.stderr


def test_redis_with_a_password_and_an_acl_user(tmp_path):
    """A Redis that wants AUTH (a password for the default user; an ACL user that may touch llm-quota:* keys
    alone): with the right password, as the default user and as the ACL user, the limits are counted in Redis
    (rpm 2: the third request is 429, held across replicas); with a wrong password or none, tenants with limits
    get 503 quota_store_unavailable, and the router's log names the cause (never the password); a password file
    rewritten (a rotated Secret) is taken without a restart."""
    addr, proc = start_redis(tmp_path, "--requirepass", "s3cret-default",
                             "--user", "gw", "on", ">gw-pass", "~llm-quota:*", "+@all")
    answer = json.dumps({"choices": [{"text": "x"}], "usage": {"prompt_tokens": 1, "total_tokens": 2}}).encode()
    fake = FakeBackend(lambda path, body, headers: (200, answer, {}))
    (tmp_path / "keys").write_text("sk-a tenant=A rpm=2\n")
    for name, pw in (("right", "s3cret-default"), ("gw", "gw-pass"), ("wrong", "not-it")):
        (tmp_path / name).write_text(pw + "\n")

    def router(*auth):
        return Router("--backend", fake.base, "--api-keys-file", tmp_path / "keys", "--quota-redis", addr,
                      "--quota-prefix", f"auth-{free_port()}", *auth)
    try:
        for auth in (["--quota-redis-password-file", tmp_path / "right"],
                     ["--quota-redis-password-file", tmp_path / "gw", "--quota-redis-user", "gw"]):
            r = router(*auth)
            try:
                got = [post(r.base, ask(), key="sk-a") for _ in range(3)]
                assert [g[0] for g in got] == [200, 200, 429], [g[:2] for g in got]
                assert "across the gateway's replicas (Redis)" in got[2][1]["error"]["message"], got[2][1]
                assert r.metrics()[("llm_router_quota_shared", ())] == 1
            finally:
                assert r.stop() == 0
        for auth, cause in ((["--quota-redis-password-file", tmp_path / "wrong"], "AUTH refused: WRONGPASS"),
                            (["--quota-redis-password-file", tmp_path / "wrong", "--quota-redis-user", "gw"],
                             "AUTH refused: WRONGPASS"),
                            ([], "Redis wants a password (AUTH)")):
            r = router(*auth)
            try:
                s, body, h = post(r.base, ask(), key="sk-a")
                assert s == 503 and body["error"]["code"] == "quota_store_unavailable" and h.get("Retry-After"), body
                assert "not-it" not in body["error"]["message"]
            finally:
                assert r.stop() == 0
            assert cause in r.log and "not-it" not in r.log, r.log
        # the password file is read for each new connection: a rotated Secret is followed without a restart
        (tmp_path / "rotating").write_text("not-it\n")
        r = router("--quota-redis-password-file", tmp_path / "rotating")
        try:
            assert post(r.base, ask(), key="sk-a")[0] == 503
            (tmp_path / "rotating").write_text("s3cret-default\n")
            wait_for(lambda: post(r.base, ask(), key="sk-a")[0] == 200, 30, "the new password taken (Redis marked "
                     "down for a second after the failure)")
        finally:
            assert r.stop() == 0
    finally:
        fake.close()
        proc.terminate()
        proc.wait(timeout=30)
    p = subprocess.run([tool("llm-router"), "--backend", "http://127.0.0.1:9", "--api-keys-file", tmp_path / "keys",
                        "--quota-redis-user", "gw"], capture_output=True, text=True, timeout=30)
    assert p.returncode != 0 and "need --quota-redis" in p.stderr, p.stderr
