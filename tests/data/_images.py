"""JPEG bytes in Parquet, made here with Pillow (nothing downloaded), and the decoding
`transform` the loader's tests and bench/data_images.py give it."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq


def jpeg(index: int, side: int) -> bytes:
    """A `side` x `side` RGB JPEG whose pixels depend on `index` (a gradient and noise)."""
    from PIL import Image

    rng = np.random.default_rng(index)
    ramp = np.linspace(0, 255, side, dtype=np.float32)
    planes = np.add.outer(ramp, ramp) / 2, np.outer(ramp, ramp) / 255, ramp[None, :]
    pixels = np.stack(np.broadcast_arrays(*planes), axis=-1)
    noisy = pixels + rng.normal(0, 24, pixels.shape) + index % 97
    out = io.BytesIO()
    Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).save(out, "JPEG", quality=90)
    return out.getvalue()


def write_jpegs(folder: Path, count: int, side: int = 32, group: int = 16) -> Path:
    """`count` JPEGs with an `id` and a `label`, in one Parquet file of `group`-row row groups."""
    folder.mkdir(parents=True, exist_ok=True)
    table = pa.table(
        {
            "id": np.arange(count),
            "label": np.arange(count) % 5,
            "image": pa.array([jpeg(i, side) for i in range(count)], pa.binary()),
        }
    )
    pq.write_table(table, folder / "images.parquet", row_group_size=group)
    return folder


def decode(batch: dict[str, Any]) -> dict[str, Any]:
    """The loader's transform: JPEG bytes to a uint8 array [rows, H, W, 3], with id and label."""
    from PIL import Image

    images = np.stack(
        [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")) for b in batch["image"]]
    )
    return {"image": images, "id": batch["id"], "label": batch["label"]}
