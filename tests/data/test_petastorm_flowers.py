"""Databricks' Petastorm flowers notebooks (`petastorm-spark-converter-pytorch` and
`-tensorflow`, their HorovodRunner part) on hora, with the imports swapped, on JPEGs made here.

As there: the photos are read with Spark's binaryFile source (the label is the folder's name),
the converter writes the JPEG bytes, and a `TransformSpec` decodes and resizes them as pandas
batches (`edit_fields` declares `features`, `selected_fields` the order). Here they run in
`workers_count=2` loader workers per rank, on 60 images of 64x64 (5 classes of colours) resized
to 32x32, with a conv layer for MobileNetV2 (no weights to download) and PIL + numpy for
torchvision (not installed). Each rank also hands back which images it got in each epoch and
their features, which the test compares with its own decode of the files.
"""

from __future__ import annotations

import io
from functools import partial

import numpy as np
import pytest
from PIL import Image

from hora import HorovodRunner  # was: from sparkdl import HorovodRunner
from hora.spark import SparkDatasetConverter, TransformSpec, make_spark_converter
from tests.data import _flowers

pytestmark = pytest.mark.spark

BATCH_SIZE = 5
NUM_EPOCHS = 4
IMG_SIZE = 32
IMG_SHAPE = (IMG_SIZE, IMG_SIZE, 3)
MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)
num_classes = len(_flowers.CLASSES)
label_to_idx = {label: index for index, label in enumerate(sorted(_flowers.CLASSES))}
TRAIN_IDS = sorted(i for i in range(num_classes * _flowers.PER_CLASS) if not _flowers.is_val(i))


@pytest.fixture(scope="module")
def spark(spark, tmp_path_factory):
    """The package's session (tests/data/conftest.py), with Petastorm's cache directory set."""
    cache = tmp_path_factory.mktemp("petastorm-cache")
    spark.conf.set(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF, f"file://{cache}")
    yield spark
    spark.conf.unset(SparkDatasetConverter.PARENT_CACHE_DIR_URL_CONF)


@pytest.fixture(scope="module")
def photos(tmp_path_factory):
    folder = tmp_path_factory.mktemp("flowers")
    return folder, _flowers.write_photos(folder)


def converters(df):
    df_train, df_val = _flowers.split(df)
    return make_spark_converter(df_train), make_spark_converter(df_val)


def check_epochs(ranks, photos, expected_features, label_dtype):
    """Every training image reached exactly one rank in each epoch, with its label, and its
    features equal the test's own decode of the file."""
    epochs = len(ranks[0]["epochs"])
    for epoch in range(epochs):
        ids = sorted(i for rank in ranks for i in rank["epochs"][epoch])
        assert ids == TRAIN_IDS, (epoch, ids)
    features = {i: f for rank in ranks for i, f in rank["features"].items()}
    labels = {i: label for rank in ranks for i, label in rank["labels"].items()}
    assert sorted(features) == TRAIN_IDS
    for i, found in features.items():
        assert found.dtype == np.float32
        np.testing.assert_allclose(found, expected_features(photos[i]), rtol=0, atol=1e-5)
        assert labels[i] == i // _flowers.PER_CLASS and labels[i].dtype == label_dtype


# ----- PyTorch: petastorm-spark-converter-pytorch, section 4 --------------------------------


def get_model(lr=0.001):
    """A conv layer for the notebook's MobileNetV2 (whose weights would be downloaded)."""
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1),
        torch.nn.ReLU(),
        torch.nn.AdaptiveAvgPool2d(1),
        torch.nn.Flatten(),
        torch.nn.Linear(8, num_classes),
    )


def train_one_epoch(
    model, criterion, optimizer, scheduler, train_dataloader_iter, steps_per_epoch, epoch, device,
    seen,
):  # fmt: skip
    import torch

    model.train()  # Set model to training mode
    running_loss = 0.0
    running_corrects = 0
    for _step in range(steps_per_epoch):
        pd_batch = next(train_dataloader_iter)
        seen.append(pd_batch)  # the test's: which rows, with which features
        inputs, labels = pd_batch["features"].to(device), pd_batch["label_index"].to(device)
        with torch.set_grad_enabled(True):
            optimizer.zero_grad()
            outputs = model(inputs)
            _, preds = torch.max(outputs, 1)
            loss = criterion(outputs, labels)
            loss.backward()
            optimizer.step()
        running_loss += loss.item() * inputs.size(0)
        running_corrects += torch.sum(preds == labels.data)
    scheduler.step()
    epoch_loss = running_loss / (steps_per_epoch * BATCH_SIZE)
    epoch_acc = running_corrects.double() / (steps_per_epoch * BATCH_SIZE)
    print(f"Train Loss: {epoch_loss:.4f} Acc: {epoch_acc:.4f}")
    return epoch_loss, epoch_acc


