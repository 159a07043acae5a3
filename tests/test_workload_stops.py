"""Where a request stops without ignore_eos (bench/workload.py): from a second generator seeded with
--seed + 1, one draw uniform in [1, max_new_tokens] per request, in request order, so that the lengths,
offsets and arrivals drawn from the first generator never shift."""

from __future__ import annotations

import numpy as np

from kvadmit.bench.workload import WorkloadSpec, build_workload


def test_each_request_stops_at_its_own_draw_in_order() -> None:
    spec = WorkloadSpec(
        num_prompts=500, input_len=64, output_len=900, range_ratio=0.1, seed=7, ignore_eos=False
    )
    reqs, _ = build_workload(spec)
    stops = np.random.RandomState(spec.seed + 1)
    expected = [int(stops.randint(1, r.max_new_tokens + 1)) for r in reqs]  # the rule, one call at a time
    assert [r.true_output_len for r in reqs] == expected
    assert len({r.max_new_tokens for r in reqs}) > 100  # the bounds differ from request to request


def test_the_first_generator_is_where_ignore_eos_leaves_it() -> None:
    """The Poisson gaps come next from the first generator: the stop draws must not move it."""
    base = dict(num_prompts=50, input_len=64, output_len=200, range_ratio=0.5, seed=11)
    _, with_eos = build_workload(WorkloadSpec(**base, ignore_eos=True))  # type: ignore[arg-type]
    _, stopping = build_workload(WorkloadSpec(**base, ignore_eos=False))  # type: ignore[arg-type]
    assert with_eos.exponential(1.0, 5).tolist() == stopping.exponential(1.0, 5).tolist()
