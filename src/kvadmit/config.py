"""Server arguments, SGLANG_* knobs and version profiles, with SGLang 0.5.22's names and defaults.

Everything here is a frozen dataclass validated on construction; the command line reads its defaults
from these classes so that there is exactly one place where a default lives.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Literal

SCHEDULE_POLICIES = ("fcfs", "lpm", "lof", "random")
# --admission-policy (not an SGLang flag): SGLang's forecast, or one of the alternatives it is compared
# with (scheduler/policy.py).
ADMISSION_POLICIES = ("sglang", "reserve-all", "optimistic")
# --retraction-policy: SGLang's length rule, or lower priority first (scheduler/priority.py)
RETRACTION_POLICIES = ("length", "priority")
# --enable-priority-scheduling works with these --schedule-policy values only (SGLang asserts it at start-up)
PRIORITY_SCHEDULE_POLICIES = ("fcfs", "lof")
LastRequestOom = Literal["abort", "value_error", "assertion"]
# The context length a simulated server assumes when --context-length is not given and there is no model to
# read it from (kvadmit simulate, kvadmit serve --simulate).
SIMULATED_CONTEXT_LENGTH = 32_768


class ConfigError(ValueError):
    """A server argument or knob has a value SGLang would not accept; the message says which and why."""


@dataclass(frozen=True, slots=True)
class VersionProfile:
    """The documented behaviour differences between SGLang releases (docs/sglang-rules.md §1.4, §3.2, §4)."""

    name: str
    # 0.5.22: a running ignore_eos request reserves its remaining tokens × 1.0, others × new_token_ratio.
    # Earlier releases multiply every running request by new_token_ratio.
    ignore_eos_reserves_in_full: bool
    # 0.5.22: the admission inequality is `extend + max_new + page_size < rem_total`; earlier: no page term.
    page_size_in_fit_check: bool
    # Earlier releases stop on max_prefill_tokens (OTHER) even with chunked prefill enabled.
    input_budget_check_with_chunking: bool
    # What happens when the last running request still does not fit after all others were retracted.
    last_request_oom: LastRequestOom
    # The `#pending-token` field of the Prefill batch line appeared after 0.5.10.
    prefill_log_has_pending_token: bool
    # `#new-token` counts raw extend lengths since the PrefillBudget refactor; 0.5.10 counted page-ceiled.
    log_raw_input_tokens: bool
    # 0.5.23 (docs/sglang-rules.md A.2): every pass drops finished requests from the running batch (0.5.22
    # only before a decode step), the admission loop stops before any candidate once the pass budget is
    # spent, and the request-row cap credits the row a continuing chunk already holds.
    filter_finished_every_pass: bool = False
    stop_admission_when_budget_spent: bool = False
    credit_held_rows: bool = False


PROFILE_0_5_22 = VersionProfile(
    name="0.5.22",
    ignore_eos_reserves_in_full=True,
    page_size_in_fit_check=True,
    input_budget_check_with_chunking=False,
    last_request_oom="abort",
    prefill_log_has_pending_token=True,
    log_raw_input_tokens=True,
)

PROFILE_0_5_23 = replace(
    PROFILE_0_5_22,
    name="0.5.23",
    filter_finished_every_pass=True,
    stop_admission_when_budget_spent=True,
    credit_held_rows=True,
)

# "classic": the flat PrefillAdder of 0.5.10 (used for every release from 0.5.10 up to 0.5.21).
PROFILE_CLASSIC = VersionProfile(
    name="0.5.10",
    ignore_eos_reserves_in_full=False,
    page_size_in_fit_check=False,
    input_budget_check_with_chunking=True,
    last_request_oom="abort",
    prefill_log_has_pending_token=False,
    log_raw_input_tokens=False,
)


def _parse_version(text: str) -> tuple[int, int, int]:
    parts = text.strip().lstrip("v").split(".")
    try:
        numbers = [int(p) for p in parts]
    except ValueError:
        raise ConfigError(f"sglang_version {text!r} is not a version like 0.5.22") from None
    if len(numbers) != 3:
        raise ConfigError(f"sglang_version {text!r} is not a version like 0.5.22")
    return numbers[0], numbers[1], numbers[2]


def version_profile(version: str) -> VersionProfile:
    """The profile for an SGLang release: 0.5.22 and later, or the classic rules of earlier releases.

    The last-request failure follows the release history: ≤ 0.5.6 an assertion, 0.5.7–0.5.9 a ValueError
    (both crash the server), ≥ 0.5.10 a graceful abort of that request.
    """
    if version in ("classic",):
        return PROFILE_CLASSIC
    v = _parse_version(version)
    if v >= (0, 5, 23):
        return PROFILE_0_5_23 if v == (0, 5, 23) else replace(PROFILE_0_5_23, name=version)
    if v >= (0, 5, 22):
        return PROFILE_0_5_22
    if v >= (0, 5, 10):
        return replace(PROFILE_CLASSIC, name=version)
    oom: LastRequestOom = "value_error" if v >= (0, 5, 7) else "assertion"
    return replace(PROFILE_CLASSIC, name=version, last_request_oom=oom)


@dataclass(frozen=True, slots=True)
class SchedulerKnobs:
    """The SGLANG_* environment knobs that shape admission and retraction (docs/sglang-rules.md §2,
    srt/environ.py)."""

    clip_max_new_tokens_estimation: int = 4096  # SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION
    init_new_token_ratio: float = 0.7  # SGLANG_INIT_NEW_TOKEN_RATIO
    min_new_token_ratio_factor: float = 0.14  # SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR
    new_token_ratio_decay_steps: int = 600  # SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS
    retract_decode_steps: int = 20  # SGLANG_RETRACT_DECODE_STEPS
    test_retract: bool = False  # SGLANG_TEST_RETRACT
    test_retract_interval: int = 3  # SGLANG_TEST_RETRACT_INTERVAL
    test_retract_no_prefill_bs: int = 2**31  # SGLANG_TEST_RETRACT_NO_PREFILL_BS
    max_new_tokens_limit: int | None = None  # SGLANG_MAX_NEW_TOKENS_LIMIT

    def __post_init__(self) -> None:
        if self.clip_max_new_tokens_estimation < 0:
            raise ConfigError("SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION must be ≥ 0")
        if self.init_new_token_ratio <= 0:
            raise ConfigError("SGLANG_INIT_NEW_TOKEN_RATIO must be > 0")
        if self.min_new_token_ratio_factor < 0:
            raise ConfigError("SGLANG_MIN_NEW_TOKEN_RATIO_FACTOR must be ≥ 0")
        if self.new_token_ratio_decay_steps <= 0:
            raise ConfigError("SGLANG_NEW_TOKEN_RATIO_DECAY_STEPS must be > 0")
        if self.retract_decode_steps < 0:
            raise ConfigError("SGLANG_RETRACT_DECODE_STEPS must be ≥ 0")
        if self.test_retract_interval <= 0:
            raise ConfigError("SGLANG_TEST_RETRACT_INTERVAL must be > 0")
        if self.max_new_tokens_limit is not None and self.max_new_tokens_limit <= 0:
            raise ConfigError("SGLANG_MAX_NEW_TOKENS_LIMIT must be > 0 when set")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SchedulerKnobs:
        """Read the knobs from the environment (os.environ by default); unset ones keep SGLang's defaults."""
        env = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for f in fields(cls):
            name = "SGLANG_" + f.name.upper()
            raw = env.get(name)
            if raw is None or raw == "":
                continue
            values[f.name] = _parse_knob(name, raw, f.type)
        return cls(**values)  # type: ignore[arg-type]


