"""The serving tokenizer (model/tokenizer.py) answers as transformers' tokenizer of the same folder:
encoding, decoding, token pieces and chat templates, over the default model's tokenizer and a text set;
folders it does not reproduce get transformers' own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvadmit.model.tokenizer import PlainTokenizer, load_tokenizer

transformers = pytest.importorskip("transformers")
TEXT = Path(__file__).parent / "data" / "agreement_text.txt"
EXTRA = ["<|im_start|>user\nhi<|im_end|>\n", "héllo wörld 世界 🙂", "  two  spaces  ", "", "a\n\nb\t c",
         "<|endoftext|>x", "don't  stop", "1234567890 3.14159", "\u00a0nbsp", "emoji 👩‍👩‍👧 ok"]  # fmt: skip
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "b"},
        {"role": "user", "content": "ç"},
    ],
    [{"role": "user", "content": ""}],
]


@pytest.fixture(scope="module")
def folder() -> Path:
    from kvadmit.model.default import DefaultModelError, ensure_default_model

    try:
        return ensure_default_model(log=lambda _: None)
    except DefaultModelError as e:
        pytest.skip(f"the default model cannot be obtained here: {e}")


def copy_tokenizer(folder: Path, target: Path, **config: object) -> Path:
    """The folder's tokenizer files in `target`, tokenizer_config.json's fields updated with `config`."""
    target.mkdir(exist_ok=True)
    for name in ("tokenizer.json", "chat_template.jinja"):
        shutil.copy(folder / name, target / name)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    (target / "tokenizer_config.json").write_text(json.dumps({**cfg, **config}))
    return target


def test_the_default_model_gets_the_plain_tokenizer_with_transformers_encoding(folder: Path) -> None:
    ours, theirs = load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    assert isinstance(ours, PlainTokenizer)
    assert (ours.eos_token_id, ours.bos_token_id) == (theirs.eos_token_id, theirs.bos_token_id) == (2, 1)
    texts = [*TEXT.read_text().splitlines(), TEXT.read_text(), *EXTRA]
    for text in texts:
        for special in (True, False):
            assert ours.encode(text, add_special_tokens=special) == theirs.encode(
                text, add_special_tokens=special
            )
        assert ours(text)["input_ids"] == theirs(text)["input_ids"]
        ids = theirs.encode(text)
        for skip in (True, False):
            assert ours.decode(ids, skip_special_tokens=skip) == theirs.decode(ids, skip_special_tokens=skip)


def test_every_token_decodes_and_is_spelled_as_transformers_does(folder: Path) -> None:
    ours, theirs = load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    ids = list(range(len(theirs)))
    assert len(ids) == 49152
    assert ours.convert_ids_to_tokens(ids) == theirs.convert_ids_to_tokens(ids)
    assert [ours.decode([i]) for i in ids] == [theirs.decode([i]) for i in ids]
    assert ours.convert_ids_to_tokens(2) == theirs.convert_ids_to_tokens(2) == "<|im_end|>"


def test_the_chat_template_renders_as_transformers_does(folder: Path) -> None:
    ours, theirs = load_tokenizer(str(folder)), transformers.AutoTokenizer.from_pretrained(str(folder))
    assert ours.chat_template == theirs.chat_template
    for messages in CONVERSATIONS:
        for gen in (True, False):
            want = theirs.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False)
            assert ours.apply_chat_template(messages, add_generation_prompt=gen, tokenize=False) == want
    first = ours.apply_chat_template(CONVERSATIONS[0], add_generation_prompt=True, tokenize=False)
    assert first.endswith(
        "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    )


TEMPLATE = """{{ bos_token }}{% for m in messages %}{% if m['role'] == 'tool' %}
{{ raise_exception('no tools') }}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}
  [{{ m['role'] | upper }}] {{ m | tojson }}{{ eos_token if not loop.last }}
{% endfor %}{% if add_generation_prompt %}<{{ unk_token }}|{{ pad_token }}|{{ tools is none }}>{% endif %}"""


def test_a_template_with_special_tokens_loop_controls_tojson_and_exceptions(
    folder: Path, tmp_path: Path
) -> None:
    copied = copy_tokenizer(folder, tmp_path / "t")
    (copied / "chat_template.jinja").write_text(TEMPLATE)
    ours, theirs = load_tokenizer(str(copied)), transformers.AutoTokenizer.from_pretrained(str(copied))
    assert isinstance(ours, PlainTokenizer)
    long = [{"role": "user", "content": f"<b>{i}</b> é"} for i in range(5)]
    for messages in [*CONVERSATIONS, long]:
        want = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        assert ours.apply_chat_template(messages, add_generation_prompt=True, tokenize=False) == want
        assert ours.apply_chat_template(messages, add_generation_prompt=True) == theirs.encode(
            want, add_special_tokens=False
        )
    rendered = ours.apply_chat_template(long, add_generation_prompt=True, tokenize=False)
    assert (
        rendered.count("[USER]") == 3
        and '"<b>0</b> é"' in rendered
        and rendered.endswith("<<|endoftext|>|<|im_end|>|True>")
    )
    for tok in (ours, theirs):
        with pytest.raises(Exception, match="no tools"):
            tok.apply_chat_template([{"role": "tool", "content": "x"}], tokenize=False)


@pytest.mark.parametrize(
    "config", [{"tokenizer_class": "LlamaTokenizerFast"}, {"clean_up_tokenization_spaces": True}]
)
def test_folders_it_does_not_reproduce_get_transformers_tokenizer(
    folder: Path, tmp_path: Path, config: dict
) -> None:
    copied = copy_tokenizer(folder, tmp_path / "t", **config)
    assert PlainTokenizer.from_folder(copied) is None
    assert not isinstance(load_tokenizer(str(copied)), PlainTokenizer)
    assert PlainTokenizer.from_folder(tmp_path) is None  # no tokenizer files at all
