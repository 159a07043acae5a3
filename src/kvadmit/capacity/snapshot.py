"""The snapshot format of docs/architecture.md: one scheduling moment as JSON, parsed, validated and turned
into a real Scheduler whose pool, prefix cache, running batch and queue are in exactly that state."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvadmit import native
from kvadmit.capacity.token_run import TokenRun
from kvadmit.config import ConfigError, SchedulerKnobs, ServerArgs
from kvadmit.memory.pool import TokenPool
from kvadmit.request import Req, SamplingLimits
from kvadmit.scheduler.scheduler import ScheduledBatch, Scheduler


class SnapshotError(ValueError):
    """A snapshot field is missing or wrong; the message names it and says what is allowed."""


@dataclass(frozen=True, slots=True)
class RunningSpec:
    rid: str
    prompt_len: int
    output_len: int
    max_new_tokens: int
    ignore_eos: bool
    priority: int | None = None
    # Overlap loop: the request is in the decode step still in flight. Its output_len does not count that
    # step's token yet (outputs lag one), but it already holds the step's slot (prompt + outputs + 1).
    in_flight: bool = False
    stops_in_flight: bool = False  # ... and that step samples its EOS (SGLang cannot foresee it)


@dataclass(frozen=True, slots=True)
class WaitingSpec:
    rid: str
    prompt_len: int
    cached_prefix_len: int
    max_new_tokens: int
    ignore_eos: bool
    output_len: int
    priority: int | None = None


@dataclass(frozen=True, slots=True)
class Snapshot:
    args: ServerArgs
    new_token_ratio: float | None
    evictable_tokens: int
    running: tuple[RunningSpec, ...]
    waiting: tuple[WaitingSpec, ...]
    check: str  # "admission" or "decode"


def _int(obj: dict[str, Any], key: str, where: str, *, default: int | None = None, minimum: int = 0) -> int:
    if key not in obj or obj[key] is None:
        if default is None:
            raise SnapshotError(f"{where}.{key} is required (an integer ≥ {minimum})")
        return default
    value = obj[key]
    if isinstance(value, bool) or not isinstance(value, int):
        raise SnapshotError(f"{where}.{key} must be an integer ≥ {minimum}, got {value!r}")
    if value < minimum:
        raise SnapshotError(f"{where}.{key} must be ≥ {minimum}, got {value}")
    return value


def _max_total_tokens(server: dict[str, Any], where: str) -> int:
    """The pool's size: at least 1 and at most the 2**32 slot ids a pool can number."""
    value = _int(server, "max_total_tokens", where, minimum=1)
    if value > 2**32:
        raise SnapshotError(
            f"{where}.max_total_tokens must be ≤ {2**32} (the slot ids a pool numbers), got {value}"
        )
    return value


def _bool(obj: dict[str, Any], key: str, where: str, default: bool = False) -> bool:
    value = obj.get(key, default)
    if not isinstance(value, bool):
        raise SnapshotError(f"{where}.{key} must be true or false, got {value!r}")
    return value


def _priority(obj: dict[str, Any], where: str) -> int | None:
    value = obj.get("priority")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise SnapshotError(f"{where}.priority must be an integer or null, got {value!r}")
    return value


def _rid(obj: dict[str, Any], where: str, seen: set[str]) -> str:
    rid = obj.get("rid")
    if not isinstance(rid, str | int) or isinstance(rid, bool):
        raise SnapshotError(f"{where}.rid is required (a string)")
    rid = str(rid)
    if rid in seen:
        raise SnapshotError(f"{where}.rid {rid!r} is used twice; request ids must be unique")
    seen.add(rid)
    return rid


