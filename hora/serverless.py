"""Databricks' serverless GPU API as a door: `@distributed(gpus=8, gpu_type='H100', remote=True)`.

Code written for `serverless_gpu.distributed` (or `databricks.air.distributed`, whose
`num_accelerators`/`accelerator_type` name the same things) runs with only the import swapped,
`from hora import distributed`: `fn.distributed(*args, **kwargs)` runs `fn` on every rank in a
torchrun-style environment (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR...), returns every rank's
value in rank order, and raises the rank's own exception (its traceback printed first).

`remote=False` runs one process per GPU of this machine (or `gpus` CPU ranks on a machine without
one); `remote=True` runs `gpus` ranks on the cluster the program has started: the active Spark
session (classic or Connect), else Ray after `ray.init()`. A GPU type this machine cannot
honour, or one no one knows, is refused before anything starts.
"""

from __future__ import annotations

import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable, Mapping
from typing import Any, Generic, ParamSpec, TypeVar, overload

from hora import engines
from hora.config import RunConfig
from hora.errors import RankTraceback, WorkerFailedError
from hora.job.launch import launch

P = ParamSpec("P")
R = TypeVar("R")

#: the GPU types Databricks' serverless API and its accelerators name, and their kin
GPU_TYPES = ("A10", "A10G", "A100", "B200", "H100", "H200", "L4", "L40S", "T4", "V100")
_ACCELERATOR = re.compile(r"^GPU_(?P<count>\d+)x(?P<type>[A-Za-z0-9]+)$")


