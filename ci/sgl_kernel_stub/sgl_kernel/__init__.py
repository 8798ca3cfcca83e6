"""CPU stand-in for SGLang's ``sgl_kernel`` (CI and tests only).

PyPI has no CPU build of sgl_kernel, yet SGLang imports it at module import
time. This stand-in satisfies those imports: any attribute, and any submodule
(``sgl_kernel.flash_attn`` ...), is a callable that raises NotImplementedError
when actually called, so a CPU code path that really needed a GPU kernel fails
loudly instead of silently. The one kernel SGLang's CPU serving path calls,
``copy_all_layer_kv_cache_cpu``, is implemented for real with ctypes.
"""

from __future__ import annotations

import ctypes
import importlib.abc
import importlib.machinery
import sys
import types

__version__ = "0.0.0+eagle-gate-cpu-stub"


class _Missing:
    """Any sgl_kernel name: calling it raises; its attributes are the same."""

    def __init__(self, qualname: str):
        self.__qualname__ = qualname
        self.__name__ = qualname.rsplit(".", 1)[-1]

    def __call__(self, *args, **kwargs):
        raise NotImplementedError(
            f"sgl_kernel.{self.__qualname__} is a GPU kernel; this is the CPU stand-in"
        )

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _Missing(f"{self.__qualname__}.{name}")

    def __repr__(self) -> str:
        return f"<sgl_kernel stand-in {self.__qualname__}>"


def _missing(qualname: str) -> _Missing:
    return _Missing(qualname)


def copy_all_layer_kv_cache_cpu(data_ptrs, strides, tgt_loc, src_loc) -> None:
    """Copy slot ``src_loc[j]`` to ``tgt_loc[j]`` in every layer buffer.

    ``data_ptrs[i]`` is the address of layer buffer i and ``strides[i]`` its
    bytes per slot, as SGLang's Triton kernel receives them.
    """
    ptrs = [int(p) for p in data_ptrs.tolist()]
    widths = [int(s) for s in strides.tolist()]
    pairs = list(zip(tgt_loc.tolist(), src_loc.tolist()))
    for base, width in zip(ptrs, widths):
        for tgt, src in pairs:
            ctypes.memmove(base + int(tgt) * width, base + int(src) * width, width)


def __getattr__(name: str):
    if name.startswith("__"):
        raise AttributeError(name)
    return _missing(name)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        return _missing(f"{self.__name__.partition('.')[2]}.{name}")


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname, path=None, target=None):
        if fullname.startswith("sgl_kernel."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StubModule(spec.name)
        module.__path__ = []
        return module

    def exec_module(self, module):
        return None


sys.meta_path.append(_StubFinder())
