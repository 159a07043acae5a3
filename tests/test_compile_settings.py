"""--enable-torch-compile's inductor settings (model/compiled.py): its cache beside the default model and
one compile thread, unless the environment sets them. Run in a fresh interpreter: inductor reads them once."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = """
from kvadmit.model.compiled import inductor_settings
print(inductor_settings())
import torch._inductor.config as config
from torch._inductor.runtime.cache_dir_utils import cache_dir
print(config.compile_threads)
print(cache_dir())
"""


def settings(env: dict[str, str]) -> list[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCHINDUCTOR_")}
    out = subprocess.run([sys.executable, "-c", SCRIPT], env={**clean, **env}, capture_output=True, text=True,
                         check=True, timeout=300)  # fmt: skip
    return out.stdout.split()


def test_the_cache_lives_beside_the_default_model_and_compiles_in_one_thread(tmp_path: Path) -> None:
    folder = str(tmp_path / "torchinductor")
    assert settings({"KVADMIT_CACHE": str(tmp_path)}) == [folder, "1", folder]


def test_the_environment_wins(tmp_path: Path) -> None:
    env = {"KVADMIT_CACHE": str(tmp_path), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "mine"),
           "TORCHINDUCTOR_COMPILE_THREADS": "2"}  # fmt: skip
    assert settings(env) == [str(tmp_path / "mine"), "2", str(tmp_path / "mine")]
