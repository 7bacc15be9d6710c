"""Which GPUs a rank sees: this machine's, a cluster's addresses as CUDA devices, and the
CUDA_VISIBLE_DEVICES that makes `cuda:LOCAL_RANK` a rank's own GPU."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from typing import Any


def local_gpus() -> list[str]:
    """This machine's GPUs as CUDA numbers them for this process: CUDA_VISIBLE_DEVICES when set,
    else every device torch counts."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g.strip() for g in visible.split(",") if g.strip()]
    import torch  # only when asked: `import hora` stays light

    return [str(i) for i in range(torch.cuda.device_count())]


def cuda_devices(addresses: list[str], environ: Mapping[str, str] | None = None) -> list[str]:
    """The CUDA devices behind a cluster's GPU `addresses`, as pyspark's TorchDistributor and
    spark-tensorflow-distributor read them: indexes into this process's CUDA_VISIBLE_DEVICES
    when that is set (a driver or executor given GPUs 3,4,5 reports them as 0,1,2), else the
    devices themselves. A ValueError (pyspark's) when an address cannot be such an index."""
    env = os.environ if environ is None else environ
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(addresses)
    devices = [d.strip() for d in visible.split(",") if d.strip()]
    wrong = [a for a in addresses if not _CUDA_INDEX.match(a) or int(a) >= len(devices)]
    if wrong:
        raise ValueError(
            f"GPU addresses {list(addresses)} must be indexes into CUDA_VISIBLE_DEVICES="
            f"{visible!r} (integers with no zero padding, below {len(devices)}): {wrong} are "
            "not. Make the GPU discovery script report them so, or unset CUDA_VISIBLE_DEVICES"
        )
    return [devices[int(a)] for a in addresses]


_CUDA_INDEX = re.compile(r"^(0|[1-9][0-9]*)$")


def visible_gpus(
    rank: int, hosts: list[str], ranks: list[dict[str, Any]], own_only: bool = False
) -> list[str]:
    """CUDA_VISIBLE_DEVICES for `rank`, chosen so that `cuda:LOCAL_RANK` is its own GPU.

    With one GPU per rank (the usual `spark.task.resource.gpu.amount=1`, or one GPU per Ray
    bundle) every rank sees the GPUs of this job's ranks on its host, in local-rank order, so
    `torch.cuda.set_device(local_rank)` picks the GPU the cluster assigned to it. Otherwise
    (several GPUs per rank, or addresses that repeat across executors), or with `own_only` (a
    TensorFlow worker uses every GPU it sees), a rank sees only its own GPUs, as pyspark's
    TorchDistributor does.
    """
    own = list(ranks[rank]["gpus"])
    if own_only:
        return own
    local = [r["gpus"] for r, h in zip(ranks, hosts, strict=True) if h == hosts[rank]]
    flat = [g for gpus in local for g in gpus]
    if all(len(gpus) == 1 for gpus in local) and len(set(flat)) == len(flat):
        return flat
    return own
