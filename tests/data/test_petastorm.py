"""Petastorm's converter as a door onto hora.data (issue 30 item 4), on a real `local[2]` Spark.

The first tests hold `make_spark_converter` and its loaders to Petastorm's contract (each row
once per epoch across the shards, batches across the ends of epochs, the cache directory's conf,
`delete`, the refusals; transform_spec and workers_count: test_petastorm_transform.py and
test_petastorm_flowers.py). The last one runs Databricks' Petastorm + HorovodRunner example shape
with only the imports swapped, and trains digits to the accuracy `hora.data.from_spark` reaches.
"""

from __future__ import annotations

import collections
import os

import pytest

import hora
from hora.spark import SparkDatasetConverter, make_spark_converter

pytestmark = pytest.mark.spark

ROWS = 500


@pytest.fixture(scope="module")
def spark(spark, tmp_path_factory):
    """The package's session (tests/data/conftest.py), with Petastorm's cache directory set."""
    cache = tmp_path_factory.mktemp("petastorm-cache")
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{cache}")
    yield spark
    spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


@pytest.fixture(scope="module")
def converter(spark):
    df = spark.range(ROWS).selectExpr(
        "id", "array(cast(id as double), cast(id * 2 as double)) as x", "cast(id as double) as y"
    )
    return make_spark_converter(df.repartition(4))


def ids_of(loader) -> list[int]:
    return [int(i) for batch in loader for i in batch["id"]]


def test_the_converter_is_petastorms(converter, spark):
    assert SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF == (
        "petastorm.spark.converter.parentCacheDirUrl"
    )
    assert len(converter) == ROWS
    parent = spark.conf.get(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)
    assert converter.cache_dir_url.startswith(parent.removeprefix("file://"))
    assert converter.file_urls and all(os.path.exists(f) for f in converter.file_urls)


def test_every_row_once_per_epoch_over_the_shards(converter):
    seen = []
    for shard in range(3):
        with converter.make_torch_dataloader(
            batch_size=16, num_epochs=2, cur_shard=shard, shard_count=3
        ) as loader:
            seen += ids_of(loader)
    assert sorted(seen) == sorted(list(range(ROWS)) * 2)


def test_batches_run_across_the_ends_of_epochs(converter):
    """Petastorm's reader streams epoch after epoch: every batch is full but the last."""
    with converter.make_torch_dataloader(batch_size=64, num_epochs=3) as loader:
        sizes = [len(batch["id"]) for batch in loader]
    assert sizes == [64] * (3 * ROWS // 64) + [3 * ROWS % 64]


def test_num_epochs_none_repeats_forever(converter):
    with converter.make_torch_dataloader(batch_size=100) as loader:
        stream = iter(loader)
        ids = [int(i) for _ in range(3 * ROWS // 100 + 1) for i in next(stream)["id"]]
    assert collections.Counter(ids[: 3 * ROWS]) == collections.Counter(list(range(ROWS)) * 3)


def test_float32_by_default_and_tensors_by_column(converter):
    with converter.make_torch_dataloader(batch_size=8, num_epochs=1) as loader:
        batch = next(iter(loader))
    import torch

    assert batch["x"].shape == (8, 2) and batch["x"].dtype == torch.float32
    assert batch["y"].dtype == torch.float32 and batch["id"].dtype == torch.int64
    assert (batch["x"][:, 0] == batch["id"].float()).all()


def test_schema_fields_and_no_shuffle(converter):
    with converter.make_torch_dataloader(
        batch_size=50, num_epochs=1, schema_fields=["i.", "y"], shuffle_row_groups=False
    ) as loader:
        batches = list(loader)
    assert set(batches[0]) == {"id", "y"}
    ids = [int(i) for b in batches for i in b["id"]]
    assert sorted(ids) == list(range(ROWS))


def test_a_path_converts_without_writing(converter):
    again = make_spark_converter(converter.cache_dir_url)
    assert len(again) == ROWS and again.cache_dir_url == converter.cache_dir_url


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"cur_shard": 0}, "give both"),
        ({"cur_shard": 2, "shard_count": 2}, "cur_shard must be"),
        ({"transform_spec": object()}, "transform_spec must be a TransformSpec"),
        ({"workers_count": -1}, "workers_count must be"),
        ({"predicate": object()}, "predicate is Petastorm's"),
        ({"data_loader_fn": object()}, "data_loader_fn is Petastorm's"),
        ({"num_epochs": 0}, "num_epochs must be"),
        ({"schema_fields": ["nothing"]}, "match none"),
        ({"no_such_argument": 1}, "no_such_argument"),
    ],
)
def test_bad_reader_arguments_say_what_to_change(converter, kwargs, says):
    with pytest.raises((ValueError, TypeError), match=says):
        converter.make_torch_dataloader(batch_size=8, **kwargs)


def test_bad_converter_arguments_say_what_to_change(spark):
    df = spark.range(4)
    with pytest.raises(ValueError, match="no bzip2 codec"):
        make_spark_converter(df, compression_codec="bzip2")
    with pytest.raises(ValueError, match="dtype must be"):
        make_spark_converter(df, dtype="float16")


