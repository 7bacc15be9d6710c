"""DeepSpeed's C++ ops, built once per host: never by every rank at once, never silently; and
the shared memory its ranks leave on a host, removed once they are gone.

DeepSpeed compiles an op it was not installed with (its Adam on CPU: `fused_adam`, or `cpu_adam`
under ZeRO-Offload) the first time a process needs it, into torch's extension cache. Under a
launcher every rank asks at once: torch's lock file lets one compile while the others spin for
minutes without a word, and a build killed half way (a Ctrl-C, a failed rank) leaves that file
behind, so every later run waits on it forever.

In a hora rank, DeepSpeed's `jit_load` runs under a host lock (flock on a file in the op's cache
folder; the kernel drops it when its process dies): the first process builds, saying so on the
driver, the others of the host wait and load what it built, and later runs only load it. A lock
file of torch's that no process holds is removed. Where nothing can be built (no C++ compiler, no
Python headers, no ninja) the rank stops with the way out; `DeepspeedTorchDistributor` asks the
same on the driver before a local run starts. `HORA_DEEPSPEED_JIT=1` leaves DeepSpeed's loader
as it is. The hook costs nothing until DeepSpeed's op builder module is imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import importlib.abc
import importlib.machinery
import os
import shutil
import socket
import sys
import sysconfig
import time
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from hora.wire.link import log_to_driver

BUILDER_MODULE = "deepspeed.ops.op_builder.builder"
ALLOW_VAR = "HORA_DEEPSPEED_JIT"
#: What `make deepspeed-ops` builds (`make test` and `make bench` run it; `make demo`, the first):
#: the shared-memory collectives DeepSpeed's CPU accelerator loads in every
#: `deepspeed.init_distributed()`, and the CPU ops of its default optimizers (Adam/AdamW:
#: `fused_adam`; with ZeRO-Offload: `cpu_adam`).
DEFAULT_BUILDS = ("ShareMemCommBuilder", "FusedAdamBuilder", "CPUAdamBuilder")
LOCK_FILE = "hora-build.lock"
TORCH_LOCK_FILE = "lock"  # torch.utils.cpp_extension's FileBaton in the op's folder
TORCH_ADAM_WAY_OUT = (
    'use torch\'s optimizer instead of DeepSpeed\'s op ("optimizer": {"type": "AdamW", '
    '"params": {"torch_adam": true, ...}} in the DeepSpeed config, or a torch.optim optimizer '
    "passed to deepspeed.initialize)"
)


class DeepspeedBuildImpossible(RuntimeError):
    """DeepSpeed needs an op that is not built, and this host cannot build it."""


def build_once_per_host() -> None:
    """Make DeepSpeed's op JIT builds in this process go through the host lock, once DeepSpeed's
    op builder is imported (now, if it already is)."""
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
    if getattr(op_builder.jit_load, "_hora", False):
        return
    build = op_builder.jit_load

    def jit_load(self: Any, verbose: bool = True) -> Any:
        return _load_once(self, lambda: build(self, verbose))

    jit_load._hora = True  # type: ignore[attr-defined]
    op_builder.jit_load = jit_load


def _load_once(builder: Any, build: Callable[[], Any]) -> Any:
    """DeepSpeed's `jit_load` under this host's lock for the op: it builds only if no process
    has, and the host's other processes wait for that build, then load it."""
    name = builder.name
    folder = cache_folder(name)
    with _host_lock(folder, name):
        _remove_abandoned_torch_lock(folder)
        if _so_exists(folder, name):  # torch's loader still rebuilds it if its sources changed
            return build()
        problem = why_unbuildable(builder)
        if problem:
            raise DeepspeedBuildImpossible(_way_out(builder, problem))
        host = socket.gethostname()
        log_to_driver(
            f"hora: building DeepSpeed's {name!r} op on {host}, once for this host (its other "
            f"processes wait for it; minutes of C++), into {folder}"
        )
        start = time.monotonic()
        module = build()
        log_to_driver(
            f"hora: built DeepSpeed's {name!r} op on {host} in {time.monotonic() - start:.0f} s; "
            "later runs load it"
        )
        return module