def _object(value: Any, where: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise SnapshotError(f"{where} must be a JSON object, got {type(value).__name__}")
    return value


def _server_args(server: dict[str, Any]) -> ServerArgs:
    where = "server"
    env = server.get("env", {})
    if not isinstance(env, dict) or not all(isinstance(v, str | int | float) for v in env.values()):
        raise SnapshotError("server.env must map SGLANG_* names to values")
    conservativeness = server.get("schedule_conservativeness", 1.0)
    if isinstance(conservativeness, bool) or not isinstance(conservativeness, int | float):
        raise SnapshotError(
            f"server.schedule_conservativeness must be a number > 0, got {conservativeness!r}"
        )
    chunk = server.get("chunked_prefill_size")
    if chunk is not None and (isinstance(chunk, bool) or not isinstance(chunk, int)):
        raise SnapshotError(f"server.chunked_prefill_size must be an integer or null, got {chunk!r}")
    version = server.get("sglang_version", "0.5.22")
    if not isinstance(version, str):
        raise SnapshotError(f'server.sglang_version must be a string like "0.5.22", got {version!r}')
    mrr = server.get("max_running_requests")
    default_priority = _priority({"priority": server.get("default_priority_value")}, where)
    policy = server.get("retraction_policy", "length")
    if not isinstance(policy, str):
        raise SnapshotError(f'server.retraction_policy must be "length" or "priority", got {policy!r}')
    try:
        return ServerArgs(
            max_total_tokens=_max_total_tokens(server, where),
            page_size=_int(server, "page_size", where, default=1, minimum=1),
            schedule_conservativeness=float(conservativeness),
            max_running_requests=None
            if mrr is None
            else _int(server, "max_running_requests", where, minimum=1),
            max_prefill_tokens=_int(server, "max_prefill_tokens", where, default=16384, minimum=1),
            # In a snapshot, null (or ≤ 0) means chunked prefill is off.
            chunked_prefill_size=-1 if chunk is None or chunk <= 0 else chunk,
            prefill_max_requests=(
                None
                if server.get("prefill_max_requests") is None
                else _int(server, "prefill_max_requests", where, minimum=1)
            ),
            disable_radix_cache=_bool(server, "disable_radix_cache", where),
            context_length=(
                None
                if server.get("context_length") is None
                else _int(server, "context_length", where, minimum=2)
            ),
            sglang_version=version,
            disable_overlap_schedule=_bool(server, "disable_overlap_schedule", where),
            enable_priority_scheduling=_bool(server, "enable_priority_scheduling", where),
            schedule_low_priority_values_first=_bool(server, "schedule_low_priority_values_first", where),
            default_priority_value=default_priority,
            disable_priority_preemption=_bool(server, "disable_priority_preemption", where),
            priority_scheduling_preemption_threshold=_int(
                server, "priority_scheduling_preemption_threshold", where, default=10, minimum=-(1 << 63)
            ),
            retraction_policy=policy,
            knobs=SchedulerKnobs.from_environ({k: str(v) for k, v in env.items()}),
        )
    except ConfigError as e:
        raise SnapshotError(f"server: {e}") from None


def _requests(data: dict[str, Any], key: str) -> list[tuple[str, dict[str, Any]]]:
    """(where, object) for each request of the `key` list."""
    items = data.get(key, [])
    if not isinstance(items, list):
        raise SnapshotError(f"{key} must be a list of requests")
    return [(f"{key}[{i}]", _object(item, f"{key}[{i}]")) for i, item in enumerate(items)]


def parse_snapshot(data: Any) -> Snapshot:
    """Validate a decoded JSON snapshot (optionally wrapped as {"snapshot": {...}})."""
    data = _object(data, "the snapshot")
    if "snapshot" in data and "server" not in data:
        data = _object(data["snapshot"], "snapshot")
    args = _server_args(_object(data.get("server"), "server"))
    ratio = data.get("new_token_ratio")
    if ratio is not None and (isinstance(ratio, bool) or not isinstance(ratio, int | float) or ratio < 0):
        raise SnapshotError(f"new_token_ratio must be a number ≥ 0, got {ratio!r}")
    check = data.get("check", "admission")
    if check not in ("admission", "decode"):
        raise SnapshotError(f'check must be "admission" or "decode", got {check!r}')
    seen: set[str] = set()
    running = [
        RunningSpec(
            rid=_rid(item, where, seen),
            prompt_len=_int(item, "prompt_len", where, minimum=1),
            output_len=_int(item, "output_len", where, default=0),
            max_new_tokens=_int(item, "max_new_tokens", where, minimum=0),
            ignore_eos=_bool(item, "ignore_eos", where),
            priority=_priority(item, where),
            in_flight=_bool(item, "in_flight", where),
            stops_in_flight=_bool(item, "stops_in_flight", where),
        )
        for where, item in _requests(data, "running")
    ]
    for spec in running:
        if spec.stops_in_flight and not spec.in_flight:
            raise SnapshotError(f"running {spec.rid!r}: stops_in_flight needs in_flight (the step in flight)")
    if any(r.in_flight for r in running) and args.disable_overlap_schedule:
        raise SnapshotError(
            "in_flight requests exist only under the overlap loop; server.disable_overlap_schedule is true"
        )
    waiting = []
    for where, item in _requests(data, "waiting"):
        spec = WaitingSpec(
            rid=_rid(item, where, seen),
            prompt_len=_int(item, "prompt_len", where, minimum=1),
            cached_prefix_len=_int(item, "cached_prefix_len", where, default=0),
            max_new_tokens=_int(item, "max_new_tokens", where, minimum=0),
            ignore_eos=_bool(item, "ignore_eos", where),
            output_len=_int(item, "output_len", where, default=0),
            priority=_priority(item, where),
        )
        if spec.cached_prefix_len > spec.prompt_len + spec.output_len:
            raise SnapshotError(
                f"{where}.cached_prefix_len ({spec.cached_prefix_len}) exceeds its prompt + outputs "
                f"({spec.prompt_len + spec.output_len})"
            )
        waiting.append(spec)
    evictable = _int(data, "evictable_tokens", "snapshot", default=0)
    snap = Snapshot(
        args, None if ratio is None else float(ratio), evictable, tuple(running), tuple(waiting), check
    )
    _check_fits(snap)
    return snap


def _check_fits(snap: Snapshot) -> None:
    pool = snap.args.max_total_tokens
    assert pool is not None
    held = sum(r.prompt_len + r.output_len + r.in_flight for r in snap.running)  # (+ the in-flight slot)
    if held + snap.evictable_tokens > pool:
        raise SnapshotError(
            f"running requests hold {held} tokens and {snap.evictable_tokens} are evictable, "
            f"more than the pool's max_total_tokens={pool}"
        )
    cached = sum(w.cached_prefix_len for w in snap.waiting)
    if cached > snap.evictable_tokens and not snap.args.disable_radix_cache:
        raise SnapshotError(
            f"waiting requests have {cached} cached prefix tokens but evictable_tokens is "
            f"{snap.evictable_tokens}; their cached prefixes are part of the evictable tokens"
        )


def _tokens(base: int, n: int) -> list[int]:
    return list(range(base, base + n))


LIST_LIMIT = 1 << 20  # a waiting request's prompt or outputs up to this many ids are a plain list


def _waiting_ids(start: int, n: int, rid: str) -> list[int]:
    """The ids start … start + n − 1 of a waiting request. Nothing bounds them by the pool (a retracted
    request's prompt + outputs may exceed it, and a snapshot may state any prompt), so past LIST_LIMIT they
    are a TokenRun (two integers; the pool bounds whatever the scheduler reads of them). The compiled core
    (kvadmit.native) takes lists only: there such a length is a named error rather than gigabytes."""
    if n <= LIST_LIMIT:
        return _tokens(start, n)
    if native.active():
        raise SnapshotError(
            f"waiting request {rid!r}: {n:,} token ids; the compiled core (make fast) builds at most "
            f"{LIST_LIMIT:,} per request: run with {native.PURE_ENV}=1 to answer it"
        )
    return TokenRun(start, n)  # type: ignore[return-value]


def build_scheduler(snap: Snapshot) -> Scheduler:
    """A Scheduler in exactly the snapshot's state. Each request gets token ids of its own, so no two
    share a prefix by accident; the evictable tokens not claimed by a waiting request's prefix sit in one
    cache entry of their own, least recently used."""
    args = snap.args
    assert args.max_total_tokens is not None
    # The snapshot counts tokens, not pages: allocate at token granularity so that the free count is
    # exactly max_total_tokens − holdings − evictable. Admission arithmetic still uses args.page_size.
    pool = TokenPool(args.max_total_tokens, 1)
    sched = Scheduler(args, token_pool=pool)
    if len(snap.running) > sched.max_running_requests:
        raise SnapshotError(
            f"{len(snap.running)} running requests exceed max_running_requests={sched.max_running_requests}"
        )
    cache = sched.cache
    if cache.enabled:
        claimed = sum(w.cached_prefix_len for w in snap.waiting)
        filler = snap.evictable_tokens - claimed
        if filler:
            cache.insert(_tokens(-(filler + 1), filler), pool.alloc_extend([], filler))
    elif snap.evictable_tokens:
        # A disabled cache reports nothing evictable, yet the snapshot's free count excludes these
        # tokens (free = pool − holdings − evictable): hold them aside.
        pool.alloc_extend([], snap.evictable_tokens)
    stride = 1 << 40  # token-id space per request
    reqs: list[Req] = []
    for i, spec in enumerate(snap.waiting):
        base = (i + 1) * stride
        req = Req(
            rid=spec.rid,
            origin_input_ids=_waiting_ids(base, spec.prompt_len, spec.rid),
            sampling=SamplingLimits(requested_max_new_tokens=spec.max_new_tokens, ignore_eos=spec.ignore_eos),
            output_ids=_waiting_ids(base + spec.prompt_len, spec.output_len, spec.rid),
            seq=i,
            priority=spec.priority,
        )
        sched.prio.resolve(req)
        req.is_retracted = spec.output_len > 0
        if cache.enabled and spec.cached_prefix_len:
            n = spec.cached_prefix_len
            cache.insert(req.fill_ids()[:n], pool.alloc_extend([], n))
        reqs.append(req)
    sched.set_waiting(reqs)
    running: list[Req] = []
    for j, rspec in enumerate(snap.running):
        base = (len(snap.waiting) + j + 1) * stride
        req = Req(
            rid=rspec.rid,
            origin_input_ids=_tokens(base, rspec.prompt_len),
            sampling=SamplingLimits(
                requested_max_new_tokens=rspec.max_new_tokens, ignore_eos=rspec.ignore_eos
            ),
            output_ids=_tokens(base + rspec.prompt_len, rspec.output_len),
            priority=rspec.priority,
        )
        sched.prio.resolve(req)
        sched.prio.stamp(req)  # running requests tie by queue entry: a later one in the list is newer
        req.kv = pool.alloc_extend([], rspec.prompt_len + rspec.output_len + rspec.in_flight)
        sched.req_slots.alloc()
        running.append(req)
    sched.running.extend(running)
    in_flight = [r for r, spec in zip(running, snap.running, strict=True) if spec.in_flight]
    if in_flight:  # the overlap loop's pass: the decode step of these requests is still running
        sched.in_flight = ScheduledBatch(kind="decode", reqs=in_flight)
    if snap.new_token_ratio is not None:
        sched.ratio.current = snap.new_token_ratio
    return sched
