"""Backends as llm-server users see them: tensor parallelism on the CPU
backend (the model split over 2 and 4 ranks answers the official openai
client exactly as one rank does), each rank's memory in /metrics, and the
clear refusals: a model that does not split, an unknown backend, and the
CUDA backend on a machine without a GPU (or without libllm_cuda.so)."""
import json
import time

import pytest

from harness import NAME, SHARED, Server, metric


STORIES = SHARED / "models" / "stories260K.gguf"


def answers(srv):
    """Greedy completions (whole and streamed) and a chat answer."""
    c = srv.client()
    out = []
    for prompt in ("Once upon a time", "The little dog", "Tom and Anna went"):
        out.append(c.completions.create(model=NAME, prompt=prompt, max_tokens=40, temperature=0).choices[0].text)
    chunks = c.completions.create(model=NAME, prompt="One day", max_tokens=40, temperature=0, stream=True)
    out.append("".join(ch.choices[0].text for ch in chunks if ch.choices))
    r = c.chat.completions.create(model=NAME, messages=[{"role": "user", "content": "Tell me a story."}],
                                  max_tokens=30, temperature=0)
    out.append(r.choices[0].message.content)
    return out


def failed_detail(srv, timeout=30):
    """The /startupz detail of a server whose load must fail."""
    end = time.time() + timeout
    while time.time() < end:
        try:
            st, text, _ = srv.get("/startupz")
            if "failed" in text:
                return st, json.loads(text)["detail"]
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError("the load did not fail")


@pytest.fixture(scope="module")
def split_model(models):
    """stories260K (8 heads, 4 KV heads: splits 2 and 4 ways) when present,
    else tiny-starcoder (4 heads, 4 KV heads, Q8_0)."""
    return STORIES if STORIES.exists() else models("tiny-starcoder", "Q8_0")


def test_tensor_parallel_same_answers(split_model):
    one = Server(split_model)
    want = answers(one)
    assert one.stop() == 0
    assert len(set(want)) > 1 and all(want)
    for n in (2, 4):
        s = Server(split_model, "--tensor_parallel", n)
        assert answers(s) == want, f"tensor_parallel {n}"
        m = s.metrics()
        for r in range(n):
            used = metric(m, "llm_backend_memory_bytes", rank=str(r), backend="cpu", device="host", kind="used")
            total = metric(m, "llm_backend_memory_bytes", rank=str(r), backend="cpu", device="host", kind="total")
            assert 0 < used < total, f"rank {r}"
        assert metric(m, "llm_backend_memory_bytes", rank=str(n), backend="cpu", device="host", kind="used") == 0
        assert s.stop() == 0


def test_model_that_does_not_split(models):
    s = Server(models("tiny", "Q8_0"), "--tensor_parallel", 4, wait=False)  # 2 KV heads
    st, detail = failed_detail(s)
    assert st == 503 and "tensor parallel 4" in detail and "KV heads (2)" in detail
    assert s.stop() == 0


def test_cuda_without_a_gpu(models):
    """No GPU on this machine: backend cuda fails the load with the reason
    (no device, or no libllm_cuda.so where nvcc was missing)."""
    s = Server(models("tiny", "Q8_0"), "--backend", "cuda", wait=False)
    st, detail = failed_detail(s)
    assert st == 503 and detail.startswith("cuda backend:")
    assert "no CUDA device" in detail or "cannot load libllm_cuda.so" in detail
    assert s.get("/readyz")[0] == 503
    assert s.stop() == 0


@pytest.mark.parametrize("args,key", [(("--backend", "tpu"), "backend 'tpu'"),
                                      (("--tensor_parallel", "9"), "tensor_parallel")])
def test_bad_backend_settings(models, args, key):
    s = Server(models("tiny", "Q8_0"), *args, wait=False)
    assert s.proc.wait(10) == 2
    assert key in s.proc.stderr.read()
    s.proc.stdout.close()
    s.proc.stderr.close()
