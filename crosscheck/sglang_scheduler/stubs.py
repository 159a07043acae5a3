"""sys.modules stand-ins for packages that SGLang imports at module level but that play no part in the
scheduler's admission / retraction arithmetic (notebook helpers, vision, tokenizer and quantisation-config
packages). They are not installed in the SGLang venv; every attribute of a stubbed module is a permissive
dummy class, so `from X import Y` and class definitions that subclass Y succeed.

harness.py calls install() before importing SGLang.
"""

import importlib.abc
import importlib.machinery
import sys
import types

STUBBED = ["IPython", "torchvision", "sentencepiece", "compressed_tensors", "gguf"]
USED: set[str] = set()

_DUNDER_OK = {"__class_validators__": []}


class _Meta(type):
    def __getattr__(cls, name):
        if name in _DUNDER_OK:
            return _DUNDER_OK[name]
        if name.startswith("__"):
            raise AttributeError(name)
        return _make(name)

    def __getitem__(cls, item):
        return cls


def _make(name):
    def _init(self, *a, **k):
        pass

    def _call(self, *a, **k):
        if len(a) == 1 and callable(a[0]) and not k:
            return a[0]  # used as a decorator
        return _make("ret")()

    def _getattr(self, n):
        if n.startswith("__"):
            raise AttributeError(n)
        return _make(n)()

    def _init_subclass(cls, **kw):
        pass

    return _Meta(
        name,
        (),
        {
            "__init__": _init,
            "__call__": _call,
            "__getattr__": _getattr,
            "__init_subclass__": classmethod(_init_subclass),
        },
    )


class _StubModule(types.ModuleType):
    def __getattr__(self, name):
        if name == "__version__":
            return "0.0.0"
        if name.startswith("__"):
            raise AttributeError(name)
        val = _make(name)
        setattr(self, name, val)
        return val


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path, target=None):
        if fullname.split(".")[0] in STUBBED:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        USED.add(spec.name.split(".")[0])
        m = _StubModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


def install():
    sys.meta_path.insert(0, _Finder())
