"""No C++ build in the middle of a job: DeepSpeed's op JIT builds are refused in hora's ranks.

DeepSpeed compiles an op it was not installed with (its Adam, on CPU: `fused_adam`) the first
time a rank needs it: minutes of gcc on every rank, after the job has started, and a job that
hangs or dies if the compiler is missing. In a hora rank that build is refused with a message
that says what to do instead; an op already built (installed with DeepSpeed, or in torch's
extension cache) still loads. `HORA_DEEPSPEED_JIT=1` lets DeepSpeed build it after all.

The hook costs nothing until DeepSpeed's op builder module is imported.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import os
import sys
from types import ModuleType
from typing import Any

BUILDER_MODULE = "deepspeed.ops.op_builder.builder"
ALLOW_VAR = "HORA_DEEPSPEED_JIT"
#: What `make setup` builds: DeepSpeed's shared-memory collectives, which its CPU accelerator
#: loads in every `deepspeed.init_distributed()`.
DEFAULT_BUILDS = ("ShareMemCommBuilder",)


class DeepspeedBuildRefused(RuntimeError):
    """DeepSpeed wanted to compile an op inside a running rank."""


def refuse_jit_builds() -> None:
    """Patch DeepSpeed's op builder when (if ever) it is imported in this process."""
    if os.environ.get(ALLOW_VAR) == "1" or any(isinstance(f, _Hook) for f in sys.meta_path):
        return
    if BUILDER_MODULE in sys.modules:
        _patch(sys.modules[BUILDER_MODULE])
    else:
        sys.meta_path.insert(0, _Hook())


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> Any:
        if name != BUILDER_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return spec
        loader = spec.loader
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            run(module)
            _patch(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _patch(builder: ModuleType) -> None:
    op_builder = builder.OpBuilder
    build = op_builder.jit_load

    def jit_load(self: Any, verbose: bool = True) -> Any:
        if _already_built(self.name):
            return build(self, verbose)
        raise DeepspeedBuildRefused(
            f"DeepSpeed wants to compile its {self.name!r} op with a C++ compiler now, inside "
            "the running job (minutes on every rank); hora refuses that. Instead: use torch's "
            'optimizer (in the DeepSpeed config, "optimizer": {"type": "Adam", "params": '
            '{"torch_adam": true, ...}}, or pass your own torch.optim optimizer to '
            "deepspeed.initialize), or build the op once before the job "
            f"(python -m hora._deepspeed_ops {type(self).__name__}; `make setup` builds "
            f"{DEFAULT_BUILDS[0]}, which deepspeed.init_distributed needs on CPU), or set "
            f"{ALLOW_VAR}=1 to let DeepSpeed build it in the job"
        )

    op_builder.jit_load = jit_load


def _already_built(name: str) -> bool:
    """True if torch's extension cache holds a finished build of `name` (loading is no build)."""
    try:
        from torch.utils.cpp_extension import _get_build_directory

        folder = _get_build_directory(name, verbose=False)
    except Exception:  # a private torch helper: if it moved, say so rather than build
        return False
    return os.path.isfile(os.path.join(folder, f"{name}.so"))


def build(names: tuple[str, ...] = DEFAULT_BUILDS) -> None:
    """Build DeepSpeed ops for this machine's accelerator into torch's extension cache, now."""
    from deepspeed.accelerator import get_accelerator

    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            raise SystemExit(f"DeepSpeed has no op builder {name!r} for this accelerator")
        builder.load()
        print(f"built DeepSpeed's {builder.NAME} op", flush=True)


if __name__ == "__main__":
    build(tuple(sys.argv[1:]) or DEFAULT_BUILDS)