class DistributedFunction(Generic[P, R]):
    """`fn` as `@distributed` leaves it: still callable as itself (on this process), and
    `fn.distributed(...)` on every rank."""

    def __init__(
        self,
        fn: Callable[P, R],
        gpus: int | None,
        gpu_type: str | None,
        remote: bool,
        options: Mapping[str, Any],
    ):
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.gpus = gpus
        self.gpu_type = gpu_type
        self.remote = remote
        self.options = dict(options)

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)

    def distributed(self, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Run `fn(*args, **kwargs)` on every rank; every rank's value, in rank order. A failed
        rank's own exception is raised (hora's WorkerFailedError where it did not pickle)."""
        backend, np = _plan(self.gpus, self.gpu_type, self.remote)
        config = RunConfig(np=np, backend=backend, **self.options)
        try:
            return launch(self.fn, tuple(args), dict(kwargs), config)
        except WorkerFailedError as error:
            cause = error.__cause__
            original = cause.original() if isinstance(cause, RankTraceback) else None
            if original is None:
                raise
            # Printed as the rank's traceback, then its own exception with hora's headline.
            if sys.version_info >= (3, 11):
                original.add_note(f"hora: {str(error).partition(chr(10))[0]}")
            raise original from cause


@overload
def distributed(fn: Callable[P, R], /) -> DistributedFunction[P, R]: ...


@overload
def distributed(
    fn: None = None,
    /,
    *,
    gpus: int | None = None,
    gpu_type: str | None = None,
    remote: bool = False,
    num_accelerators: int | None = None,
    accelerator_type: str | None = None,
    **options: Any,
) -> Callable[[Callable[P, R]], DistributedFunction[P, R]]: ...


def distributed(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    gpus: int | None = None,
    gpu_type: str | None = None,
    remote: bool = False,
    num_accelerators: int | None = None,
    accelerator_type: str | None = None,
    **options: Any,
) -> Any:
    """`@distributed(gpus=8, gpu_type='H100', remote=True)` (serverless_gpu's names) or
    `@distributed(num_accelerators=8, accelerator_type='GPU_8xH100')` (databricks.air's); bare
    `@distributed` uses every GPU of this machine. `options` are RunConfig's (`env`, `timeout`,
    `max_restarts`, `ship_code`, ...). The arguments are checked here, the machine or cluster
    when `fn.distributed(...)` is called."""
    if num_accelerators is not None or accelerator_type is not None:
        if gpus is not None or gpu_type is not None:
            raise ValueError(
                "give gpus/gpu_type (serverless_gpu's names) or num_accelerators/"
                "accelerator_type (databricks.air's), not both"
            )
        gpus, gpu_type = num_accelerators, _accelerator_gpu_type(accelerator_type)
    if gpus is not None and (isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1):
        raise ValueError(f"gpus must be a positive int (how many ranks), got {gpus!r}")
    if not isinstance(remote, bool):
        raise ValueError(f"remote must be True or False, got {remote!r}")
    gpu_type = _known_gpu_type(gpu_type)
    unknown = sorted(set(options) - set(RunConfig.__dataclass_fields__) - {"np", "backend"})
    reserved = sorted(set(options) & {"np", "backend"})
    if unknown or reserved:
        raise ValueError(
            f"distributed() does not take {unknown + reserved}: the ranks are gpus= and the engine "
            "follows remote=; other options are RunConfig's (env, timeout, max_restarts, ...)"
        )

    def wrap(fn: Callable[..., Any]) -> DistributedFunction[Any, Any]:
        if not callable(fn):
            raise TypeError(f"@distributed decorates a function, got {type(fn).__name__}")
        return DistributedFunction(fn, gpus, gpu_type, remote, options)

    return wrap if fn is None else wrap(fn)


def _accelerator_gpu_type(accelerator_type: str | None) -> str | None:
    """`GPU_8xH100` -> `H100` (the per-node count is the cluster's business, not the ranks')."""
    if accelerator_type is None:
        return None
    found = _ACCELERATOR.match(str(accelerator_type))
    if not found:
        raise ValueError(
            f"accelerator_type={accelerator_type!r} is not of the form GPU_<count>x<type> "
            "(GPU_8xH100, GPU_1xA10)"
        )
    return found["type"]


def _known_gpu_type(gpu_type: str | None) -> str | None:
    if gpu_type is None:
        return None
    if not isinstance(gpu_type, str):
        raise ValueError(f"gpu_type must be a string such as 'H100', got {gpu_type!r}")
    for known in GPU_TYPES:
        if gpu_type.strip().upper() == known.upper():
            return known
    raise ValueError(f"gpu_type={gpu_type!r} is not a GPU type hora knows: {', '.join(GPU_TYPES)}")


def _plan(gpus: int | None, gpu_type: str | None, remote: bool) -> tuple[str, int]:
    """(engine, ranks) for a call, checked against this machine or the cluster at hand."""
    if remote:
        found = engines.active(cluster_only=True)
        if found is None:
            raise RuntimeError(
                "remote=True runs on the cluster the program has started, and there is none: "
                "create a SparkSession (classic or Spark Connect) or call ray.init() first, or "
                "use remote=False to run on this machine"
            )
        if gpus is None:
            raise ValueError("remote=True needs gpus= (how many ranks the cluster runs)")
        return found.name, gpus
    names = local_gpus()
    if gpu_type is not None:
        if not names:
            raise ValueError(
                f"gpu_type={gpu_type!r}: this machine has no GPU. Drop gpu_type to run gpus= "
                "CPU ranks here, or use remote=True on a cluster with such GPUs"
            )
        wrong = sorted({n for n in names if gpu_type.upper() not in n.upper()})
        if wrong:
            raise ValueError(
                f"gpu_type={gpu_type!r}: this machine's GPUs are {', '.join(wrong)}; pass the "
                "type it has, or none"
            )
    if gpus is None:
        if not names:
            raise ValueError("this machine has no GPU: say how many CPU ranks to run with gpus=N")
        return engines.DEFAULT, len(names)
    if names and gpus > len(names):
        raise ValueError(
            f"gpus={gpus}, and this machine has {len(names)} GPU(s): one rank per GPU. Lower "
            "gpus, or use remote=True on a cluster"
        )
    return engines.DEFAULT, gpus


def local_gpus() -> list[str]:
    """The names of the NVIDIA GPUs this process may use (nvidia-smi's, as CUDA_VISIBLE_DEVICES
    narrows them); none without a GPU or its driver. torch is not imported for this."""
    try:
        done = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    if done.returncode != 0:
        return []
    names = [line.strip() for line in done.stdout.splitlines() if line.strip()]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return names
    chosen = [v.strip() for v in visible.split(",") if v.strip()]
    if all(v.isdigit() for v in chosen):
        return [names[int(v)] for v in chosen if int(v) < len(names)]
    return names[: len(chosen)]  # UUIDs: as many as it names
