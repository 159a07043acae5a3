"""Roofline cost models: model shapes against the models' published sizes, the roofline arithmetic from
the GPUs' data-sheet numbers, the spec syntax, and the one cost-model file format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kvadmit.costmodel.costmodel import CostModel, CostModelError, DecodeCost, PrefillCost
from kvadmit.costmodel.costspec import resolve_cost_model
from kvadmit.costmodel.shapes import MODELS, find_model


@pytest.mark.parametrize(
    ("name", "total_b", "non_embedding_b"),
    [
        # Model cards: Qwen3-0.6B 0.6B / 0.44B, 4B 4.0B / 3.6B, 8B 8.2B / 6.95B, 32B 32.8B / 31.2B.
        ("qwen3-0.6b", 0.6, 0.44),
        ("qwen3-4b", 4.0, 3.6),
        ("qwen3-8b", 8.2, 6.95),
        ("qwen3-32b", 32.8, 31.2),
        ("llama-3-70b", 70.6, None),
    ],
)
def test_parameter_counts_match_the_model_cards(
    name: str, total_b: float, non_embedding_b: float | None
) -> None:
    m = MODELS[name]
    digits = len(str(total_b).split(".")[1])
    assert round(m.params / 1e9, digits) == total_b
    if non_embedding_b is not None:
        assert round(m.non_embedding_params / 1e9, len(str(non_embedding_b).split(".")[1])) == non_embedding_b


def test_exact_parameter_counts_where_published() -> None:
    assert MODELS["llama-3-8b"].params == 8_030_261_248  # Meta-Llama-3-8B's safetensors total
    assert MODELS["qwen3-0.6b"].params == 596_049_920
    # SmolLM2-135M (the default model): its bf16 safetensors file is 2 bytes a parameter plus a header.
    smol = MODELS["smollm2-135m"]
    assert 0 < 269_060_520 - 2 * smol.params < 100_000


def test_kv_bytes_per_token_is_k_and_v_of_every_layer() -> None:
    assert MODELS["llama-3-8b"].kv_bytes_per_token() == 2 * 32 * 8 * 128 * 2 == 131_072
    assert MODELS["qwen3-4b"].kv_bytes_per_token() == 2 * 36 * 8 * 128 * 2
    assert MODELS["smollm2-135m"].kv_bytes_per_token() == 2 * 30 * 3 * 64 * 2
    # Under tp=4 each GPU holds 2 of Llama-3-70B's 8 KV heads; under tp=16 one, replicated.
    assert MODELS["llama-3-70b"].kv_bytes_per_token(tp=4) == 2 * 80 * 2 * 128 * 2
    assert MODELS["llama-3-70b"].kv_bytes_per_token(tp=16) == 2 * 80 * 1 * 128 * 2


def test_the_h100_llama_3_8b_roofline_from_the_data_sheet() -> None:
    cost = resolve_cost_model("h100:llama-3-8b")
    m = MODELS["llama-3-8b"]
    bw, flops = 3.35e12 * 0.80, 989e12  # the stated bandwidth efficiency
    # Memory-bound decode: weights + KV read once per step.
    b, ctx = 8, 1000
    memory_s = (m.params * 2 + b * ctx * 131_072) / bw
    assert cost.decode.seconds(b, b * ctx) == pytest.approx(memory_s, rel=1e-9)
    # Compute-bound decode at a large batch: 2 FLOPs per weight (lm_head included), decode_eff 0.5.
    b = 4096
    compute_s = b * 2 * (m.layers * m.layer_matmul_params + m.vocab * m.hidden) / (flops * 0.5)
    assert cost.decode.seconds(b, 0) == pytest.approx(compute_s, rel=1e-9)
    assert compute_s > m.params * 2 / bw
    # Prefill: FLOPs-bound at 60% of peak (the lm_head only on each sequence's last token).
    assert cost.prefill.tokens_per_s == pytest.approx(flops * 0.6 / (2 * m.layers * m.layer_matmul_params))


def test_tensor_parallel_and_efficiency_options() -> None:
    one = resolve_cost_model("h200:llama-3-70b:tp=2")
    four = resolve_cost_model("h200:llama-3-70b:tp=4:bw_eff=0.7")
    m = MODELS["llama-3-70b"]
    allreduce_ms = 2 * 80 * 10 / 1000
    assert four.decode.base_ms == pytest.approx(m.params * 2 / 4 / (4.8e12 * 0.7) * 1e3 + allreduce_ms)
    assert one.decode.base_ms > four.decode.base_ms
    assert four.name == "h200:llama-3-70b:tp=4"


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("b200:llama-3-8b", "unknown GPU 'b200'"),
        ("h100:gpt-5", "unknown model 'gpt-5'"),
        ("h100:llama-3-8b:tp=0", "tp must be a positive integer"),
        ("h100:llama-3-8b:bw_eff=1.5", "bw_eff must be > 0 and ≤ 1"),
        ("h100:llama-3-8b:speed=2", "not key=value with a key among"),
        ("a100:llama-3-70b", "needs 141 GB of weights per GPU at tp=1"),
    ],
)
def test_bad_specs_say_what_is_wrong(spec: str, message: str) -> None:
    with pytest.raises(CostModelError, match=message):
        resolve_cost_model(spec)


def test_names_are_forgiving() -> None:
    assert find_model("Qwen/Qwen3-8B") is MODELS["qwen3-8b"]
    assert find_model("meta-llama/Meta-Llama-3-8B-Instruct") is MODELS["llama-3-8b"]
    assert resolve_cost_model("H100-SXM:SmolLM2-135M-Instruct").name == "h100:smollm2-135m"


def test_the_rtx4090_qwen3_4b_roofline_predicts_the_q2_logs_decode_lines() -> None:
    # Logs 03 and 04 are Qwen3-4B on an RTX 4090 (README). Lines with no prefill in their window:
    # tokens/s = #running-req / step time at #token tokens of KV.
    from kvadmit.costmodel.calibrate import calibrate_files

    cost = resolve_cost_model("rtx4090:qwen3-4b")
    logs = Path(__file__).parent / "data" / "logs"
    cal = calibrate_files([str(logs / n) for n in (
        "03-sglang-q2-qwen3-4b-healthy-ramp.log", "04-sglang-q2-qwen3-4b-retraction-burst.log")])  # fmt: skip
    clean = [w for w in cal.windows if w.window_known and not w.prefills]
    assert len(clean) >= 20
    for w in clean:
        predicted = w.batch / cost.decode.seconds(w.batch, w.kv_tokens)  # type: ignore[arg-type]
        assert predicted == pytest.approx(w.gen_throughput, rel=0.10), w.where


def test_one_file_format_round_trips_and_old_files_still_load(tmp_path: Path) -> None:
    cost = resolve_cost_model("a100:qwen3-8b")
    path = tmp_path / "a100.json"
    cost.write(str(path))
    again = CostModel.from_file(str(path))
    assert again == cost and again.meta["notes"] == cost.meta["notes"]
    old = tmp_path / "old.json"
    old.write_text(json.dumps({"decode": {"base_ms": 8.0, "per_request_ms": 0.05},
                               "prefill": {"tokens_per_s": 20000}}))  # fmt: skip
    assert CostModel.from_file(str(old)) == CostModel(
        DecodeCost(base_ms=8.0, per_request_ms=0.05), PrefillCost(tokens_per_s=20000)
    )


def test_the_step_is_the_slower_of_memory_and_compute() -> None:
    d = DecodeCost(base_ms=10, per_kv_token_ms=0.001, compute_per_request_ms=0.5)
    assert d.seconds(4, 1000) == pytest.approx(0.011)  # memory: 10 + 1 ms; compute 2 ms
    assert d.seconds(40, 1000) == pytest.approx(0.020)  # compute: 20 ms; memory 11 ms
    p = PrefillCost(tokens_per_s=10_000, memory_ms=5)
    assert p.seconds(1, 10, 0) == pytest.approx(0.005)  # a tiny prefill still reads the weights
    assert p.seconds(1, 1000, 0) == pytest.approx(0.1)


def test_serve_simulate_takes_a_preset() -> None:
    from kvadmit.server.backend import simulated_backend

    backend = simulated_backend("h200:qwen3-8b", None, 4096, None)
    assert backend.model_path == "simulated:h200:qwen3-8b" and backend.simulated
