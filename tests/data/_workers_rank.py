"""Run in a fresh process: a rank whose loader decodes JPEGs in 2 workers; prints its pid and
its workers' once the first batch came, then trains slowly until it is killed."""

from __future__ import annotations

import json
import os
import sys
import time

import hora.data
from tests.data._images import decode


def main(path: str) -> None:
    loader = hora.data.from_parquet(path).loader(
        4, columns=["id", "label", "image"], transform=decode, num_workers=2, rank=0, size=1
    )
    for epoch in range(1000):
        loader.set_epoch(epoch)
        for step, _ in enumerate(loader):
            if epoch == step == 0:
                print(json.dumps({"pid": os.getpid(), "workers": loader.worker_pids}), flush=True)
            time.sleep(0.05)


if __name__ == "__main__":
    main(sys.argv[1])
