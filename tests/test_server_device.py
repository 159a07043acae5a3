"""serve's --device as an SGLang user expects it (a device SGLang 0.5.22 does not run on is refused; under
--simulate the device is the cost model's, so any other is a start-up note), and /server_info's
chunked_prefill_size as SGLang keeps it (-1 for chunking off, not null)."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest

from kvadmit.cli.serve import device_notes
from kvadmit.errors import UsageError
from server_helpers import running_server, write_cost_model


def test_a_device_sglang_does_not_know_is_refused_with_one_line() -> None:
    with pytest.raises(UsageError, match=r"^--device tpu: SGLang 0.5.22 runs on cuda, xpu, npu, hpu, musa"):
        device_notes("tpu", simulated=True)


def test_under_simulate_a_device_is_a_note_and_auto_says_nothing() -> None:
    assert device_notes("npu", simulated=True) == [
        "--device npu: serve --simulate simulates the device (the cost model's); no effect"
    ]
    assert device_notes("auto", simulated=True) == []


def test_a_model_runs_on_cuda_or_cpu_only() -> None:
    assert device_notes("cuda:1", simulated=False) == device_notes("cpu", simulated=False) == []
    with pytest.raises(UsageError, match=r"^--device npu: kvadmit runs a model on cuda or cpu"):
        device_notes("npu", simulated=False)


@pytest.mark.parametrize(("flag", "reported"), [("-1", -1), ("512", 512)])
def test_server_info_keeps_sglangs_chunked_prefill_size(tmp_path: Path, flag: str, reported: int) -> None:
    cost = write_cost_model(tmp_path / "cost.json")
    with running_server(["--simulate", cost, "--chunked-prefill-size", flag]) as srv:
        info = httpx.get(f"{srv.url}/server_info", timeout=10).json()
    assert info["chunked_prefill_size"] == reported
    assert info["internal_states"][0]["chunked_prefill_size"] == reported