def evaluate(model, criterion, val_dataloader_iter, validation_steps, device, metric_agg_fn=None):
    import torch

    model.eval()
    running_loss = 0.0
    running_corrects = 0
    for _step in range(validation_steps):
        pd_batch = next(val_dataloader_iter)
        inputs, labels = pd_batch["features"].to(device), pd_batch["label_index"].to(device)
        with torch.set_grad_enabled(False):
            outputs = model(inputs)
            _, preds = torch.max(outputs, 1)
            loss = criterion(outputs, labels)
        running_loss += loss.item()
        running_corrects += torch.sum(preds == labels.data)
    epoch_loss = running_loss / validation_steps
    epoch_acc = running_corrects.double() / (validation_steps * BATCH_SIZE)
    if metric_agg_fn is not None:
        epoch_loss = metric_agg_fn(epoch_loss, "avg_loss")
        epoch_acc = metric_agg_fn(epoch_acc, "avg_acc")
    print(f"Validation Loss: {epoch_loss:.4f} Acc: {epoch_acc:.4f}")
    return epoch_loss, epoch_acc


def trans(content):
    """torchvision's Compose([Lambda(Image.open), Resize, CenterCrop, ToTensor, Normalize]) in
    PIL and numpy (the notebook's RandomResizedCrop and flip are left out: the test compares)."""
    image = Image.open(io.BytesIO(content)).convert("RGB").resize((IMG_SIZE, IMG_SIZE))
    chw = np.asarray(image, dtype=np.float32).transpose(2, 0, 1) / np.float32(255)
    return (chw - MEAN[:, None, None]) / STD[:, None, None]


def transform_row(is_train, pd_batch):
    """
    The input and output of this function must be pandas dataframes.
    Do data augmentation for the training dataset only.
    """
    pd_batch["features"] = pd_batch["content"].map(lambda x: trans(x))
    pd_batch = pd_batch.drop(labels=["content"], axis=1)
    return pd_batch


def get_transform_spec(is_train=True):
    # The output shape of the `TransformSpec` is not automatically known by petastorm,
    # so you need to specify the shape for new columns in `edit_fields` and specify the order of
    # the output columns in `selected_fields`.
    return TransformSpec(
        partial(transform_row, is_train),
        edit_fields=[("features", np.float32, (3, IMG_SIZE, IMG_SIZE), False)],
        selected_fields=["features", "label_index", "id"],  # the test's: "id" carried along
    )