@contextlib.contextmanager
def _host_lock(folder: str, name: str) -> Iterator[None]:
    """An exclusive flock on the op's lock file; a process that waits for a build says so."""
    with open(os.path.join(folder, LOCK_FILE), "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not _so_exists(folder, name):
                log_to_driver(
                    f"hora: waiting for DeepSpeed's {name!r} op, which another process on "
                    f"{socket.gethostname()} is building"
                )
            fcntl.flock(f, fcntl.LOCK_EX)
        yield  # closing the file drops the lock


def cache_folder(name: str) -> str:
    """The op's folder in torch's extension cache, where DeepSpeed's `jit_load` builds it
    (TORCH_EXTENSIONS_DIR, else the user's cache); made if missing."""
    from torch.utils.cpp_extension import _get_build_directory

    return _get_build_directory(name, verbose=False)


def is_built(builder: Any) -> bool:
    """True if DeepSpeed will load `builder`'s op without compiling it: installed with DeepSpeed
    for this accelerator, or built in torch's extension cache."""
    from deepspeed.accelerator import get_accelerator
    from deepspeed.git_version_info import accelerator_name, installed_ops

    if installed_ops.get(builder.name) and accelerator_name == get_accelerator()._name:
        return True
    return _so_exists(cache_folder(builder.name), builder.name)


def _so_exists(folder: str, name: str) -> bool:
    return os.path.isfile(os.path.join(folder, f"{name}.so"))


def why_unbuildable(builder: Any = None) -> str | None:
    """What this host lacks to compile a DeepSpeed op (`builder`'s, else any), or None."""
    from torch.utils.cpp_extension import CUDA_HOME, get_cxx_compiler, is_ninja_available

    missing = []
    compiler = get_cxx_compiler()
    if shutil.which(compiler) is None:
        missing.append(f"a C++ compiler ({compiler!r} is not on PATH: install g++, or set CXX)")
    headers = sysconfig.get_paths()["include"]
    if not os.path.isfile(os.path.join(headers, "Python.h")):
        missing.append(f"Python's headers (no Python.h in {headers}: install python3-dev)")
    if not is_ninja_available():
        missing.append("ninja (not on PATH: pip install ninja)")
    if builder is not None and _needs_nvcc(builder) and CUDA_HOME is None:
        missing.append("the CUDA toolkit's nvcc (install it, or set CUDA_HOME)")
    return "; ".join(missing) or None


def _needs_nvcc(builder: Any) -> bool:
    import torch
    from deepspeed.ops.op_builder.builder import CUDAOpBuilder

    return isinstance(builder, CUDAOpBuilder) and torch.cuda.is_available()


def _way_out(builder: Any, problem: str) -> str:
    return (
        f"DeepSpeed needs its {builder.name!r} op, which is not built on {socket.gethostname()}, "
        f"and it cannot be built there: missing {problem}. Install what is missing (hora then "
        f"builds the op once per host, and later runs load it); or, for its Adam ops, "
        f"{TORCH_ADAM_WAY_OUT}; or build the op where it can be (python -m hora._deepspeed_ops "
        f"{type(builder).__name__}) into a cache the job sees (TORCH_EXTENSIONS_DIR). "
        f"{ALLOW_VAR}=1 leaves the build to DeepSpeed if this check is wrong."
    )


def _remove_abandoned_torch_lock(folder: str) -> None:
    """Remove torch's lock file if no process holds it open: a build killed half way left it,
    and torch would wait for it forever. Called under the host lock, so no hora process is in
    torch's build; a live holder (plain DeepSpeed, elsewhere) keeps it open while it builds."""
    path = os.path.join(folder, TORCH_LOCK_FILE)
    if os.path.exists(path) and not _held_open(path):
        with contextlib.suppress(FileNotFoundError):
            os.remove(path)
        log_to_driver(f"hora: removed {path}, left by an interrupted build of DeepSpeed's op")


def _held_open(path: str) -> bool:
    """True if a process of this host has `path` open (or if that cannot be known: no /proc)."""
    if not os.path.isdir("/proc/self/fd"):
        return True
    target = os.path.realpath(path)
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            fds = os.path.join("/proc", pid, "fd")
            if any(os.readlink(os.path.join(fds, fd)) == target for fd in os.listdir(fds)):
                return True
    return False


def needed_builders(config: Mapping[str, Any]) -> tuple[str, ...]:
    """The op builders DeepSpeed's engine will load for `config`'s optimizer (as its
    `_configure_basic_optimizer` picks them): Adam/AdamW without `torch_adam` take FusedAdam, or
    CPUAdam when ZeRO offloads the optimizer; other optimizers are left to the ranks."""
    optimizer = config.get("optimizer") or {}
    if str(optimizer.get("type", "")).lower() not in ("adam", "adamw"):
        return ()
    if (optimizer.get("params") or {}).get("torch_adam"):
        return ()
    offload = ((config.get("zero_optimization") or {}).get("offload_optimizer") or {}).get("device")
    return ("CPUAdamBuilder",) if offload in ("cpu", "nvme") else ("FusedAdamBuilder",)


def refuse_unbuildable(config: Mapping[str, Any]) -> None:
    """On the driver of a local run, before any rank starts: raise DeepspeedBuildImpossible if
    `config` needs an op that is not built here and cannot be."""
    from deepspeed.accelerator import get_accelerator

    for name in needed_builders(config):
        builder = get_accelerator().create_op_builder(name)
        if builder is None or is_built(builder):
            continue
        problem = why_unbuildable()
        if problem:
            raise DeepspeedBuildImpossible(_way_out(builder, problem))


def build(names: tuple[str, ...] = DEFAULT_BUILDS) -> None:
    """Build DeepSpeed ops for this machine's accelerator into torch's extension cache, now,
    under the same host lock as the ranks' builds."""
    from deepspeed.accelerator import get_accelerator

    build_once_per_host()
    for name in names:
        builder = get_accelerator().create_op_builder(name)
        if builder is None:
            raise SystemExit(f"DeepSpeed has no op builder {name!r} for this accelerator")
        builder.load()
        print(f"DeepSpeed's {builder.NAME} op is built in {cache_folder(builder.name)}", flush=True)


if __name__ == "__main__":
    build(tuple(sys.argv[1:]) or DEFAULT_BUILDS)


def remove_segments_left(master: tuple[str, int | str], folder: str = "/dev/shm") -> None:
    """Unlink the shared memory DeepSpeed's CPU collectives leave behind (69 MB per rank, named
    after the run's MASTER_ADDR and MASTER_PORT): its ranks end without running C++ destructors
    (hora's workers skip the interpreter's teardown), and a notebook's hundredth job must not
    find /dev/shm full. Called by `hora.engines.stop_all` once a host's workers are gone."""
    addr, port = master
    pattern = os.path.join(folder, f"deepspeed_allreduce_buffer_{os.getuid()}_{addr}_{port}_*")
    for path in glob.glob(pattern):
        with contextlib.suppress(OSError):
            os.unlink(path)
