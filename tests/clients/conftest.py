"""Other projects' client code, run unchanged inside hora's doors and under its reference
launcher (torchrun, or pyspark's TorchDistributor) in the same test: the same ranks, losses and
weights. Needs the `clients` extra (`pip install -e '.[clients]'`); skipped without it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = str(Path(__file__).resolve().parents[2])
TRAIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_train.py")


def with_repo_on_path(env: dict[str, str]) -> dict[str, str]:
    """`env` where a fresh interpreter imports tests.clients (torchrun's, pyspark's)."""
    path = env.get("PYTHONPATH", "")
    return env | {"PYTHONPATH": REPO + (os.pathsep + path if path else "")}


#: how a rank of torchrun's own run (the reference) was seen to die now and then on this 2-core
#: machine: a C++ std::terminate in gloo's teardown, torch's flake and not the run under test
TORN_DOWN = "terminate called without an active exception"


def torchrun(job: str, out: Path, *args: str, nproc: int = 2) -> subprocess.CompletedProcess:
    """The reference: `job` under torchrun, run again (up to 4 times) should torch's teardown
    abort a rank (gloo's "terminate called without an active exception", twice in a row once)."""
    out.mkdir(exist_ok=True)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += [f"--nproc_per_node={nproc}", TRAIN, job, str(out), *args]
    for _ in range(4):
        done = subprocess.run(
            command,
            env=with_repo_on_path(dict(os.environ)),
            capture_output=True,
            text=True,
            timeout=600,
        )
        if done.returncode == 0 or TORN_DOWN not in done.stderr:
            return done
    return done


def results(out: Path, job: str, ranks: int = 2) -> list[dict[str, Any]]:
    return [json.loads((out / f"{job}-{rank}.json").read_text()) for rank in range(ranks)]
