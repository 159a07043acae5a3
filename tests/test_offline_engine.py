"""kvadmit.Engine on a tiny random model with a real tokenizer: batching changes nothing, stop strings,
meta info, and the pool comes back whole."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder = tmp_path_factory.mktemp("tiny-engine")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = ["the quick brown fox jumps over the lazy dog. stop here. " * 4] * 10
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"], initial_alphabet=alphabet)
    tok.train_from_iterator(corpus, trainer)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    fast.save_pretrained(folder)
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=fast.vocab_size, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        eos_token_id=fast.eos_token_id,
    )  # fmt: skip
    transformers.LlamaForCausalLM(cfg).float().eval().save_pretrained(folder, safe_serialization=True)
    return folder


GREEDY = {"temperature": 0.0, "max_new_tokens": 12, "ignore_eos": True}
PROMPTS = ["the quick brown", "over the lazy dog", "fox"]


def test_a_batch_equals_each_request_alone_and_meta_info_adds_up(tiny_folder: Path) -> None:
    import kvadmit

    engine = kvadmit.Engine(str(tiny_folder), dtype="float32", max_total_tokens=2048, chunked_prefill_size=4)
    together = engine.generate(PROMPTS, GREEDY)
    alone = [engine.generate(p, GREEDY) for p in PROMPTS]
    assert [o["output_ids"] for o in together] == [o["output_ids"] for o in alone]  # type: ignore[index]
    first = together[0]  # type: ignore[index]
    assert first["meta_info"]["completion_tokens"] == 12
    assert first["meta_info"]["prompt_tokens"] == len(engine.tokenizer.encode(PROMPTS[0]))
    assert first["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    # The second time a prompt is asked, its prefix comes from the cache.
    again = engine.generate(PROMPTS[0], GREEDY)
    assert again["meta_info"]["cached_tokens"] > 0  # type: ignore[index]
    engine.scheduler.cache.reset()
    assert engine.scheduler.pool.available_size() == engine.scheduler.pool.size


def test_a_small_pool_retracts_for_real_and_changes_no_output(tiny_folder: Path) -> None:
    import kvadmit

    big = kvadmit.Engine(str(tiny_folder), dtype="float32", max_total_tokens=4096)
    reference = big.generate(PROMPTS * 3, {**GREEDY, "max_new_tokens": 40, "ignore_eos": False})
    # 160 slots cannot hold nine requests growing to ~45 tokens each: the scheduler retracts.
    small = kvadmit.Engine(
        str(tiny_folder), dtype="float32", max_total_tokens=160, schedule_conservativeness=0.1
    )
    events: list[object] = []
    # every event the engine drains from the scheduler (an observer, not a patched method: the compiled
    # core's Scheduler refuses an instance attribute)
    small.engine.observers.append(lambda event, now: events.append(event))
    out = small.generate(PROMPTS * 3, {**GREEDY, "max_new_tokens": 40, "ignore_eos": False})
    from kvadmit.scheduler.events import Retraction

    assert any(isinstance(e, Retraction) and e.rids for e in events)
    assert [o["output_ids"] for o in out] == [o["output_ids"] for o in reference]  # type: ignore[index]


def test_a_stop_string_ends_the_text_before_it(tiny_folder: Path) -> None:
    import kvadmit

    engine = kvadmit.Engine(str(tiny_folder), dtype="float32", max_total_tokens=2048)
    full = engine.generate("the quick", {**GREEDY, "max_new_tokens": 30})
    text = full["text"]  # type: ignore[index]
    assert len(text) > 4
    stop = text[2:4]
    cut = engine.generate("the quick", {**GREEDY, "max_new_tokens": 30, "stop": stop})
    assert cut["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}  # type: ignore[index]
    assert cut["text"] == text[: text.find(stop)]  # type: ignore[index]


def test_the_generate_command(tiny_folder: Path) -> None:
    import json
    import subprocess
    import sys

    run = subprocess.run(
        [sys.executable, "-m", "kvadmit", "generate", "the quick", "--model-path", str(tiny_folder),
         "--temperature", "0", "--max-new-tokens", "5", "--json"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr
    out = json.loads(run.stdout)
    assert out["meta_info"]["completion_tokens"] == 5 and len(out["output_ids"]) == 5
    bad = subprocess.run([sys.executable, "-m", "kvadmit", "generate", "x", "--model-path", "/no/such/model"],
                         capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert bad.returncode == 2 and "does not exist" in bad.stderr and "Traceback" not in bad.stderr


def test_the_pool_is_sized_from_memory_as_sglang_does() -> None:
    from kvadmit.model.sizing import kv_bytes_per_token, pool_tokens

    # SmolLM2-135M in fp32: K and V × 30 layers × 3 KV heads × 64 dims × 4 bytes = 46,080 bytes a token.
    per_token = kv_bytes_per_token(30, 3, 64, 4)
    assert per_token == 46_080
    # 0.2 of 10 GiB = 2,147,483,648 bytes, minus 540,000,000 of weights, over 46,080 → 34,884 tokens.
    assert (
        pool_tokens(10 * 2**30, 0.2, 540_000_000, per_token)
        == (2_147_483_648 - 540_000_000) // 46_080
        == 34_884
    )
    with pytest.raises(ValueError, match="leaves no room for the KV pool"):
        pool_tokens(2**30, 0.1, 540_000_000, per_token)


def test_the_engine_logs_sglangs_startup_line(tiny_folder: Path) -> None:
    import kvadmit
    from kvadmit.observe import loglines

    engine = kvadmit.Engine(str(tiny_folder), dtype="float32", mem_fraction_static=0.01)
    fields = loglines.STARTUP.parse(engine.startup_line)
    assert fields is not None and fields["max_total_num_tokens"] == engine.scheduler.max_total_num_tokens > 0
    assert fields["mem_label"] == "available_cpu_mem"