def train_and_evaluate_hvd(converter_train, converter_val, lr=0.001):
    import torch

    import hora.torch as hvd  # was: import horovod.torch as hvd

    hvd.init()  # Initialize Horovod.
    device = torch.device("cpu")
    model = get_model(lr=lr)
    model = model.to(device)
    criterion = torch.nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr * hvd.size(), momentum=0.9)
    hvd.broadcast_parameters(model.state_dict(), root_rank=0)
    hvd.broadcast_optimizer_state(optimizer, root_rank=0)
    optimizer_hvd = hvd.DistributedOptimizer(optimizer, named_parameters=model.named_parameters())
    exp_lr_scheduler = torch.optim.lr_scheduler.StepLR(optimizer_hvd, step_size=7, gamma=0.1)

    epochs, losses = [], []
    with (
        converter_train.make_torch_dataloader(
            transform_spec=get_transform_spec(is_train=True),
            cur_shard=hvd.rank(),
            shard_count=hvd.size(),
            batch_size=BATCH_SIZE,
            workers_count=2,
        ) as train_dataloader,
        converter_val.make_torch_dataloader(
            transform_spec=get_transform_spec(is_train=False),
            cur_shard=hvd.rank(),
            shard_count=hvd.size(),
            batch_size=BATCH_SIZE,
            workers_count=2,
        ) as val_dataloader,
    ):
        train_dataloader_iter = iter(train_dataloader)
        steps_per_epoch = len(converter_train) // (BATCH_SIZE * hvd.size())
        val_dataloader_iter = iter(val_dataloader)
        validation_steps = max(1, len(converter_val) // (BATCH_SIZE * hvd.size()))
        for epoch in range(NUM_EPOCHS):
            print(f"Epoch {epoch + 1}/{NUM_EPOCHS}")
            seen = []
            train_loss, _ = train_one_epoch(
                model, criterion, optimizer_hvd, exp_lr_scheduler, train_dataloader_iter,
                steps_per_epoch, epoch, device, seen,
            )  # fmt: skip
            val_loss, _ = evaluate(
                model, criterion, val_dataloader_iter, validation_steps, device,
                metric_agg_fn=metric_average,
            )  # fmt: skip
            epochs.append(seen)
            losses.append(train_loss)
    return hvd.allgather_object(torch_report(epochs, losses, val_loss))


def metric_average(val, name):
    import torch

    import hora.torch as hvd

    tensor = torch.tensor(val)
    avg_tensor = hvd.allreduce(tensor, name=name)
    return avg_tensor.item()


def torch_report(epochs, losses, val_loss):
    """This rank's ids per epoch, epoch 0's features and labels by id, and what a batch is."""
    first = epochs[0][0]
    return {
        "epochs": [[int(i) for batch in seen for i in batch["id"]] for seen in epochs],
        "features": {
            int(i): f.numpy()
            for b in epochs[0]
            for i, f in zip(b["id"], b["features"], strict=True)
        },
        "labels": {
            int(i): label.numpy()
            for b in epochs[0]
            for i, label in zip(b["id"], b["label_index"], strict=True)
        },
        "batch": {k: (str(v.dtype), tuple(v.shape)) for k, v in first.items()},
        "losses": losses,
        "val_loss": val_loss,
    }


def test_databricks_pytorch_flowers_notebook(spark, photos):
    folder, jpegs = photos
    df = _flowers.flowers_frame(spark, folder).select("content", "label_index", "id")
    converter_train, converter_val = converters(df)
    print(f"train: {len(converter_train)}, val: {len(converter_val)}")

    hr = HorovodRunner(np=2)
    ranks = hr.run(
        train_and_evaluate_hvd, converter_train=converter_train, converter_val=converter_val,
        lr=0.025,
    )  # fmt: skip

    assert len(ranks) == 2
    check_epochs(
        ranks, jpegs, lambda c: _flowers.normalized(c, IMG_SIZE, MEAN, STD), np.dtype(np.int64)
    )
    for rank in ranks:
        assert rank["batch"] == {
            "features": ("torch.float32", (BATCH_SIZE, 3, IMG_SIZE, IMG_SIZE)),
            "label_index": ("torch.int64", (BATCH_SIZE,)),
            "id": ("torch.int64", (BATCH_SIZE,)),
        }
        assert list(rank["batch"]) == ["features", "label_index", "id"]  # selected_fields' order
        assert rank["losses"][-1] < rank["losses"][0], rank["losses"]
    converter_train.delete()
    converter_val.delete()


# ----- TensorFlow: petastorm-spark-converter-tensorflow, section 5 --------------------------


def get_tf_model(lr=0.001):
    """A conv layer for the notebook's MobileNetV2 base (whose weights would be downloaded)."""
    from tensorflow import keras

    keras.utils.set_random_seed(0)
    return keras.Sequential(
        [
            keras.Input(IMG_SHAPE),
            keras.layers.Conv2D(8, 3, activation="relu"),
            keras.layers.GlobalAveragePooling2D(),
            keras.layers.Dense(num_classes),
        ]
    )


def preprocess(content):
    """
    Preprocess an image file bytes for MobileNetV2 (ImageNet).
    """
    from tensorflow import keras
    from tensorflow.keras.applications.mobilenet_v2 import preprocess_input

    image = Image.open(io.BytesIO(content)).resize([IMG_SIZE, IMG_SIZE])
    image_array = keras.preprocessing.image.img_to_array(image)
    return preprocess_input(image_array)


def tf_transform_row(pd_batch):
    """
    The input and output of this function are pandas dataframes.
    """
    pd_batch["features"] = pd_batch["content"].map(lambda x: preprocess(x))
    pd_batch["label_index"] = pd_batch["label"].map(lambda x: label_to_idx[x])
    pd_batch = pd_batch.drop(labels=["content", "label"], axis=1)
    return pd_batch


# The output shape of the `TransformSpec` is not automatically known by petastorm,
# so you need to specify the shape for new columns in `edit_fields` and specify the order of
# the output columns in `selected_fields`.
transform_spec_fn = TransformSpec(
    tf_transform_row,
    edit_fields=[("features", np.float32, IMG_SHAPE, False), ("label_index", np.int32, (), False)],
    selected_fields=["features", "label_index", "id"],  # the test's: "id" carried along
)


def tf_train_and_evaluate_hvd(converter_train, converter_val, lr=0.001):
    import tensorflow as tf
    from tensorflow import keras

    import hora.keras as hvd  # was: import horovod.tensorflow.keras as hvd

    hvd.init()  # Initialize Horovod.
    gpus = tf.config.experimental.list_physical_devices("GPU")
    for gpu in gpus:
        tf.config.experimental.set_memory_growth(gpu, True)
    if gpus:
        tf.config.experimental.set_visible_devices(gpus[hvd.local_rank()], "GPU")

    model = get_tf_model(lr)
    # Keras 3 names it learning_rate (Keras 2 took lr=)
    optimizer = keras.optimizers.SGD(learning_rate=lr * hvd.size(), momentum=0.9)
    dist_optimizer = hvd.DistributedOptimizer(optimizer)
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
    ]
    # Keras 3's compile has no experimental_run_tf_function (the notebook's TF 2.x setting)
    model.compile(
        optimizer=dist_optimizer,
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    with (
        converter_train.make_tf_dataset(
            transform_spec=transform_spec_fn,
            cur_shard=hvd.rank(),
            shard_count=hvd.size(),
            batch_size=BATCH_SIZE,
            workers_count=2,
        ) as train_dataset,
        converter_val.make_tf_dataset(
            transform_spec=transform_spec_fn,
            cur_shard=hvd.rank(),
            shard_count=hvd.size(),
            batch_size=BATCH_SIZE,
            workers_count=2,
        ) as val_dataset,
    ):
        element_spec = train_dataset.element_spec
        # tf.keras only accept tuples, not namedtuples
        train_dataset = train_dataset.map(lambda x: (x.features, x.label_index))
        steps_per_epoch = len(converter_train) // (BATCH_SIZE * hvd.size())
        val_dataset = val_dataset.map(lambda x: (x.features, x.label_index))
        validation_steps = max(1, len(converter_val) // (BATCH_SIZE * hvd.size()))
        hist = model.fit(
            train_dataset,
            steps_per_epoch=steps_per_epoch,
            epochs=NUM_EPOCHS,
            validation_data=val_dataset,
            validation_steps=validation_steps,
            callbacks=callbacks,
            verbose=2,
        )
    # the test's: the same shard again, each epoch's rows and features as they arrive
    epochs, features, labels = [], {}, {}
    with converter_train.make_tf_dataset(
        transform_spec=transform_spec_fn,
        cur_shard=hvd.rank(),
        shard_count=hvd.size(),
        batch_size=BATCH_SIZE,
        num_epochs=2,
        workers_count=2,
    ) as two_epochs:
        rows = [
            (int(i), f, label)
            for b in two_epochs
            for i, f, label in zip(*_tf_numpy(b), strict=True)
        ]
    per_epoch = len(converter_train) // hvd.size()
    for start in range(0, len(rows), per_epoch):
        epochs.append([i for i, _, _ in rows[start : start + per_epoch]])
    for i, f, label in rows[:per_epoch]:
        features[i], labels[i] = f, label
    report = {
        "epochs": epochs,
        "features": features,
        "labels": labels,
        "spec": (type(element_spec).__name__, element_spec._fields, _specs(element_spec)),
        "losses": hist.history["loss"],
        "val_loss": hist.history["val_loss"][-1],
    }
    return hvd.allgather_object(report)


def _tf_numpy(batch):
    return batch.id.numpy(), batch.features.numpy(), batch.label_index.numpy()


def _specs(element_spec):
    return [(s.dtype.name, tuple(s.shape)) for s in element_spec]


def test_databricks_tensorflow_flowers_notebook(spark, photos):
    pytest.importorskip("tensorflow")
    folder, jpegs = photos
    df = _flowers.flowers_frame(spark, folder).select("content", "label", "id")
    converter_train, converter_val = converters(df)

    hr = HorovodRunner(np=2)
    ranks = hr.run(
        tf_train_and_evaluate_hvd, converter_train=converter_train, converter_val=converter_val,
        lr=0.025,
    )  # fmt: skip

    assert len(ranks) == 2
    check_epochs(ranks, jpegs, lambda c: _flowers.mobilenet_scaled(c, IMG_SIZE), np.dtype(np.int32))
    for rank in ranks:
        assert rank["spec"] == (
            "inferred_schema_transformed_view",
            ("features", "label_index", "id"),
            [("float32", (None, *IMG_SHAPE)), ("int32", (None,)), ("int64", (None,))],
        )
        assert rank["losses"][-1] < rank["losses"][0], rank["losses"]
    converter_train.delete()
    converter_val.delete()