def _parse_knob(name: str, raw: str, annotation: object) -> object:
    kind = str(annotation)
    try:
        if kind == "bool":
            low = raw.strip().lower()
            if low in ("1", "true", "yes", "on"):
                return True
            if low in ("0", "false", "no", "off"):
                return False
            raise ValueError
        if kind == "float":
            return float(raw)
        if kind.startswith("int"):
            return int(raw)
    except ValueError:
        pass
    raise ConfigError(f"{name}={raw!r} is not a valid {kind.split(' ')[0]}")


def resolve_chunked_prefill_size(value: int | None, gpu_memory_gb: float | None = None) -> int | None:
    """SGLang's default chunked prefill size by device memory; None disables chunking (value ≤ 0)."""
    if value is not None:
        return value if value > 0 else None
    if gpu_memory_gb is None:
        return 4096  # SGLang's fallback when the device memory is unknown
    if gpu_memory_gb < 20:
        return 2048
    if gpu_memory_gb < 60:
        return 4096
    if gpu_memory_gb < 160:
        return 8192
    return 16384


def resolve_max_running_requests(
    requested: int | None, token_capacity: int, context_len: int, attn_dp_size: int = 1
) -> int:
    """SGLang's `resolve_max_num_reqs` (docs/sglang-rules.md §1.9).

    Unset: int(capacity / context_len × 512) clamped to [2048, 4096], then capped at capacity // 2.
    Set:   requested // attn_dp_size, capped at capacity // 2.
    """
    if requested is None:
        guess = int(token_capacity / context_len * 512)
        resolved = min(max(guess, 2048), 4096)
    else:
        resolved = requested // attn_dp_size
    return max(min(resolved, token_capacity // 2), 1)


@dataclass(frozen=True, slots=True)
class ServerArgs:
    """The server arguments the scheduler reads, with SGLang's flag names (underscored) and defaults."""

    max_total_tokens: int | None = None
    page_size: int = 1
    schedule_conservativeness: float = 1.0
    max_running_requests: int | None = None
    max_queued_requests: int | None = None
    max_prefill_tokens: int = 16384
    chunked_prefill_size: int | None = None
    prefill_max_requests: int | None = None
    schedule_policy: str = "fcfs"
    disable_radix_cache: bool = False
    decode_log_interval: int = 40
    context_length: int | None = None
    random_seed: int = 0
    sglang_version: str = "0.5.22"
    # SGLang's default is the overlap loop (docs/sglang-rules.md A.1): the next pass is scheduled before
    # the last step's result is processed. True selects the non-overlap loop.
    disable_overlap_schedule: bool = False
    # --enable-mixed-chunk: a prefill batch also carries one decode row per running request (with chunked
    # prefill on; docs/sglang-rules.md A.5)
    enable_mixed_chunk: bool = False
    # priority scheduling (scheduler/priority.py, docs/sglang-rules.md §13)
    enable_priority_scheduling: bool = False
    schedule_low_priority_values_first: bool = False
    default_priority_value: int | None = None
    abort_on_priority_when_disabled: bool = False
    disable_priority_preemption: bool = False
    priority_scheduling_preemption_threshold: int = 10
    retraction_policy: str = "length"
    knobs: SchedulerKnobs = field(default_factory=SchedulerKnobs)
    admission_policy: str = "sglang"

    def __post_init__(self) -> None:
        if self.max_total_tokens is not None and self.max_total_tokens <= 0:
            raise ConfigError(f"--max-total-tokens must be a positive integer, got {self.max_total_tokens}")
        if self.page_size <= 0:
            raise ConfigError(f"--page-size must be a positive integer, got {self.page_size}")
        if not self.schedule_conservativeness > 0:
            raise ConfigError(
                f"--schedule-conservativeness must be > 0, got {self.schedule_conservativeness}"
            )
        if self.max_running_requests is not None and self.max_running_requests <= 0:
            raise ConfigError(
                f"--max-running-requests must be a positive integer, got {self.max_running_requests}"
            )
        if self.max_queued_requests is not None and self.max_queued_requests <= 0:
            raise ConfigError(
                f"--max-queued-requests must be a positive integer, got {self.max_queued_requests}"
            )
        if self.max_prefill_tokens <= 0:
            raise ConfigError(
                f"--max-prefill-tokens must be a positive integer, got {self.max_prefill_tokens}"
            )
        if self.prefill_max_requests is not None and self.prefill_max_requests <= 0:
            raise ConfigError(
                f"--prefill-max-requests must be a positive integer, got {self.prefill_max_requests}"
            )
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ConfigError(
                f"--schedule-policy {self.schedule_policy!r} is not supported; choose one of "
                + ", ".join(SCHEDULE_POLICIES)
            )
        if self.decode_log_interval <= 0:
            raise ConfigError(
                f"--decode-log-interval must be a positive integer, got {self.decode_log_interval}"
            )
        if self.context_length is not None and self.context_length <= 1:
            raise ConfigError(f"--context-length must be at least 2, got {self.context_length}")
        if self.retraction_policy not in RETRACTION_POLICIES:
            raise ConfigError(
                f"--retraction-policy {self.retraction_policy!r} is not supported; choose one of "
                + ", ".join(RETRACTION_POLICIES)
            )
        version_profile(self.sglang_version)  # raises ConfigError for a malformed version
        if self.admission_policy not in ADMISSION_POLICIES:
            raise ConfigError(
                f"--admission-policy {self.admission_policy!r} is not supported; choose one of "
                + ", ".join(ADMISSION_POLICIES)
            )

    def check_startup(self) -> None:
        """What SGLang asserts when a server starts, beyond single-field checks. (Snapshots skip this:
        the admission arithmetic is defined for any combination, and a snapshot only asks about it.)"""
        chunk = self.chunked_prefill_size
        if chunk is not None and chunk > 0 and chunk % self.page_size:
            raise ConfigError(
                f"--chunked-prefill-size {chunk} must be a multiple of --page-size {self.page_size}"
            )
        if self.enable_priority_scheduling and self.schedule_policy not in PRIORITY_SCHEDULE_POLICIES:
            raise ConfigError(
                "To use priority scheduling, schedule_policy must be 'fcfs' or 'lof'. "
                f"'{self.schedule_policy}' is not supported."
            )
        if self.retraction_policy == "priority" and not self.enable_priority_scheduling:
            raise ConfigError("--retraction-policy priority requires --enable-priority-scheduling")

    @property
    def profile(self) -> VersionProfile:
        return version_profile(self.sglang_version)
