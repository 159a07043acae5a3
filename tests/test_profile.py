"""`kvadmit profile`: the real executor timed on this machine, fitted into a cost model that simulate reads.
Timings on a shared machine are noisy, so these tests check what the profile is made of, not its speed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kvadmit.cli.profile_timing import LOOP_OUTPUT, _decode_batch, profile_model
from kvadmit.costmodel.costmodel import CostModel
from kvadmit.costmodel.profile import with_metadata
from kvadmit.model.llama import CausalLM, ModelConfig

TINY = ModelConfig(vocab_size=97, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=8, max_position_embeddings=512)  # fmt: skip


def test_a_profile_measures_its_grid_and_fits_a_cost_model() -> None:
    torch.manual_seed(0)
    model = CausalLM(TINY).eval()
    seen: list[str] = []
    profile = profile_model(
        model, batch_sizes=(1, 4), context_lens=(16, 64), prefill_lens=(8, 32), prefill_requests=(1, 2),
        repeats=1, progress=lambda m: seen.append(f"{m.kind} {m.requests}x{m.tokens}"),
    )  # fmt: skip
    assert seen == ["decode 1x16", "decode 1x64", "decode 4x16", "decode 4x64",
                    "prefill 1x8", "prefill 1x32", "prefill 2x8", "prefill 2x32"]  # fmt: skip
    assert all(m.seconds > 0 for m in profile.measurements)
    cost = with_metadata(profile, "tiny", "float32")
    assert cost.prefill.tokens_per_s > 0
    assert cost.decode.seconds(4, 256) > 0
    assert "decode grid (batch × context tokens per request): 1×16, 1×64, 4×16, 4×64" in cost.meta["notes"]
    assert set(cost.meta["fit"]) >= {"decode_mean_abs_error_pct", "prefill_mean_abs_error_pct"}
    assert CostModel.from_dict(json.loads(json.dumps(cost.to_dict()))) == cost
    # The simulator reads the measured decode steps, each plus the engine loop's overhead per step.
    table = cost.decode.table
    assert table is not None and table.batch_sizes == (1, 4) and table.context_lens == (16, 64)
    oh = profile.loop_overhead_ms
    assert oh >= 0  # a step's wall time includes the executor's own
    for m in profile.measurements:
        if m.kind == "decode":
            assert cost.decode.seconds(m.requests, m.requests * m.tokens) == pytest.approx(
                m.seconds + oh / 1000, rel=1e-12
            )
    # The loop probe: one prefill gives each request its first token, then a decode step per token.
    assert profile.loop_steps == 1 + (LOOP_OUTPUT - 1)


def test_a_profiled_decode_batch_holds_its_context_in_slots_of_its_own() -> None:
    """As in a server: shared slots would be read from cache and time a cheaper step than real ones."""
    batch = _decode_batch(4, 10, 97)
    slots = [set(r.kv) for r in batch.reqs]
    assert all(len(s) == 11 for s in slots)  # 10 of context + the new token's
    assert len(set().union(*slots)) == 44


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=97, hidden_size=32, intermediate_size=48, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("tiny")
    transformers.LlamaForCausalLM(cfg).float().eval().save_pretrained(folder, safe_serialization=True)
    return folder


def test_the_cli_writes_a_profile_that_simulate_reads(tiny_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "cpu.json"
    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "profile", "--model-path", str(tiny_folder), "-o", str(out),
         "--batch-sizes", "1,2", "--context-lens", "16,32", "--prefill-lens", "8,16", "--prefill-requests",
         "1", "--repeats", "1"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert "fit error: decode" in run.stdout and "decode: 2 request(s), 32 tokens" in run.stderr
    assert json.loads(out.read_text())["source"] == "kvadmit profile (the torch executor, measured)"
    sim = subprocess.run(
        [sys.executable, "-m", "kvadmit", "simulate", "--max-total-tokens", "4096", "--num-prompts", "8",
         "--random-input-len", "32", "--random-output-len", "8", "--cost-model", str(out), "--quiet"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
