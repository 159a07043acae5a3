"""The running batch's shortcuts (batch.py) against the plain rules they stand for: who has reached
max_new_tokens is a heap lookup, not a scan of the batch, and must name exactly the requests a scan names."""

from __future__ import annotations

import random

from kvadmit.request import FinishKind, FinishReason, Req, SamplingLimits
from kvadmit.scheduler.batch import RunningBatch


def _req(rng: random.Random, n: int) -> Req:
    req = Req(
        rid=f"r{n}",
        origin_input_ids=[1, 2, 3],
        sampling=SamplingLimits(requested_max_new_tokens=rng.randint(1, 12)),
    )
    req.output_ids = [7] * rng.randint(0, req.max_new_tokens - 1)  # joins with a few outputs
    return req


def _scan(batch: RunningBatch) -> list[int]:
    """The plain rule: every live request whose outputs reached max_new_tokens."""
    return [
        i
        for i, r in enumerate(batch.reqs)
        if r.finished_reason is None and len(r.output_ids) >= r.max_new_tokens
    ]


def test_reached_length_names_exactly_the_requests_a_scan_names() -> None:
    rng = random.Random(3)
    made = 0
    for _ in range(50):
        batch = RunningBatch(clip=4096, full_for_ignore_eos=True)
        seen = 0
        for _step in range(60):
            # Requests join (a merged prefill), some leave (retraction keeps the others, in a new order).
            joining = [_req(rng, made + k) for k in range(rng.randint(0, 3))]
            made += len(joining)
            batch.extend(joining)
            if batch.reqs and rng.random() < 0.1:
                kept = rng.sample(batch.reqs, rng.randint(1, len(batch.reqs)))
                batch.replace(kept)
            if not batch.reqs:
                continue
            # A decode step: one token each, then the length check; those it names end (and are dropped at
            # the next pass), and now and then another request ends early (EOS).
            for out in batch.outs:
                out.append(7)
            batch.after_decode_step()
            reached = batch.reached_length()
            assert reached == _scan(batch)
            seen += len(reached)
            ended = set(reached)
            if rng.random() < 0.3:
                ended.add(rng.randrange(len(batch.reqs)))
            for i in ended:
                batch.reqs[i].finished_reason = FinishReason(FinishKind.LENGTH)
            batch.drop_at(sorted(ended))
        assert seen > 0
