"""Server arguments, SGLANG_* knobs and version profiles (docs/sglang-rules.md §1.9, §2, §6)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvadmit.config import (
    PROFILE_0_5_22,
    PROFILE_0_5_23,
    ConfigError,
    SchedulerKnobs,
    ServerArgs,
    resolve_chunked_prefill_size,
    resolve_max_running_requests,
    version_profile,
)


def test_server_defaults_are_sglangs() -> None:
    a = ServerArgs()
    assert a.page_size == 1
    assert a.schedule_conservativeness == 1.0
    assert a.max_prefill_tokens == 16384
    assert a.schedule_policy == "fcfs"
    assert a.decode_log_interval == 40
    assert a.disable_radix_cache is False
    assert a.max_running_requests is None
    assert a.sglang_version == "0.5.22"


def test_knob_defaults_are_sglangs() -> None:
    k = SchedulerKnobs()
    assert (k.clip_max_new_tokens_estimation, k.init_new_token_ratio, k.min_new_token_ratio_factor) == (
        4096,
        0.7,
        0.14,
    )
    assert (k.new_token_ratio_decay_steps, k.retract_decode_steps) == (600, 20)
    assert (k.test_retract, k.test_retract_interval) == (False, 3)


def test_knobs_read_from_the_environment() -> None:
    k = SchedulerKnobs.from_environ(
        {
            "SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION": "512",
            "SGLANG_INIT_NEW_TOKEN_RATIO": "0.5",
            "SGLANG_TEST_RETRACT": "true",
            "SGLANG_TEST_RETRACT_INTERVAL": "5",
            "UNRELATED": "x",
        }
    )
    assert k.clip_max_new_tokens_estimation == 512
    assert k.init_new_token_ratio == 0.5
    assert k.test_retract is True
    assert k.test_retract_interval == 5
    assert k.retract_decode_steps == 20


def test_a_malformed_knob_names_itself() -> None:
    with pytest.raises(ConfigError, match="SGLANG_RETRACT_DECODE_STEPS='many' is not a valid int"):
        SchedulerKnobs.from_environ({"SGLANG_RETRACT_DECODE_STEPS": "many"})


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_total_tokens": 0}, "--max-total-tokens must be a positive integer"),
        ({"page_size": 0}, "--page-size must be a positive integer"),
        ({"schedule_conservativeness": 0.0}, "--schedule-conservativeness must be > 0"),
        ({"schedule_policy": "sjf"}, "choose one of fcfs, lpm, lof, random"),
        ({"max_running_requests": -1}, "--max-running-requests must be a positive integer"),
        ({"sglang_version": "latest"}, "not a version like 0.5.22"),
    ],
)
def test_bad_server_arguments_say_what_is_allowed(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ServerArgs(**kwargs)  # type: ignore[arg-type]


def test_max_running_requests_unset_clamps_to_2048_then_half_the_pool() -> None:
    # int(4096 / 8192 × 512) = 256 → clamped up to 2048 → capped at 4096 // 2 = 2048.
    assert resolve_max_running_requests(None, 4096, 8192) == 2048
    # int(1_000_000 / 32_768 × 512) = 15625 → clamped down to 4096; half the pool is larger.
    assert resolve_max_running_requests(None, 1_000_000, 32_768) == 4096
    # A tiny pool: 2048 capped at 1000 // 2 = 500.
    assert resolve_max_running_requests(None, 1000, 8192) == 500


def test_max_running_requests_set_is_capped_at_half_the_pool() -> None:
    assert resolve_max_running_requests(5, 4096, 8192) == 5
    assert resolve_max_running_requests(3000, 4096, 8192) == 2048
    assert resolve_max_running_requests(64, 100_000, 8192, attn_dp_size=4) == 16


def test_chunked_prefill_size_by_memory_and_minus_one_disables() -> None:
    assert resolve_chunked_prefill_size(-1) is None
    assert resolve_chunked_prefill_size(8192) == 8192
    assert resolve_chunked_prefill_size(None) == 4096
    assert resolve_chunked_prefill_size(None, 16) == 2048
    assert resolve_chunked_prefill_size(None, 80) == 8192
    assert resolve_chunked_prefill_size(None, 141) == 8192
    assert resolve_chunked_prefill_size(None, 192) == 16384


def test_version_profiles() -> None:
    assert version_profile("0.5.22") is PROFILE_0_5_22
    assert version_profile("0.5.23") is PROFILE_0_5_23
    # 0.5.23 changes exactly the three rules of docs/sglang-rules.md A.2, nothing else
    back = {"filter_finished_every_pass": False, "stop_admission_when_budget_spent": False}
    assert replace(PROFILE_0_5_23, name="0.5.22", credit_held_rows=False, **back) == PROFILE_0_5_22
    assert version_profile("0.5.24").filter_finished_every_pass  # later releases: the latest rules known
    classic = version_profile("0.5.10")
    assert not classic.ignore_eos_reserves_in_full
    assert not classic.page_size_in_fit_check
    assert classic.last_request_oom == "abort"
    assert version_profile("0.5.21").last_request_oom == "abort"
    assert version_profile("0.5.8").last_request_oom == "value_error"
    assert version_profile("0.5.6").last_request_oom == "assertion"
