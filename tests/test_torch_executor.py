"""The scheduler driving the real model: greedy outputs equal transformers' greedy generation, also when
a small pool forces retraction (the re-prefill of prompt + outputs must continue the same text)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from helpers import make_req
from kvadmit.config import SchedulerKnobs, ServerArgs
from kvadmit.executor.base import StepResult
from kvadmit.executor.torch_runner import TorchExecutor
from kvadmit.model.forward_batch import ForwardBatch, Sequence
from kvadmit.model.loading import load_hf_folder
from kvadmit.request import Req
from kvadmit.sampling_params import SamplingParams
from kvadmit.scheduler.events import Retraction
from kvadmit.scheduler.scheduler import Scheduler
from kvadmit.scheduler.types import ScheduledBatch
from tiny_llama import greedy, greedy_req, save_tiny_llama

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[object, Path]:
    folder = tmp_path_factory.mktemp("tiny")
    return save_tiny_llama(folder), folder


def run(sched: Scheduler, executor: TorchExecutor) -> list[object]:
    events: list[object] = []
    for _ in range(10_000):
        batch = sched.next_batch()
        events += sched.drain_events()
        if batch is None:
            return events
        sched.on_batch_done(batch, executor.run(batch).next_token_ids)
        events += sched.drain_events()
        sched.check_invariants()
    raise AssertionError("did not finish")


PROMPTS = [[5, 17, 3, 88, 41, 9, 60, 2], [33, 71, 12, 44, 7, 90, 1, 8, 19, 23, 42], [3, 3, 3, 3, 3]]


@pytest.mark.parametrize(("page_size", "chunk"), [(1, 8), (4, 8), (16, 16)])  # chunks are whole pages
def test_scheduled_greedy_outputs_equal_transformers(
    tiny: tuple[object, Path], page_size: int, chunk: int
) -> None:
    ref, folder = tiny
    sched = Scheduler(
        ServerArgs(max_total_tokens=512, page_size=page_size, chunked_prefill_size=chunk), context_len=512
    )
    executor = TorchExecutor(load_hf_folder(folder), sched.pool.size)
    reqs = [greedy_req(f"r{i}", p, 12, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    for q in reqs:
        sched.add_request(q)
    run(sched, executor)
    for q, p in zip(reqs, PROMPTS, strict=True):
        assert q.output_ids == greedy(ref, p, 12), q.rid


def test_retraction_and_re_prefill_continue_the_same_text(tiny: tuple[object, Path]) -> None:
    ref, folder = tiny
    # SGLANG_TEST_RETRACT: every third batch retracts a running request, which later re-prefills its
    # prompt + outputs (its prompt from the prefix cache); the greedy text must be unchanged.
    knobs = SchedulerKnobs(test_retract=True, test_retract_interval=3)
    sched = Scheduler(ServerArgs(max_total_tokens=512, knobs=knobs), context_len=512)
    executor = TorchExecutor(load_hf_folder(folder), sched.pool.size)
    reqs = [greedy_req(f"r{i}", p, 20) for i, p in enumerate(PROMPTS)]
    for q in reqs:
        sched.add_request(q)
    events = run(sched, executor)
    assert sum(1 for e in events if isinstance(e, Retraction) and e.rids) >= 3
    for q, p in zip(reqs, PROMPTS, strict=True):
        assert q.output_ids == greedy(ref, p, 20), q.rid


def test_seeded_sampling_through_the_scheduler_is_reproducible(tiny: tuple[object, Path]) -> None:
    _, folder = tiny
    model = load_hf_folder(folder)

    def outputs(executor_seed: int) -> list[list[int]]:
        sched = Scheduler(ServerArgs(max_total_tokens=512), context_len=512)
        executor = TorchExecutor(model, sched.pool.size, seed=executor_seed)
        reqs = []
        for i, p in enumerate(PROMPTS):
            q = make_req(f"r{i}", prompt=p, max_new_tokens=15, ignore_eos=True)
            q.params = SamplingParams(temperature=1.0, top_p=0.9, seed=100 + i)
            reqs.append(q)
            sched.add_request(q)
        run(sched, executor)
        return [q.output_ids for q in reqs]

    first = outputs(executor_seed=1)
    assert outputs(executor_seed=2) == first  # each request's own seed decides its draws
    assert first != [greedy(tiny[0], p, 15) for p in PROMPTS]  # and they are draws, not argmax


class _Quiet:
    def on_step(self, batch: object, now: float) -> None:
        pass

    def on_finish(self, req: Req, now: float) -> None:
        pass


@pytest.mark.parametrize("overlap", [True, False])
def test_the_overlap_loop_and_mixed_chunks_keep_the_real_models_greedy_text(
    tiny: tuple[object, Path], overlap: bool
) -> None:
    # The engine's loops with a real forward: under the overlap loop each batch runs after the last one's
    # result is processed (requests ending on EOS still fill their slot); mixed chunks put decode rows in a
    # prefill batch. A late arrival makes the later prefills mix with the running requests.
    from kvadmit.engine import Engine, VirtualClock

    ref, folder = tiny
    args = ServerArgs(max_total_tokens=512, chunked_prefill_size=8, enable_mixed_chunk=True,
                      disable_overlap_schedule=not overlap)  # fmt: skip
    sched = Scheduler(args, context_len=512)
    engine = Engine(sched, TorchExecutor(load_hf_folder(folder), sched.pool.size), VirtualClock(), _Quiet())
    reqs = [greedy_req(f"r{i}", p, 12, ignore_eos=True) for i, p in enumerate(PROMPTS)]
    mixed = []
    engine.submit(reqs[0])
    for _ in range(3):
        engine.step()
    for q in reqs[1:]:
        engine.submit(q)
    while engine.step():
        if engine.pending is not None and engine.pending[0].decoding:
            mixed.append(engine.pending[0])
        sched.check_invariants()
    assert mixed or not overlap  # (the non-overlap engine keeps no pending batch to look at)
    for q, p in zip(reqs, PROMPTS, strict=True):
        assert q.output_ids == greedy(ref, p, 12), q.rid


def test_compiled_decode_gives_the_same_greedy_outputs(tiny: tuple[object, Path]) -> None:
    """--enable-torch-compile with max-bs 2: three requests decode eagerly while all three run, then
    through the compiled graphs for two and for one; every output equals transformers' greedy one, and
    serving compiles nothing beyond the warm-up's two graphs."""
    from torch._dynamo.utils import counters

    ref, folder = tiny
    sched = Scheduler(ServerArgs(max_total_tokens=512, chunked_prefill_size=64), context_len=512)
    executor = TorchExecutor(load_hf_folder(folder), sched.pool.size, compile_max_bs=2)
    assert executor.compiled is not None
    graphs_after_warm_up = counters["stats"]["unique_graphs"]
    graph, sizes = executor.compiled._graph, []

    def counting(fb: ForwardBatch, kv_pool: list[torch.Tensor]) -> torch.Tensor:
        sizes.append(fb.num_seqs)
        return graph(fb, kv_pool)

    executor.compiled._graph = counting
    run_step, reported = executor.run, []

    def reporting(batch: ScheduledBatch) -> StepResult:
        result = run_step(batch)
        reported.append((batch.kind, len(batch.reqs), result.graph))
        return result

    executor.run = reporting  # type: ignore[method-assign]
    lengths = [12, 6, 3]  # finish one after the other: batches of 3, 2, then 1
    outputs = scheduled_outputs(executor, lengths)
    assert outputs == [greedy(ref, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
    assert set(sizes) == {1, 2}  # (the start-up warm-up compiled both; three at once ran eagerly)
    # each step says whether a graph ran it (the log's "cpu graph: True", as SGLang's CPU graph runner)
    assert {(kind, n, graph) for kind, n, graph in reported if kind == "decode"} == {
        ("decode", 3, False),
        ("decode", 2, True),
        ("decode", 1, True),
    }
    assert not any(graph for kind, _, graph in reported if kind == "prefill")
    # (a warm-up outside inference mode left both graphs guarded on it: each size compiled again here)
    assert counters["stats"]["unique_graphs"] == graphs_after_warm_up


def scheduled_outputs(executor: TorchExecutor, lengths: list[int]) -> list[list[int]]:
    """Greedy outputs of PROMPTS (each `lengths[i]` tokens) scheduled through `executor`."""
    sched = Scheduler(ServerArgs(max_total_tokens=512, chunked_prefill_size=64), context_len=512)
    reqs = [
        greedy_req(f"r{i}", p, n, ignore_eos=True)
        for i, (p, n) in enumerate(zip(PROMPTS, lengths, strict=True))
    ]
    for q in reqs:
        sched.add_request(q)
    run(sched, executor)
    return [q.output_ids for q in reqs]


def test_a_bf16_model_compiles_and_decodes_as_it_does_eagerly(tiny: tuple[object, Path]) -> None:
    """bf16 linear layers are oneDNN-packed (cpu_pack.py); compiling them failed in warm-up (inductor could
    not lower the packed product). The compiled executor keeps its graphs, and a decode step of one and of
    two sequences gives the eager step's logits up to bf16 rounding (a tiny random model's greedy text is
    too close to ties to compare: fused bf16 arithmetic rounds differently)."""
    _, folder = tiny
    model = load_hf_folder(folder, torch.bfloat16)
    executor = TorchExecutor(model, 512, compile_max_bs=2)
    assert executor.compiled is not None  # no fallback
    prompts = PROMPTS[:2]
    starts = [1, 1 + len(prompts[0]) + 1]  # each prompt's slots, then one more for its next token
    prefill = [Sequence(torch.arange(s, s + len(p)), len(p)) for s, p in zip(starts, prompts, strict=True)]
    ids = torch.tensor([t for p in prompts for t in p])
    positions = torch.cat([torch.arange(len(p)) for p in prompts])
    model.forward(ids, positions, prefill, executor.kv_pool)
    for b in (1, 2):
        seqs = [
            Sequence(torch.arange(s, s + len(p) + 1), 1) for s, p in zip(starts[:b], prompts[:b], strict=True)
        ]
        fb = ForwardBatch.build(torch.tensor([7, 11][:b]), torch.tensor([len(p) for p in prompts[:b]]), seqs)
        assert executor.compiled.applies(fb)
        eager = model.forward_batch(fb, executor.kv_pool).float()
        compiled = executor.compiled(fb, executor.kv_pool).float()
        assert compiled.shape == eager.shape == (b, 97)
        scale = float(eager.abs().max())
        assert (compiled - eager).abs().max() <= 0.03 * scale  # a wrong graph is off by O(scale)
    assert executor.compiled is not None


def test_compiling_that_fails_in_warm_up_falls_back_to_eager_with_one_log_line(
    tiny: tuple[object, Path], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from kvadmit.model.compiled import CompiledDecode

    def fail(self: CompiledDecode, kv_pool: list[torch.Tensor]) -> None:
        raise RuntimeError("LoweringException: AssertionError:\n  target: some.op")

    ref, folder = tiny
    monkeypatch.setattr(CompiledDecode, "warm_up", fail)
    with caplog.at_level("WARNING", logger="kvadmit"):
        executor = TorchExecutor(load_hf_folder(folder), 512, compile_max_bs=2)
    assert executor.compiled is None
    assert [r.getMessage() for r in caplog.records if r.name.startswith("kvadmit")] == [
        "--enable-torch-compile: compiling failed in warm-up (RuntimeError: LoweringException: "
        "AssertionError:); decoding eagerly instead"
    ]
    lengths = [12, 6, 3]
    assert scheduled_outputs(executor, lengths) == [
        greedy(ref, p, n) for p, n in zip(PROMPTS, lengths, strict=True)
    ]


def test_a_compiled_batch_that_fails_runs_eagerly_and_so_does_every_later_one(
    tiny: tuple[object, Path], caplog: pytest.LogCaptureFixture
) -> None:
    ref, folder = tiny
    executor = TorchExecutor(load_hf_folder(folder), 512, compile_max_bs=2)
    assert executor.compiled is not None
    calls = []

    def fail(fb: ForwardBatch, kv_pool: list[torch.Tensor]) -> torch.Tensor:
        calls.append(fb.num_seqs)
        raise RuntimeError("recompilation failed")

    executor.compiled._graph = fail
    lengths = [12, 6, 3]
    with caplog.at_level("WARNING", logger="kvadmit"):
        outputs = scheduled_outputs(executor, lengths)
    assert outputs == [greedy(ref, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
    assert len(calls) == 1 and executor.compiled is None  # tried once, then eager for good
    ours = [r.getMessage() for r in caplog.records if r.name.startswith("kvadmit")]
    assert len(ours) == 1 and "compiling failed on a batch" in ours[0]


def test_prefills_split_into_small_passes_keep_the_greedy_text(tiny: tuple[object, Path]) -> None:
    """Passes of 4 new tokens: the prompts (8, 11 and 5 tokens, one 64-token chunk) take 6 passes, each
    request's later pieces attending to its earlier ones through the pool; the text equals transformers'."""
    ref, folder = tiny
    model = load_hf_folder(folder)
    executor = TorchExecutor(model, 512)
    executor.pass_tokens = 4
    passes = []
    forward = model.forward_batch

    def counting(fb: ForwardBatch, kv_pool: list[torch.Tensor], all_positions: bool = False) -> torch.Tensor:
        passes.append(int(fb.input_ids.shape[0]))
        return forward(fb, kv_pool, all_positions)

    model.forward_batch = counting  # type: ignore[method-assign]
    lengths = [12, 6, 3]
    outputs = scheduled_outputs(executor, lengths)
    assert outputs == [greedy(ref, p, n) for p, n in zip(PROMPTS, lengths, strict=True)]
    assert passes[:6] == [4, 4, 4, 4, 4, 4]  # 24 prompt tokens; then decode steps of 3, 2, 1 sequences
    assert passes[6:] == [3] * 2 + [2] * 3 + [1] * 6
