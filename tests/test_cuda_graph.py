"""Decode steps replayed from graphs (model/cuda_graph.py) keep the real model's greedy text.

Where there is no GPU, the graph is replaced by calling the pass again on the same buffers (`EagerReplay`):
what is tested is everything around the recording (the fixed buffers, the padded rows and keys, the
captured sizes, the choice of graph, the eager fallback, "cuda graph: True" in the log). On a GPU the same
runs record real CUDA graphs and are compared with eager decoding on that GPU."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import torch

from kvadmit.config import ServerArgs
from kvadmit.engine import Engine, VirtualClock
from kvadmit.executor.torch_runner import Row, TorchExecutor
from kvadmit.model.loading import load_hf_folder
from kvadmit.observe.sglang_log import SGLangLogWriter
from kvadmit.request import Req
from kvadmit.scheduler.events import DecodeBatchStats
from kvadmit.scheduler.scheduler import Scheduler
from tiny_llama import CONTEXT, greedy, greedy_req, save_tiny_llama  # (512 positions: keys 256 and 512)

transformers = pytest.importorskip("transformers")


class EagerReplay:
    """A stand-in for CUDA graph capture: 'replaying' runs the recorded pass again on its buffers."""

    def __init__(self) -> None:
        self.captured = 0

    def __call__(self, forward: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        self.captured += 1
        forward()  # (as a capture runs the pass once)
        return forward


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return save_tiny_llama(folder), folder


class _Quiet:
    def on_step(self, batch: object, now: float) -> None:
        pass

    def on_finish(self, req: Req, now: float) -> None:
        pass


# three short prompts decode together (padded to 4); a fourth of 300 tokens takes the 512-key graphs; a
# fifth makes a batch of 5, above the largest graph (4): eager
PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2], [33, 71, 12, 44, 7, 90, 1, 8, 19, 23, 42], [3, 3, 3, 3, 3]]
LONG = [(7 * i) % 97 for i in range(300)]


Served = tuple[list[Req], TorchExecutor, list[bool], list[DecodeBatchStats]]


def serve(
    folder: Path, prompts: list[list[int]], device: str, capture: object | None, sizes: list[int] | None
) -> Served:
    """Run `prompts` through the engine (overlap loop, one decode log line per step); returns the requests,
    the executor, each decode step's 'ran from a graph' and the decode log events."""
    args = ServerArgs(max_total_tokens=2048, chunked_prefill_size=512, decode_log_interval=1)
    sched = Scheduler(args, context_len=CONTEXT)
    model = load_hf_folder(folder, device=device)
    executor = TorchExecutor(model, sched.pool.size, graph_sizes=sizes, context_len=CONTEXT,
                             graph_capture=capture)  # type: ignore[arg-type]  # fmt: skip
    stepped: list[bool] = []
    run = executor.run

    def watched(batch):  # type: ignore[no-untyped-def]
        result = run(batch)
        if batch.kind == "decode":
            stepped.append(result.graph)
        return result

    executor.run = watched  # type: ignore[method-assign]
    events: list[DecodeBatchStats] = []

    def note(event: object, now: float) -> None:
        if isinstance(event, DecodeBatchStats):
            events.append(event)

    engine = Engine(sched, executor, VirtualClock(), _Quiet(), [note])
    reqs = [greedy_req(f"r{i}", p, 12, ignore_eos=True) for i, p in enumerate(prompts)]
    for q in reqs:
        engine.submit(q)
    while engine.step():
        sched.check_invariants()
    return reqs, executor, stepped, events


def test_replayed_decode_keeps_the_greedy_text_padded_in_batch_and_keys(
    tiny: tuple[object, Path],
) -> None:
    ref, folder = tiny
    capture = EagerReplay()
    prompts = [*PROMPTS, LONG]
    reqs, executor, stepped, events = serve(folder, prompts, "cpu", capture, [1, 2, 4])
    for q, p in zip(reqs, prompts, strict=True):
        assert q.output_ids == greedy(ref, p, 12), q.rid
    graphs = executor.graphs
    assert graphs is not None
    # start-up: every size at 256 keys, largest first; then 4 sequences with the 300-token one: 512 keys
    assert set(graphs.graphs) >= {(4, 256), (2, 256), (1, 256), (4, 512)}
    assert capture.captured == len(graphs.graphs)
    assert stepped and all(stepped)  # every decode batch (at most 4) was replayed
    assert events and all(e.graph for e in events)


cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU (none here)")
DEVICES = ["cpu", pytest.param("cuda", marks=cuda)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("contexts", [[9, 300, 5], [40], [2, 3]])
def test_replayed_logits_equal_eager_decodings(
    tiny: tuple[object, Path], contexts: list[int], device: str
) -> None:
    """Sequences of these lengths, their tokens but the last already in the pool: the replayed step (padded
    to 4 or 1 rows, keys to 256 or 512) gives eager decoding's logits (on a GPU, from real CUDA graphs)."""
    _, folder = tiny
    model = load_hf_folder(folder, device=device)
    capture = EagerReplay() if device == "cpu" else None
    executor = TorchExecutor(model, 2048, graph_sizes=[1, 2, 4], context_len=CONTEXT, graph_capture=capture)
    before: list[Row] = []
    rows: list[Row] = []
    base = 1  # (slot 0 pads)
    for c in contexts:
        ids = [(3 * i + c) % 97 for i in range(c)]
        slots = list(range(base, base + c))
        base += c
        before.append(Row(ids[:-1], 0, c - 1, slots[:-1]))
        rows.append(Row(ids[-1:], c - 1, c, slots))
    with torch.inference_mode():
        model.forward_batch(executor.forward_batch(before), executor.kv_pool)
        eager = model.forward_batch(executor.forward_batch(rows), executor.kv_pool)
    assert executor.graphs is not None
    tolerance = 1e-5 if device == "cpu" else 1e-4  # (a GPU's kernels differ with the batch's shape)
    torch.testing.assert_close(executor.graphs(rows), eager, rtol=tolerance, atol=tolerance)


def test_a_batch_above_the_largest_graph_decodes_eagerly(tiny: tuple[object, Path]) -> None:
    ref, folder = tiny
    prompts = [*PROMPTS, [11, 12, 13], [50, 40, 30, 20]]  # five decode together; graphs hold 4
    reqs, _, stepped, events = serve(folder, prompts, "cpu", EagerReplay(), [1, 2, 4])
    for q, p in zip(reqs, prompts, strict=True):
        assert q.output_ids == greedy(ref, p, 12), q.rid
    assert stepped[0] is False  # all five decode eagerly
    assert any(not e.graph for e in events)


def test_the_decode_line_says_cuda_graph_true_when_the_step_was_replayed() -> None:
    lines: list[str] = []
    writer = SGLangLogWriter(lines.append, start_time=0.0)
    for graph in (True, False):
        writer.handle(DecodeBatchStats(3, 100, 0.1, 0, 40, graph=graph), 1.0)
    assert "cuda graph: True, " in lines[0] and "cuda graph: False, " in lines[1]


@pytest.mark.usefixtures("kvadmit_logging_restored")
@pytest.mark.parametrize(("flags", "message"), [
    (["--cuda-graph-max-bs", "0"], "--cuda-graph-max-bs-decode must be at least 1, not 0"),
    (["--cuda-graph-max-bs-decode", "-4"], "--cuda-graph-max-bs-decode must be at least 1, not -4"),
    (["--cuda-graph-bs-decode", "0", "8"], "--cuda-graph-bs-decode takes batch sizes of at least 1, not [0,"),
])  # fmt: skip
def test_serve_refuses_graph_sizes_no_gpu_could_take(
    flags: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    from kvadmit.cli import main

    assert main(["serve", *flags, "--port", "1"]) == 2  # before any model is loaded
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@cuda
def test_real_cuda_graphs_give_eager_decodings_tokens(tiny: tuple[object, Path]) -> None:
    _, folder = tiny
    prompts = [*PROMPTS, LONG]
    replayed, executor, stepped, _ = serve(folder, prompts, "cuda", None, [1, 2, 4])
    eager, _, eager_stepped, _ = serve(folder, prompts, "cuda", None, None)
    assert executor.graphs is not None and all(stepped) and not any(eager_stepped)
    for a, b in zip(replayed, eager, strict=True):
        assert a.output_ids == b.output_ids, a.rid
