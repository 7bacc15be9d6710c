"""The DeepSpeed tests' one real C++ build: DeepSpeed's `fused_adam`, which an `AdamW` config
needs on CPU, compiled by hora's ranks into a fresh torch extension cache the first time a test
asks for it; the tests after it load it from there."""

from __future__ import annotations

import contextlib
import io
import os
import shutil
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

#: DeepSpeed's own examples' optimizer: on CPU, its compiled `fused_adam` op
ADAMW = {
    "train_micro_batch_size_per_gpu": 8,
    "optimizer": {"type": "AdamW", "params": {"lr": 0.01}},
    "zero_optimization": {"stage": 2},
}
#: A test that may build the op first (minutes of C++ on 2 cores) gets this long
BUILD_TIMEOUT = 1200


@dataclass(frozen=True)
class BuiltCache:
    """A torch extension cache in which the first run of the `ADAMW` config built `fused_adam`."""

    folder: Path
    first_output: str  # the driver's stdout during that run
    first_out: Path  # where its ranks wrote what they saw (tests/deepspeed/_ranks.py)
    first_seconds: float

    @property
    def built_op(self) -> Path:
        return self.folder / "fused_adam" / "fused_adam.so"


@pytest.fixture(scope="session")
def fused_adam_cache(tmp_path_factory: pytest.TempPathFactory) -> BuiltCache:
    """Run the `ADAMW` config once on 2 local ranks with a cold cache: hora builds the op there."""
    pytest.importorskip("deepspeed", reason="DeepSpeed is not installed")
    from hora.spark import DeepspeedTorchDistributor
    from tests.deepspeed import _ranks

    folder = tmp_path_factory.mktemp("torch_extensions")
    _seed_shared_memory_op(folder)
    out = tmp_path_factory.mktemp("first_run")
    output = io.StringIO()
    start = time.monotonic()
    try:
        with pytest.MonkeyPatch.context() as env, contextlib.redirect_stdout(output):
            env.setenv("TORCH_EXTENSIONS_DIR", str(folder))
            DeepspeedTorchDistributor(
                numGpus=2, localMode=True, useGpu=False, deepspeedConfig=ADAMW
            ).run(_ranks.__file__, "--out", str(out))
    finally:
        sys.stdout.write(output.getvalue())  # in the setup output of the test that asked first
    return BuiltCache(folder, output.getvalue(), out, time.monotonic() - start)


def _seed_shared_memory_op(folder: Path) -> None:
    """Copy the built `deepspeed_shm_comm` op (every CPU init_distributed loads it; `make
    deepspeed-ops` builds it) into the cold cache, so that `fused_adam` is the session's only
    compile."""
    from hora import _deepspeed_ops

    name = "deepspeed_shm_comm"
    built = _deepspeed_ops.cache_folder(name)  # where this session's environment keeps it
    if os.path.isfile(os.path.join(built, f"{name}.so")):
        shutil.copytree(built, folder / name, ignore=shutil.ignore_patterns("*lock"))
