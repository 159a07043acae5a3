"""Extract SGLang's launch flags into kvadmit's data file (src/kvadmit/cli/sglang_flags_0_5_22.json).

SGLang builds its parser from dataclass fields spread over many modules (srt/arg_groups/fields/*.py) plus a
few hand-written ones in srt/server_args.py, so the list is read from the parser SGLang itself builds, not
from its source text. Its heavy imports (torch kernels, triton, ...) are replaced by empty stand-ins: its
modules are imported, no server starts, and only the argparse definitions are read. Run it with the wheel
unpacked and its few light dependencies on the path:

    pip download --no-deps sglang==0.5.22 -d build/sg && (cd build/sg && unzip -q -o sglang-*.whl -d src)
    pip install --target build/sgdeps orjson msgspec pybase64 psutil
    PYTHONPATH=build/sgdeps:build/sg/src python crosscheck/sglang_flags/extract.py 0.5.22 > \
        src/kvadmit/cli/sglang_flags_0_5_22.json

(run from a Python with numpy, torch, transformers and pyyaml installed, e.g. kvadmit's .venv, with no
SGLANG_* variables set: one of them adds a --sampling-backend choice)
"""

from __future__ import annotations

import argparse
import importlib.abc
import importlib.machinery
import json
import sys
import types
from typing import Any, ClassVar


class _StandIn:
    """Whatever a missing module's attribute is asked to be: callable, subclassable, iterable, falsy."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if len(args) == 1 and callable(args[0]) and not kwargs:
            return args[0]  # used as a decorator
        return _StandIn(self._name + "()")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self._name}.{name}")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)

    def __iter__(self) -> Any:
        return iter(())

    def __bool__(self) -> bool:
        return False

    def __or__(self, other: Any) -> Any:
        return self

    __ror__ = __or__

    def __getitem__(self, key: Any) -> Any:
        return self


class _EmptyModule(types.ModuleType):
    __path__: ClassVar[list[str]] = []  # a package, so its submodules resolve too

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") and name.endswith("__"):
            raise AttributeError(name)
        return _StandIn(f"{self.__name__}.{name}")


def _importer_name() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not name.startswith("importlib") and name != __name__:
            return name
        frame = frame.f_back
    return ""


class _StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Supplies an empty module for a third-party package that sglang imports and that is not installed."""

    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        top = name.split(".")[0]
        if top == "sglang" or top in sys.stdlib_module_names or top.startswith("_"):
            return None
        if not _importer_name().startswith("sglang"):
            return None  # a real library probing for an optional one: let it fail as it expects
        if top != name and top in sys.modules and not isinstance(sys.modules[top], _EmptyModule):
            return None
        for finder in sys.meta_path:
            if finder is self:
                continue
            try:
                if finder.find_spec(name, path, target) is not None:
                    return None
            except Exception:
                continue
        return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec: Any) -> types.ModuleType:
        return _EmptyModule(spec.name)

    def exec_module(self, module: types.ModuleType) -> None:
        pass


# argparse action class → the kind kvadmit's table records
_ACTIONS = {
    "_StoreAction": "store",
    "_StoreTrueAction": "store_true",
    "BooleanOptionalAction": "boolean_optional",
    "DeprecatedStoreTrueAction": "store_true",
    "LoRAPathAction": "store",
}
# SGLang's value parsers → kvadmit's value kinds (what the value must look like)
_VALUES = {
    "str": "str",
    "int": "int",
    "float": "float",
    "loads": "json",
    "json_list_type": "json",
    "human_readable_int": "human_int",
    "nullable_str": "str",
    "parse_cuda_graph_backend_arg": "str",
    "parse_cuda_graph_config_arg": "str",
}


def _plain(value: Any) -> Any:
    try:
        json.dumps(value)
    except TypeError:
        return repr(value)
    return value


def extract() -> list[dict[str, Any]]:
    sys.meta_path.append(_StandInFinder())
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    rows = []
    for action in parser._actions:
        if not action.option_strings or "--help" in action.option_strings:
            continue
        kind = _ACTIONS[type(action).__name__]
        value = None if kind != "store" else _VALUES[getattr(action.type, "__name__", "str")]
        choices = action.choices
        if choices is not None:
            choices = sorted(choices) if isinstance(choices, set) else list(choices)
        rows.append(
            {
                "names": list(action.option_strings),
                "dest": action.dest,
                "action": kind,
                "value": value,
                "nargs": action.nargs if kind == "store" else None,
                "choices": choices,
                "default": _plain(action.default),
            }
        )
    return rows


def main() -> None:
    version = sys.argv[1] if len(sys.argv) > 1 else "0.5.22"
    rows = extract()
    print("{")
    print(f'  "sglang_version": {json.dumps(version)},')
    print('  "flags": [')
    print(",\n".join("    " + json.dumps(row) for row in rows))
    print("  ]")
    print("}")


if __name__ == "__main__":
    main()
