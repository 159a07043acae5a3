"""What loading the default model imports: neither transformers (the tokenizer is read with `tokenizers`:
model/tokenizer.py) nor torch._dynamo unless --enable-torch-compile (building the model on the meta device
imported it). Each is tens of MB of a small model's server. Run in a fresh interpreter."""

from __future__ import annotations

import subprocess
import sys

import pytest

SCRIPT = """
import sys
from kvadmit.model.runtime import load_model
from kvadmit.executor.torch_runner import TorchExecutor
m = load_model(None, quantization="int4", max_total_tokens=256)
executor = TorchExecutor(m.model, m.pool_size)
print(type(m.tokenizer).__name__, "transformers" in sys.modules, "torch._dynamo" in sys.modules)
"""


def test_loading_the_default_model_imports_neither_transformers_nor_dynamo() -> None:
    from kvadmit.model.default import DefaultModelError, ensure_default_model

    try:
        ensure_default_model(log=lambda _: None)
    except DefaultModelError as e:
        pytest.skip(f"the default model cannot be obtained here: {e}")
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, check=True, timeout=600
    )
    assert out.stdout.split() == ["PlainTokenizer", "False", "False"]
