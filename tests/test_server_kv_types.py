"""llamacmp-server honours -ctk / -ctv (each of f16, q8_0, q4_0, tq3 on its own) in its slots and its memory plan."""
from __future__ import annotations

import httpx
import pytest

from llamacmp import memplan
from llamacmp.args import parse_args
from llamacmp.loader import open_model
from llamacmp.run_plan import RunPlanError, plan_run
from server_harness import LiveServer, write_tiny_model

PROMPT = "Once upon a time there was a parser that read tokens one by one"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return write_tiny_model(tmp_path_factory.mktemp("m") / "tiny.gguf")


def top_logprobs(model, *flags: str) -> tuple[list[float], tuple[str, str]]:
    """The first generated token's top-5 log-probabilities through HTTP, and the slots' (K, V) cache types."""
    with LiveServer(model, "-c", "512", "-np", "1", *flags) as srv, httpx.Client(base_url=srv.url, timeout=60) as c:
        b = c.post("/completion", json={"prompt": PROMPT, "n_predict": 1, "temperature": 0, "n_probs": 5}).json()
        state = srv.ctx.engine.slots[0].state
        return [t["logprob"] for t in b["completion_probabilities"][0]["top_logprobs"]], (state.k_type, state.v_type)


def test_kv_types_change_the_logits_through_http(model):
    f16, types16 = top_logprobs(model, "-ctk", "f16", "-ctv", "f16")
    q4, types4 = top_logprobs(model, "-ctk", "q4_0", "-ctv", "q4_0")
    assert types16 == ("f16", "f16") and types4 == ("q4_0", "q4_0")
    assert f16 != q4                     # the quantized cache is read back, not an f16 one under another name
    assert max(abs(a - b) for a, b in zip(f16, q4)) < 0.5      # ... and still the same model


def test_k_and_v_types_are_independent(model):
    _, types = top_logprobs(model, "-ctk", "q8_0", "-ctv", "tq3")
    assert types == ("q8_0", "tq3")


def test_memory_plan_line_names_the_servers_kv_types(model):
    """What prepare_device plans for the server: its slots, their share of -c, and -ctk / -ctv as given."""
    p = parse_args("server", ["-m", str(model), "-c", "1024", "-np", "2", "-ctk", "q8_0", "-ctv", "tq3"]).params
    mf = open_model(model)
    run = plan_run(p, mf.cfg.n_ctx_train)
    assert (run.n_slots, run.n_ctx, run.k_type, run.v_type) == (2, 512, "q8_0", "tq3")
    plan = memplan.plan(memplan.tensors_of(mf.gguf), mf.cfg, run.n_ctx, run.n_slots, run.k_type, run.v_type)
    kv_line = next(line for line in plan.lines() if "KV cache" in line)
    assert "-c 512 x 2 slot(s), -ctk q8_0 -ctv tq3" in kv_line
    f16 = memplan.plan(memplan.tensors_of(mf.gguf), mf.cfg, 512, 2, "f16", "f16")
    assert plan.item("KV cache").nbytes < f16.item("KV cache").nbytes


def test_run_plan_refuses_what_no_engine_runs(model):
    p = parse_args("server", ["-m", str(model), "-b", "0"]).params
    with pytest.raises(RunPlanError, match="--batch-size"):
        plan_run(p, 4096)
