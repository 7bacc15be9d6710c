"""A small flowers dataset made here (no download): JPEGs in Databricks' `flower_photos` layout,
one folder a class, read back with Spark's binaryFile source as Databricks' notebooks do.

Each class has its own colour (so that a tiny model learns it in a few steps); each image its
own brightness, gradient and noise (so that every decoded image differs from the others).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np

CLASSES = ("daisy", "dandelion", "roses", "sunflowers", "tulips")
PER_CLASS = 12
VAL_PER_CLASS = 2  # the first images of each class; the rest train
SIZE = 64
_COLOURS = ((240, 240, 230), (250, 210, 20), (200, 20, 40), (240, 160, 0), (150, 40, 190))


def image(index: int) -> np.ndarray:
    """Image `index` (class `index // PER_CLASS`) as SIZE x SIZE x 3 bytes."""
    rng = np.random.default_rng(index)
    colour = np.array(_COLOURS[index // PER_CLASS], dtype=np.float64)
    ramp = np.linspace(0.6, 1.0, SIZE)[:, None, None] * rng.uniform(0.8, 1.1)
    noise = rng.normal(0, 12, (SIZE, SIZE, 3))
    return np.clip(colour * ramp + noise, 0, 255).astype(np.uint8)


def jpeg(index: int) -> bytes:
    from PIL import Image

    out = io.BytesIO()
    Image.fromarray(image(index)).save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_photos(folder: Path) -> dict[int, bytes]:
    """`folder/flower_photos/<class>/<id>.jpg` for every image; the bytes by id."""
    written = {}
    for index in range(len(CLASSES) * PER_CLASS):
        place = folder / "flower_photos" / CLASSES[index // PER_CLASS] / f"{index}.jpg"
        place.parent.mkdir(parents=True, exist_ok=True)
        written[index] = jpeg(index)
        place.write_bytes(written[index])
    return written


def is_val(index: int) -> bool:
    return index % PER_CLASS < VAL_PER_CLASS


def flowers_frame(spark: Any, folder: Path) -> Any:
    """The photos as Databricks' flowers table: path, content, label (the folder's name),
    label_index (its place among the sorted labels), and the id the file is named by."""
    from pyspark.sql import functions as F

    images = (
        spark.read.format("binaryFile")
        .option("recursiveFileLookup", "true")
        .option("pathGlobFilter", "*.jpg")
        .load(str(folder / "flower_photos"))
    )
    labels = F.array(*[F.lit(c) for c in sorted(CLASSES)])
    return images.select(
        "content",
        F.regexp_extract("path", "flower_photos/([^/]+)", 1).alias("label"),
        F.regexp_extract("path", r"(\d+)\.jpg$", 1).cast("long").alias("id"),
    ).withColumn("label_index", F.array_position(labels, F.col("label")) - 1)


def split(df: Any) -> tuple[Any, Any]:
    """Train and validation rows (a fixed split: the tests count rows per epoch)."""
    from pyspark.sql import functions as F

    val = (F.col("id") % PER_CLASS) < VAL_PER_CLASS
    return df.where(~val).repartition(2), df.where(val).repartition(2)


def pixels(content: bytes, size: int) -> np.ndarray:
    """The test's own decode of one JPEG: RGB, resized to size x size, as bytes (H, W, 3)."""
    from PIL import Image

    return np.array(Image.open(io.BytesIO(content)).convert("RGB").resize((size, size)))


def normalized(content: bytes, size: int, mean: np.ndarray, std: np.ndarray) -> np.ndarray:
    """What torchvision's Resize, ToTensor and Normalize make of a JPEG: channels first,
    scaled to [0, 1], normalized by channel."""
    chw = np.moveaxis(pixels(content, size), -1, 0).astype(np.float64) / 255.0
    return ((chw - mean.reshape(3, 1, 1)) / std.reshape(3, 1, 1)).astype(np.float32)


def mobilenet_scaled(content: bytes, size: int) -> np.ndarray:
    """What Keras' img_to_array and MobileNetV2's preprocess_input make of a JPEG: channels
    last, scaled to [-1, 1]."""
    return (pixels(content, size).astype(np.float64) / 127.5 - 1.0).astype(np.float32)