def test_delete_removes_the_files(spark):
    converter = make_spark_converter(spark.range(10).selectExpr("id", "id * 3 as z"))
    assert all(os.path.exists(f) for f in converter.file_urls)
    converter.delete()
    assert not os.path.exists(converter.cache_dir_url)


def tf_shard_ids(converter) -> list[int]:
    with converter.make_tf_dataset(batch_size=100, num_epochs=1, cur_shard=1, shard_count=2) as ds:
        pairs = ds.map(lambda row: (row.x, row.id))
        return [int(i) for _, batch in pairs for i in batch.numpy()]


def test_tf_dataset_of_named_tuples(converter):
    """In a rank, as TF code runs (tf.data's generator threads stay for the process's life)."""
    pytest.importorskip("tensorflow")
    ids = hora.run(tf_shard_ids, (converter,), np=1, backend="local")[0]
    with converter.make_torch_dataloader(
        batch_size=100, num_epochs=1, cur_shard=1, shard_count=2
    ) as loader:
        assert ids == ids_of(loader)  # the same shard, in the same order
    assert len(ids) == ROWS // 2


# ----- Databricks' example shape, only the imports swapped ------------------------------------

BATCH_SIZE = 32
NUM_EPOCHS = 12


def digits_frames(spark):
    from sklearn.datasets import load_digits

    digits = load_digits()
    rows = [
        (i, [float(v) / 16 for v in x], int(y))
        for i, (x, y) in enumerate(zip(digits.data, digits.target, strict=True))
    ]
    df = spark.createDataFrame(rows, "id long, features array<double>, label long")
    return df.where("id % 5 != 0"), df.where("id % 5 = 0")


def digits_model():
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def petastorm_shaped_training(converter_train, converter_val, lr=0.05):
    """Databricks' HorovodRunner + Petastorm notebook's function, `horovod.torch` -> hora.torch."""
    import torch
    import torch.nn.functional as F

    import hora.torch as hvd

    hvd.init()
    model = digits_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    with (
        converter_train.make_torch_dataloader(
            batch_size=BATCH_SIZE, cur_shard=hvd.rank(), shard_count=hvd.size()
        ) as train_dataloader,
        converter_val.make_torch_dataloader(
            batch_size=BATCH_SIZE, cur_shard=hvd.rank(), shard_count=hvd.size(), num_epochs=1
        ) as val_dataloader,
    ):
        train_dataloader_iter = iter(train_dataloader)
        steps_per_epoch = len(converter_train) // (BATCH_SIZE * hvd.size())
        for _epoch in range(NUM_EPOCHS):
            model.train()
            for _step in range(steps_per_epoch):
                pd_batch = next(train_dataloader_iter)
                inputs, labels = pd_batch["features"], pd_batch["label"]
                optimizer.zero_grad()
                F.cross_entropy(model(inputs), labels).backward()
                optimizer.step()
        model.eval()
        correct = total = 0
        with torch.no_grad():
            for pd_batch in val_dataloader:
                predicted = model(pd_batch["features"]).argmax(dim=1)
                correct += int((predicted == pd_batch["label"]).sum())
                total += len(predicted)
    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum)
    return float(counts[0] / counts[1])


def hora_data_training(train, val, lr=0.05):
    """The same training on `hora.data.from_spark`'s loader."""
    import torch
    import torch.nn.functional as F

    import hora.torch as hvd

    hvd.init()
    model = digits_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    optimizer = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    loader = train.loader(batch_size=BATCH_SIZE, drop_last=True)
    for epoch in range(NUM_EPOCHS):
        loader.set_epoch(epoch)
        model.train()
        for batch in loader:
            optimizer.zero_grad()
            F.cross_entropy(model(batch["features"].float()), batch["label"]).backward()
            optimizer.step()
    model.eval()
    correct = total = 0
    with torch.no_grad():
        for batch in val.loader(batch_size=BATCH_SIZE, shuffle=False):
            predicted = model(batch["features"].float()).argmax(dim=1)
            correct += int((predicted == batch["label"]).sum())
            total += len(predicted)
    counts = hvd.allreduce(torch.tensor([correct, total], dtype=torch.float64), op=hvd.Sum)
    return float(counts[0] / counts[1])


def test_databricks_petastorm_example_trains_digits_as_from_spark_does(spark):
    from hora import HorovodRunner  # was: from sparkdl import HorovodRunner

    df_train, df_val = digits_frames(spark)
    converter_train = make_spark_converter(df_train)
    converter_val = make_spark_converter(df_val)
    accuracy = HorovodRunner(np=2).run(
        petastorm_shaped_training, converter_train=converter_train, converter_val=converter_val
    )
    train, val = hora.data.from_spark(df_train), hora.data.from_spark(df_val)
    expected = HorovodRunner(np=2).run(hora_data_training, train=train, val=val)
    assert expected > 0.9, expected
    assert abs(accuracy - expected) < 0.03, (accuracy, expected)
    converter_train.delete()
    converter_val.delete()
