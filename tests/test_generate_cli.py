"""`kvadmit generate`: the chat template by default, --raw without it, and a generation that ends at once
says so (exit status 1). Tiny random models with a real tokenizer and a hand-written chat template."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from kvadmit.cli import main
from server_helpers import write_tiny_tokenizer

transformers = pytest.importorskip("transformers")
pytest.importorskip("tokenizers")

# The template the tests give the tokenizer; the prompts they expect are written out by hand from it.
TEMPLATE = (
    "{% for m in messages %}<|user|>{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}<|bot|>{% endif %}"
)
SETTINGS = ["--dtype", "float32", "--device", "cpu", "--temperature", "0", "--max-total-tokens", "1024"]


def _tokenizer(folder: Path, chat_template: str | None) -> None:
    write_tiny_tokenizer(
        folder, "<|user|> the quick brown fox jumps over the lazy dog.\n<|bot|> ", chat_template
    )


def _model(folder: Path, *, eos_at_once: bool) -> None:
    """A tiny Llama; with eos_at_once every logit is 0, so greedy decoding picks token 0, <eos>."""
    from transformers import AutoTokenizer

    eos = AutoTokenizer.from_pretrained(folder).eos_token_id
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=300, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, eos_token_id=eos,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(cfg).float().eval()
    if eos_at_once:
        assert eos == 0  # the first special token; argmax of equal logits is the first index
        with torch.no_grad():
            model.lm_head.weight.zero_()
    model.save_pretrained(folder, safe_serialization=True)


@pytest.fixture(scope="module")
def chat_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-chat")
    _tokenizer(folder, TEMPLATE)
    _model(folder, eos_at_once=False)
    return folder


@pytest.fixture(scope="module")
def eos_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("tiny-eos")
    _tokenizer(folder, TEMPLATE)
    _model(folder, eos_at_once=True)
    return folder


def _generate(capsys: pytest.CaptureFixture[str], folder: Path, *args: str) -> tuple[int, dict, str]:  # type: ignore[type-arg]
    code = main(["generate", *args, "--model-path", str(folder), *SETTINGS, "--json"])
    captured = capsys.readouterr()
    return code, json.loads(captured.out), captured.err


def _token_count(folder: Path, text: str) -> int:
    from transformers import AutoTokenizer

    return len(AutoTokenizer.from_pretrained(folder).encode(text, add_special_tokens=False))


def test_the_chat_template_is_applied_by_default(
    chat_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, templated, _ = _generate(capsys, chat_folder, "the quick fox", "--max-new-tokens", "4")
    assert code == 0
    by_hand = "<|user|>the quick fox\n<|bot|>"
    assert templated["meta_info"]["prompt_tokens"] == _token_count(chat_folder, by_hand)
    # The hand-built prompt sent as it is gives the very same tokens back (greedy): the same prompt ids.
    code, raw_by_hand, _ = _generate(capsys, chat_folder, by_hand, "--raw", "--max-new-tokens", "4")
    assert code == 0
    assert raw_by_hand["output_ids"] == templated["output_ids"]
    assert raw_by_hand["meta_info"]["prompt_tokens"] == templated["meta_info"]["prompt_tokens"]
    # --chat (the default) says the same thing
    code, chat, _ = _generate(capsys, chat_folder, "the quick fox", "--chat", "--max-new-tokens", "4")
    assert code == 0 and chat["output_ids"] == templated["output_ids"]


def test_raw_sends_the_prompt_as_it_is(chat_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, raw, _ = _generate(capsys, chat_folder, "the quick fox", "--raw", "--max-new-tokens", "4")
    assert code == 0
    assert raw["meta_info"]["prompt_tokens"] == _token_count(chat_folder, "the quick fox")
    assert raw["meta_info"]["prompt_tokens"] < _token_count(chat_folder, "<|user|>the quick fox\n<|bot|>")


def test_chat_and_raw_do_not_go_together(chat_folder: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["generate", "x", "--chat", "--raw", "--model-path", str(chat_folder)])
    assert e.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_generation_that_ends_at_once_says_why(
    eos_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = _generate(capsys, eos_folder, "the quick fox")
    assert code == 1
    assert out["text"] == "" and out["output_ids"] == [0]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": 0}
    assert err.startswith(
        "kvadmit generate: the generation ended at once: the model's first token was 0 '<eos>'"
    )
    assert "(its end-of-sequence token)" in err and "--raw sends it as it is" in err
    # sent as it is, the hint points back at the template
    code, out, err = _generate(capsys, eos_folder, "the quick fox", "--raw")
    assert code == 1 and out["text"] == ""
    assert "sent as it is (--raw)" in err and "chat template, which generate applies without --raw" in err
    # asked for no new tokens: nothing to explain
    code, out, err = _generate(capsys, eos_folder, "the quick fox", "--max-new-tokens", "0")
    assert code == 0 and err == ""


def test_chat_needs_a_template(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _tokenizer(tmp_path, None)
    _model(tmp_path, eos_at_once=True)
    assert main(["generate", "x", "--chat", "--model-path", str(tmp_path), *SETTINGS]) == 2
    assert "--chat: the model's tokenizer has no chat template" in capsys.readouterr().err
    # without --chat the prompt goes as it is, and the hint says why no template helps
    assert main(["generate", "x", "--model-path", str(tmp_path), *SETTINGS]) == 1
    assert "the tokenizer has no chat template, so the prompt was sent as it is" in capsys.readouterr().err
