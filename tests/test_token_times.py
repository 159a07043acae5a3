"""The client's token times at the end of a run (sim/client.py fill_token_times, sim/token_times.py) and
the ITL figures read from them in one array (bench/metrics.py): the same floats as the plain definitions."""

from __future__ import annotations

import itertools
import random

import numpy as np

from kvadmit.bench.metrics import RequestOutcome, calculate_metrics, pairwise_std
from kvadmit.bench.workload import SimRequest
from kvadmit.engine import VirtualClock
from kvadmit.sim.client import SimClient, _Flight, fill_token_times
from kvadmit.sim.token_times import Piece


def test_pairwise_std_is_numpys_std_bit_for_bit() -> None:
    rng = np.random.default_rng(3)
    sizes = [1, 2, 7, 8, 9, 127, 128, 129, 1000, 32_768, 32_769, 65_543, 100_003, 300_001]
    for n in sizes:
        for a in (rng.random(n), rng.exponential(0.02, n) * 1e3, np.round(rng.random(n), 2) + 1e-9):
            assert pairwise_std(a) == float(np.std(a)), n


def _clients(rng: random.Random) -> tuple[list[SimClient], list[RequestOutcome], dict[int, list[float]]]:
    """Two clients (a fleet's replicas) with their own decode steps, and requests whose token times are a
    prefill time or two and runs of decode steps, finishing in an order of their own."""
    spec = SimRequest(0, 1, 1, 1, None, True, 0)
    clients, outcomes, truth = [], [], {}
    for _ in range(2):
        c = SimClient(None, VirtualClock(), 10, None)
        n = rng.randint(5, 60)
        c._decode_times = np.cumsum([rng.uniform(0.01, 0.05) for _ in range(n)]) + rng.uniform(0, 1)
        c.n_decode = n
        clients.append(c)
    for i in range(40):
        c = clients[rng.randrange(2)]
        times = c._decode_times.tolist()
        pieces: list[Piece] = []
        tokens: list[float] = []
        at = rng.randrange(c.n_decode)
        for _ in range(rng.randint(1, 3)):  # a prefill, then maybe a decode run (a retraction: again)
            t = times[at] - rng.uniform(0, 0.01)
            pieces.append(t)
            tokens.append(t)
            if at + 1 < c.n_decode and rng.random() < 0.8:
                last = rng.randrange(at + 1, c.n_decode)
                pieces.append((at + 1, last))
                tokens += times[at + 1 : last + 1]
                at = last
            if at + 2 >= c.n_decode:
                break
            at = rng.randrange(at + 1, c.n_decode)
        out = RequestOutcome(
            prompt_len=1, success=rng.random() < 0.9, start_time=tokens[0] - 0.5, latency=9.0
        )
        outcomes.append(out)
        if out.success:
            c._succeeded.append((_Flight(spec, out, out.start_time, pieces), out))
            truth[i] = tokens
    for c in clients:
        rng.shuffle(c._succeeded)  # the order they finished in is not the outcomes' order
    return clients, outcomes, truth


def test_gaps_of_a_fleets_replicas_are_the_plain_differences_in_outcome_order() -> None:
    rng = random.Random(11)
    for _ in range(20):
        clients, outcomes, truth = _clients(rng)
        g = fill_token_times(clients, outcomes)
        expected = [b - a for i in sorted(truth) for a, b in itertools.pairwise(truth[i])]
        assert g.gaps.tolist() == expected
        for i, tokens in truth.items():
            assert outcomes[i].ttft == tokens[0] - outcomes[i].start_time
            assert list(outcomes[i].itl) == [b - a for a, b in itertools.pairwise(tokens)]
        g.gaps[:] = g.gaps[::-1].copy()  # a reader reorders them; rewrite() puts them back
        g.rewrite()
        assert g.gaps.tolist() == expected


def test_metrics_from_the_clients_array_are_the_metrics_from_the_outcomes() -> None:
    rng = random.Random(12)
    for _ in range(20):
        clients, outcomes, _ = _clients(rng)
        g = fill_token_times(clients, outcomes)
        plain = calculate_metrics(outcomes, 10.0)  # concatenates the outcomes' itl itself
        every = np.concatenate([np.asarray(o.itl) for o in outcomes if o.success])
        assert calculate_metrics(outcomes, 10.0, g.gaps) == plain
        # the standard deviation is numpy's over the gaps as the percentiles' partition leaves them
        np.percentile(every, [50, 90, 95, 99], overwrite_input=True)
        assert plain.itl_ms["std"] == float(np.std(every)) * 1000
