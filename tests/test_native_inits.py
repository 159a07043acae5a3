"""Dataclasses of the hot path write their __init__ out (the compiled core builds an object natively that
way; dataclass's generated __init__ is interpreted Python, a tenth of a compiled fleet run). Each must
take the dataclass's own parameters, in order, with its defaults, and give every field the value the
generated __init__ would."""

from __future__ import annotations

import dataclasses
import inspect

import pytest

from kvadmit import native
from kvadmit.bench.workload import SimRequest
from kvadmit.memory.pool import new_slots
from kvadmit.memory.radix import RadixNode
from kvadmit.request import MAX_NEW_TOKENS_UNSET, FinishKind, FinishReason, Req, SamplingLimits
from kvadmit.scheduler.events import DecodeBatchStats, PrefillBatchStats
from kvadmit.scheduler.types import AdmissionRecord, ScheduledBatch, StepOutcome
from kvadmit.sim.client import _Flight


def _without_default(cls: type) -> dict[str, object]:
    return {f.name: 1 for f in dataclasses.fields(cls) if f.default is dataclasses.MISSING}


# the classes, and values for their parameters without a default
REQUIRED: dict[type, dict[str, object]] = {
    ScheduledBatch: {"kind": "decode", "reqs": []},
    AdmissionRecord: {"running_bs": 3},
    StepOutcome: {},
    FinishReason: {"kind": FinishKind.STOP},
    SamplingLimits: {},
    Req: {"rid": "r", "origin_input_ids": [1, 2]},
    PrefillBatchStats: _without_default(PrefillBatchStats),
    DecodeBatchStats: _without_default(DecodeBatchStats),
    RadixNode: {"key": [1], "value": new_slots([5]), "parent": None, "children": {}},
    SimRequest: {**_without_default(SimRequest), "ignore_eos": True},
    _Flight: {"spec": SimRequest(0, 1, 1, 1, None, False, 0), "outcome": None, "sent": 0.5},
}


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda c: c.__name__)
def test_parameters_are_the_fields(cls: type) -> None:
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    if [p.kind for p in params] == [inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD]:
        pytest.skip("the compiled core's __init__ has no signature to read (checked on the source)")
    fields = [f for f in dataclasses.fields(cls) if f.init]
    assert [p.name for p in params] == [f.name for f in fields]
    for p, f in zip(params, fields, strict=True):
        if f.default is not dataclasses.MISSING:
            assert p.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert p.default is None, f.name  # None stands for "a new one from the factory"
        else:
            assert p.default is inspect.Parameter.empty, f.name


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda c: c.__name__)
def test_defaults_are_the_fields_defaults(cls: type) -> None:
    given = REQUIRED[cls]
    a, b = cls(**given), cls(**given)
    for f in dataclasses.fields(cls):
        if f.name in given or not f.init:
            continue
        if f.default is not dataclasses.MISSING:
            assert getattr(a, f.name) == f.default, f.name
        else:
            expected = f.default_factory()  # type: ignore[misc]
            assert type(getattr(a, f.name)) is type(expected) and getattr(a, f.name) == expected, f.name
            if isinstance(expected, list | dict | set) or type(expected).__name__ == "array":
                assert getattr(a, f.name) is not getattr(b, f.name), f"{f.name}: shared between objects"


@pytest.mark.parametrize("cls", list(REQUIRED), ids=lambda c: c.__name__)
def test_given_values_are_kept(cls: type) -> None:
    """Every parameter, passed by name, lands in its field (a value no default has)."""
    if native.status().startswith("compiled"):
        pytest.skip("the compiled core checks each argument's type (this test passes a marker object)")
    marker = object()
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        kwargs = {**REQUIRED[cls], f.name: marker}
        if cls is Req and f.name == "sampling":
            continue  # read at once (below)
        assert getattr(cls(**kwargs), f.name) is marker, f.name


def test_frozen_stay_frozen() -> None:
    for obj in (FinishReason(FinishKind.STOP), SamplingLimits(), DecodeBatchStats(1, 2, 0.5, 3, 4)):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(obj, dataclasses.fields(obj)[0].name, 3)


def test_request_budget_starts_as_asked() -> None:
    asked = SamplingLimits(
        requested_max_new_tokens=7, min_new_tokens=2, stop_token_ids=frozenset({9}), priority=4
    )
    req = Req("r", [1], sampling=asked)
    assert (req.max_new_tokens, req.min_new_tokens, req.stop_token_ids, req.priority) == (7, 2, {9}, 4)
    assert Req("r", [1], sampling=asked, priority=1).priority == 1  # its own priority wins
    unset = Req("r", [1], sampling=SamplingLimits(requested_max_new_tokens=None))
    assert unset.max_new_tokens == MAX_NEW_TOKENS_UNSET
    assert Req("r", [1]).max_new_tokens == 128 and Req("r", [1]).sampling == SamplingLimits()
    assert dataclasses.replace(asked, priority=2) == SamplingLimits(7, False, 2, frozenset({9}), 2)
