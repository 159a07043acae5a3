"""The frozen dataclasses a sweep hands to its worker processes (and Ray to its tasks) survive pickle,
copy and deepcopy, field by field: on the compiled core (`make test-native` runs this file there), where
a frozen field refuses pickle's own restore and kvadmit/pickling.py rebuilds them by their constructor,
and in pure Python."""

from __future__ import annotations

import copy
import dataclasses
import pickle
from collections.abc import Callable
from typing import Any

import pytest

from kvadmit.bench.workload import SimRequest, WorkloadSpec
from kvadmit.costmodel.costmodel import CostModel, DecodeCost, DecodeTable, PrefillCost

# every field away from its default, so a field the rebuild dropped or moved shows
OBJECTS: list[Any] = [
    CostModel(
        DecodeCost(
            base_ms=9.0,
            per_request_ms=0.5,
            table=DecodeTable((1, 8), (100, 1000), ((10.0, 12.0), (14.0, 20.0))),
        ),
        PrefillCost(
            base_ms=3.0, tokens_per_s=5000.0, per_request_ms=0.25, per_cached_token_ms=0.01, memory_ms=1.5
        ),
        {"name": "a table", "source": "test"},
    ),
    SimRequest(4, 100, 50, 60, 20, False, 7, (1, 2, 3), priority=5),
    WorkloadSpec(10, 300, 200, 0.5, 3, 5000, False, 64, "full", (5, 6), ((0, 1.0), (10, 2.0))),
]
WAYS: dict[str, Callable[[Any], Any]] = {
    "pickle": lambda o: pickle.loads(pickle.dumps(o)),
    "copy": copy.copy,
    "deepcopy": copy.deepcopy,
}


@pytest.mark.parametrize("obj", OBJECTS, ids=lambda o: type(o).__name__)
@pytest.mark.parametrize("way", list(WAYS))
def test_every_field_comes_back(obj: Any, way: str) -> None:
    back = WAYS[way](obj)
    assert type(back) is type(obj)
    for f in dataclasses.fields(obj):
        assert getattr(back, f.name) == getattr(obj, f.name), f.name
    assert back.decode == obj.decode if isinstance(obj, CostModel) else back == obj
