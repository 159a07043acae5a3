"""schemathesis against the app's own OpenAPI schema, over real HTTP (`serve --simulate`): whatever a
client sends, the answer is never a 5xx."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis.errors import Unsatisfiable

from server_helpers import RunningServer, pool_is_whole, running_server, wait_idle, write_cost_model

schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    cost = write_cost_model(Path(tmp_path_factory.mktemp("fuzz")) / "cost.json", decode_ms=0.01)
    with running_server(["--simulate", cost, "--max-total-tokens", "4096", "--context-length", "2048",
                         "--enable-metrics"]) as srv:  # fmt: skip
        yield srv
        wait_idle(srv)
        free, size = pool_is_whole(srv)
        assert free == size


@pytest.fixture(scope="module")
def api_schema(fuzz_server: RunningServer):  # type: ignore[no-untyped-def]
    return schemathesis.openapi.from_url(f"{fuzz_server.url}/openapi.json")


def test_no_server_errors(api_schema) -> None:  # type: ignore[no-untyped-def]
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert {"/generate", "/v1/completions", "/v1/chat/completions"} <= {op.path for op in operations}
    modes = (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE)
    for op, mode in itertools.product(operations, modes):

        @given(case=op.as_strategy(generation_mode=mode))
        @settings(max_examples=30, deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def no_5xx(case) -> None:  # type: ignore[no-untyped-def]
            response = case.call(timeout=60)
            assert response.status_code < 500, (
                f"{case.method} {case.path} {case.body!r} → {response.status_code}: {response.text[:300]}"
            )

        try:
            no_5xx()
        except Unsatisfiable:
            # an operation with nothing to get wrong (no body, no parameters) has no negative cases
            assert mode is schemathesis.GenerationMode.NEGATIVE
