"""Images/s of one rank: JPEG bytes in Parquet decoded by one function, hora.data's loader with K
workers against torch's DataLoader(num_workers=K) over the same row groups and Mosaic Streaming's
StreamingDataLoader(num_workers=K) over the same images in MDS.

`--images` JPEGs (224x224 RGB, made here with Pillow) are written once to Parquet (row groups of
`--group` images) and to MDS (bytes). Every contender decodes with `decode_one` (PIL to a uint8
array) and yields batches of `--batch` images as uint8 tensors [B, 224, 224, 3]:

- hora: `from_parquet(path).loader(batch, transform=decode, num_workers=K)`, shuffled (and, for
  the shuffle's cost, in file order);
- DataLoader: a map-style dataset whose item i is row group i, decoded whole (batch_size=None,
  shuffled row groups), `num_workers=K`;
- Mosaic: a `StreamingDataset` whose `__getitem__` decodes one image, `StreamingDataLoader(
  batch_size, num_workers=K)`, shuffled.

Rounds alternate the contenders; each round times one epoch of each, worker start included.
Printed: medians in images/s, the ratios, and K x the single-core decode rate (the same images
decoded in a loop in this process) as the ceiling.

    .venv/bin/python bench/data_images.py                        # K = 1 and 2, 2,000 images
    .venv/bin/python bench/data_images.py --workers 1,2,4,8,14 --images 20000   # a big host
    python3 bench/data_images.py --contenders hora,torch --device cuda       # onto a GPU
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STUBS = REPO / "tests" / "data" / "_stubs"
sys.path[:0] = [str(STUBS), str(REPO)]  # Mosaic imports torchvision: the stand-in first

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

SIDE = 224


def decode_one(data: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))


def decode(batch: dict[str, Any]) -> dict[str, Any]:
    """hora's transform: the batch's JPEGs decoded, stacked."""
    return {"image": np.stack([decode_one(b) for b in batch["image"]]), "label": batch["label"]}


def write(folder: Path, count: int, group: int, mds: bool) -> tuple[Path, Path, list[bytes]]:
    """The images as Parquet, and as MDS where Mosaic runs (a host without it skips it)."""
    from tests.data._images import jpeg

    images = [jpeg(i, SIDE) for i in range(count)]
    table = pa.table(
        {"label": np.arange(count) % 10, "image": pa.array(images, pa.binary())},
    )
    parquet = folder / "images.parquet"
    pq.write_table(table, parquet, row_group_size=group)
    where = folder / "mds"
    if mds:
        from streaming import MDSWriter

        with MDSWriter(out=str(where), columns={"label": "int64", "image": "bytes"}) as out:
            for i, data in enumerate(images):
                out.write({"label": i % 10, "image": data})
    return parquet, where, images


class RowGroups(torch.utils.data.Dataset):
    """torch's baseline: item i is row group i of the file, decoded whole."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.groups = pq.ParquetFile(path).metadata.num_row_groups
        self._file: Any = None

    def __len__(self) -> int:
        return self.groups

    def __getitem__(self, i: int) -> dict[str, Any]:
        if self._file is None:  # opened in each worker
            self._file = pq.ParquetFile(self.path)
        table = self._file.read_row_group(i)
        batch = decode({"image": table.column("image").to_pylist(),
                        "label": table.column("label").to_numpy()})  # fmt: skip
        return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in batch.items()}


DEVICE: str | None = None  # --device: every contender's batches end on it (pinned copies)


def landed(batch: dict[str, Any]) -> int:
    """The batch's image count, once its tensors are on DEVICE when one is named."""
    if DEVICE is not None:
        if batch["image"].device.type == "cpu":
            batch = {k: v.to(DEVICE, non_blocking=True) for k, v in batch.items()}
        torch.cuda.current_stream().synchronize()
    return len(batch["label"])


def hora_epoch(path: Path, batch: int, workers: int, shuffle: bool) -> int:
    import hora.data

    loader = hora.data.from_parquet(path).loader(
        batch, shuffle=shuffle, transform=decode, num_workers=workers, rank=0, size=1,
        pin_memory=DEVICE is not None, device=DEVICE,
    )  # fmt: skip
    try:
        return sum(landed(b) for b in loader)
    finally:
        loader.close()


