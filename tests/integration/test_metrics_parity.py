"""llm-server's /metrics read by two parsers no one here wrote, Python's
prometheus_client and Go's expfmt (tests/promcheck), which must agree on
every family's type (no counter read as untyped); the series vLLM's
example Grafana dashboard queries (vllm/examples/online_serving/
prometheus_grafana/grafana.json: the names below are the ones its panels
and its model_name variable use) all present with the model_name label
and moving with traffic; the names our chart's dashboard and alerts use
all exist; /health answers as /livez does."""
import json
import re
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness import BUILD, NAME, ROOT, Server, story


# Every series the vLLM example dashboard's queries select (all filtered
# by model_name="$model_name"), plus the ones the issue names.
VLLM_DASHBOARD = [
    "vllm:e2e_request_latency_seconds_bucket", "vllm:e2e_request_latency_seconds_sum",
    "vllm:e2e_request_latency_seconds_count", "vllm:prompt_tokens_total", "vllm:generation_tokens_total",
    "vllm:time_per_output_token_seconds_bucket", "vllm:time_per_output_token_seconds_sum",
    "vllm:time_per_output_token_seconds_count", "vllm:num_requests_running", "vllm:num_requests_waiting",
    "vllm:time_to_first_token_seconds_bucket", "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count", "vllm:gpu_cache_usage_perc", "vllm:request_prompt_tokens_bucket",
    "vllm:request_generation_tokens_bucket", "vllm:request_success_total", "vllm:request_queue_time_seconds_sum",
    "vllm:request_prefill_time_seconds_sum", "vllm:request_decode_time_seconds_sum",
    "vllm:request_max_num_generation_tokens_sum",
]
VLLM_MORE = ["vllm:inter_token_latency_seconds_bucket", "vllm:num_preemptions_total", "vllm:prefix_cache_queries_total",
             "vllm:prefix_cache_hits_total", "vllm:kv_cache_usage_perc"]


@pytest.fixture(scope="module")
def srv():
    s = Server(story())
    c = s.client()
    c.completions.create(model=NAME, prompt="Once upon a time", max_tokens=6, temperature=0)
    list(c.completions.create(model=NAME, prompt="The cat", max_tokens=5, stream=True))
    yield s
    assert s.stop() == 0


def scrape(srv):
    st, text, _ = srv.get("/metrics")
    assert st == 200
    return text


def go_families(text):
    r = subprocess.run([str(BUILD / "bin" / "promcheck")], input=text, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
    return {line.split()[0]: line.split()[1].lower() for line in r.stdout.splitlines()}


def test_parsers_agree_on_types(srv):
    text = scrape(srv)
    go = go_families(text)
    py = {f.name: f.type for f in text_string_to_metric_families(text)}
    assert "untyped" not in go.values(), [n for n, t in go.items() if t == "untyped"]
    assert "unknown" not in py.values(), [n for n, t in py.items() if t == "unknown"]
    for name, t in go.items():
        pname = name[:-len("_total")] if t == "counter" and name.endswith("_total") else name
        assert py.get(pname) == t, (name, t, py.get(pname))
    assert len(go) == len(py) and len(go) > 40
    assert go["vllm:prompt_tokens_total"] == "counter" and go["vllm:time_to_first_token_seconds"] == "histogram"


def samples(text):
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def test_vllm_dashboard_series(srv):
    before = samples(scrape(srv))
    srv.client().completions.create(model=NAME, prompt="Lily", max_tokens=4, temperature=0)
    after = samples(scrape(srv))
    for name in VLLM_DASHBOARD + VLLM_MORE:
        assert name in after, name
        assert all(lab.get("model_name") == NAME for lab, _ in after[name]), (name, after[name])
    # the dashboard's model_name variable: label_values({__name__=~"vllm:.*"}, model_name)
    for name, ss in after.items():
        if name.startswith("vllm:") and name != "vllm:cache_config_info":
            assert all("model_name" in lab for lab, _ in ss), name

    def total(snap, name, **want):
        return sum(v for lab, v in snap.get(name, []) if all(lab.get(k) == x for k, x in want.items()))
    assert total(after, "vllm:generation_tokens_total") - total(before, "vllm:generation_tokens_total") == 4
    assert total(after, "vllm:prompt_tokens_total") > total(before, "vllm:prompt_tokens_total")
    assert total(after, "vllm:request_success_total", finished_reason="length") == \
        total(before, "vllm:request_success_total", finished_reason="length") + 1
    assert total(after, "vllm:e2e_request_latency_seconds_count") == total(before, "vllm:e2e_request_latency_seconds_count") + 1
    assert total(after, "vllm:request_generation_tokens_sum") - total(before, "vllm:request_generation_tokens_sum") == 4
    assert total(after, "vllm:request_max_num_generation_tokens_sum") - \
        total(before, "vllm:request_max_num_generation_tokens_sum") == 4
    # ours and vLLM's are the same series under two names
    assert total(after, "llm_time_to_first_token_seconds_count") == total(after, "vllm:time_to_first_token_seconds_count")


def test_chart_names_exist(srv):
    """Every metric our chart's Grafana dashboard and PrometheusRule query is
    one llm-server (or, for llm_controller_*, the controller) exports."""
    text = scrape(srv)
    names = set(samples(text))
    used = set()
    for f in (ROOT / "charts/llm-operator/dashboards").glob("*.json"):
        for panel_expr in re.findall(r'"expr"\s*:\s*"((?:[^"\\]|\\.)*)"', f.read_text()):
            used |= set(re.findall(r"\b(?:llm|vllm)[:_][a-z0-9_:]+", json.loads(f'"{panel_expr}"')))
    used |= set(re.findall(r"\b(?:llm|vllm)[:_][a-z0-9_:]+", (ROOT / "charts/llm-operator/templates/prometheusrule.yaml").read_text()))
    assert len(used) >= 10
    ctl = (ROOT / "controller").glob("*.c")
    ctl_text = "".join(p.read_text() for p in ctl)
    for n in sorted(used):
        if n.startswith("llm_controller_"):
            assert n in ctl_text, n
        else:
            assert n in names, f"{n} is queried by the chart but llm-server does not export it"


def test_health_alias(srv):
    st, body, _ = srv.get("/health")
    st2, body2, _ = srv.get("/livez")
    assert st == st2 == 200 and json.loads(body)["status"] == json.loads(body2)["status"] == "ok"
