"""Which decode batches get a CUDA graph: SGLang 0.5.22's rules (its memory hook's defaults, its capture
list), and the key-length buckets; each expectation worked out from the rule, not read from the code."""

from __future__ import annotations

import itertools

import pytest

from kvadmit.model.cuda_graph_sizes import (
    GraphFlags,
    capture_sizes,
    context_buckets,
    default_max_bs,
    padded_size,
)

GIB = 1024  # MiB


@pytest.mark.parametrize(
    ("gpu_gib", "expected"),
    [
        (16, 8),  # T4: under 20 GiB
        (24, 48),  # RTX 4090: under 35
        (40, 32),  # A100 40 GB: under 60
        (80, 256),  # H100: under 90
        (140.4, 256),  # H200 (143,771 MiB): under 160
        (180, 512),  # B200
        (None, 160),  # memory unknown
    ],
)
def test_the_default_max_bs_follows_the_gpus_memory(gpu_gib: float | None, expected: int) -> None:
    mib = None if gpu_gib is None else gpu_gib * GIB
    assert default_max_bs(mib) == expected


def test_a_default_above_max_running_requests_is_cut_to_it_but_a_given_max_bs_is_not() -> None:
    assert default_max_bs(80 * GIB, max_running_requests=64) == 64
    assert default_max_bs(80 * GIB, max_running_requests=1000) == 256
    given = GraphFlags(max_bs=300, max_running_requests=64).capture_sizes("cuda", 80 * GIB)
    assert given is not None and given[-1] == 300


def test_the_capture_list_up_to_256() -> None:
    # 1, 2, 4, 8, 12, then every 8 from 16 to 256: 5 + 31 sizes
    sizes = capture_sizes(256)
    assert sizes[:7] == [1, 2, 4, 8, 12, 16, 24]
    assert len(sizes) == 36 and sizes[-1] == 256
    assert all(b - a == 8 for a, b in itertools.pairwise(sizes[5:]))


def test_the_largest_size_is_always_captured() -> None:
    assert capture_sizes(40) == [1, 2, 4, 8, 12, 16, 24, 32, 40]
    assert capture_sizes(10) == [1, 2, 4, 8, 10]
    assert capture_sizes(1) == [1]


def test_above_256_every_16_then_every_32() -> None:
    sizes = capture_sizes(600)
    assert sizes[sizes.index(256) :] == [256, *range(272, 497, 16), 512, 544, 576, 600]


def test_no_padding_captures_every_size_and_a_given_list_is_used_as_it_is() -> None:
    assert capture_sizes(5, no_padding=True) == [1, 2, 3, 4, 5]
    assert capture_sizes(256, given=[8, 2, 2, 48]) == [2, 8, 48]  # the list's largest is the max bs


@pytest.mark.parametrize(("max_bs", "given", "message"), [
    (0, None, "--cuda-graph-max-bs-decode must be at least 1, not 0"),
    (8, [4, 0], "--cuda-graph-bs-decode takes batch sizes of at least 1"),
])  # fmt: skip
def test_sizes_no_device_could_take_are_refused(max_bs: int, given: list[int] | None, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        GraphFlags(max_bs=max_bs, sizes=given).check()


def test_a_batch_runs_at_the_smallest_captured_size_that_holds_it() -> None:
    sizes = [1, 2, 4, 8, 12, 16]
    assert [padded_size(sizes, b) for b in (1, 2, 3, 5, 9, 16)] == [1, 2, 4, 8, 12, 16]
    assert padded_size(sizes, 17) is None  # larger than every graph: eager


def test_key_lengths_are_powers_of_two_up_to_the_context_length() -> None:
    assert context_buckets(8192) == [256, 512, 1024, 2048, 4096, 8192]
    assert context_buckets(1000) == [256, 512, 1000]
    assert context_buckets(100) == [100]
    assert padded_size(context_buckets(8192), 257) == 512


def test_no_graphs_off_a_gpu_or_when_disabled() -> None:
    assert GraphFlags().capture_sizes("cpu", None) is None
    assert GraphFlags(disable=True).capture_sizes("cuda", 80 * GIB) is None
    assert GraphFlags().capture_sizes("cuda", 16 * GIB) == [1, 2, 4, 8]