def torch_epoch(path: Path, batch: int, workers: int) -> int:
    loader = torch.utils.data.DataLoader(
        RowGroups(path), batch_size=None, shuffle=True, num_workers=workers,
        pin_memory=DEVICE is not None,
    )  # fmt: skip
    return sum(landed(b) for b in loader)


def mosaic_epoch(mds: Path, batch: int, workers: int) -> int:
    from streaming import StreamingDataLoader, StreamingDataset
    from streaming.base.util import clean_stale_shared_memory

    class Decoded(StreamingDataset):
        def __getitem__(self, i: int) -> dict[str, Any]:  # type: ignore[override]
            sample = super().__getitem__(i)
            return {"image": torch.from_numpy(decode_one(sample["image"]).copy()),
                    "label": sample["label"]}  # fmt: skip

    clean_stale_shared_memory()
    dataset = Decoded(local=str(mds), shuffle=True, shuffle_seed=0, batch_size=batch)
    loader = StreamingDataLoader(dataset, batch_size=batch, num_workers=workers)
    return sum(len(b["label"]) for b in loader)


def timed(fn: Any, *args: Any) -> float:
    start = time.perf_counter()
    n = fn(*args)
    return n / (time.perf_counter() - start)


def contenders(kinds: list[str], parquet: Path, mds: Path) -> list[tuple[Any, ...]]:
    """(name, epoch function, its data, its further arguments) for each contender asked for."""
    found: list[tuple[Any, ...]] = []
    if "hora" in kinds:
        found += [
            ("hora", hora_epoch, parquet, True),
            ("hora, file order", hora_epoch, parquet, False),
        ]
    if "torch" in kinds:
        found.append(("DataLoader", torch_epoch, parquet))
    if "mosaic" in kinds:
        found.append(("Mosaic", mosaic_epoch, mds))
    return found


def report(k: int, rounds: int, rates: dict[str, list[float]], single: float) -> None:
    median = {name: statistics.median(r) for name, r in rates.items()}
    print(f"\nK={k} workers (median of {rounds} epochs, images/s):")
    for name, rate in median.items():
        each = ", ".join(f"{r:,.0f}" for r in rates[name])
        print(f"  {name:18s} {rate:9,.0f}   rounds: {each}")
    if "hora" not in median:
        return
    ceiling = k * single
    print(f"  hora / (K x one core's decode {ceiling:,.0f}): {median['hora'] / ceiling:.2f}")
    order = median["hora"] / median["hora, file order"]
    print(f"  hora shuffled / file order: {order:.2f}")
    for other in ("DataLoader", "Mosaic"):
        if other in median:
            print(f"  hora / {other}: {median['hora'] / median[other]:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--images", type=int, default=2000)
    parser.add_argument("--group", type=int, default=64, help="images per Parquet row group")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--contenders", default="hora,torch,mosaic")
    parser.add_argument("--device", help="e.g. cuda: batches copied there from pinned memory")
    args = parser.parse_args()
    global DEVICE
    DEVICE = args.device
    counts = [int(k) for k in args.workers.split(",")]
    kinds = args.contenders.split(",")
    root = Path(tempfile.mkdtemp(prefix="hora-bench-images-"))
    try:
        parquet, mds, images = write(root, args.images, args.group, "mosaic" in kinds)
        start = time.perf_counter()
        for data in images[: min(500, len(images))]:
            decode_one(data)
        single = min(500, len(images)) / (time.perf_counter() - start)
        mb = sum(map(len, images)) / len(images) / 1e3
        print(f"{args.images} JPEGs of {SIDE}x{SIDE} ({mb:.1f} KB each), row groups of "
              f"{args.group}, batches of {args.batch}; {os.cpu_count()} cores, load "
              f"{os.getloadavg()[0]:.1f}; one core decodes {single:,.0f} images/s")  # fmt: skip
        for k in counts:
            rates: dict[str, list[float]] = {}
            for _ in range(args.rounds):
                for name, fn, where, *more in contenders(kinds, parquet, mds):
                    rates.setdefault(name, []).append(timed(fn, where, args.batch, k, *more))
            report(k, args.rounds, rates, single)
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
