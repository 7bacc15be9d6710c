"""A Jupyter notebook run by nbclient, as a user runs it: a model class and a training function
defined in cells, run by HorovodRunner(np=-2) and hora's TorchDistributor, then by pyspark's
TorchDistributor (local mode) as the reference. Every launcher pickles the notebook's class and
function by value; every rank must train alike under each."""

from __future__ import annotations

import os
import textwrap

import pytest

from tests.clients.conftest import with_repo_on_path

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")
pytest.importorskip("pyspark")

pytestmark = [pytest.mark.clients, pytest.mark.spark]  # the kernel starts Spark's JVM

CELLS = [
    """\
    import torch
    import torch.distributed as dist

    from hora import HorovodRunner
    from hora.spark import TorchDistributor


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = torch.nn.Linear(8, 2)

        def forward(self, x):
            return self.fc(x)


    def train(steps=3):
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        torch.manual_seed(0)
        model = torch.nn.parallel.DistributedDataParallel(Net())
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        g = torch.Generator().manual_seed(1 + dist.get_rank())
        losses = []
        for _ in range(steps):
            x, y = torch.randn(16, 8, generator=g), torch.randint(0, 2, (16,), generator=g)
            loss = torch.nn.functional.cross_entropy(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        weights = model.module.fc.weight.tolist()
        mine = {"rank": dist.get_rank(), "losses": losses, "weights": weights}
        every = [None] * dist.get_world_size()
        dist.all_gather_object(every, mine)
        dist.destroy_process_group()
        return every
    """,
    "by_horovod_runner = HorovodRunner(np=-2).run(train)",
    "by_torch_distributor = TorchDistributor(num_processes=2, use_gpu=False).run(train, 3)",
    """\
    from pyspark.ml.torch.distributor import TorchDistributor as PysparkTorchDistributor
    from pyspark.sql import SparkSession

    spark = (
        SparkSession.builder.master("local[1]")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.ui.enabled", "false")
        .getOrCreate()
    )
    by_pyspark = PysparkTorchDistributor(num_processes=2, local_mode=True, use_gpu=False).run(train)
    spark.stop()
    """,
    """\
    assert [r["rank"] for r in by_pyspark] == [0, 1]
    assert by_horovod_runner == by_pyspark, (by_horovod_runner, by_pyspark)
    assert by_torch_distributor == by_pyspark, (by_torch_distributor, by_pyspark)
    print("same as pyspark")
    """,
]


def test_notebook_cells_train_as_under_pyspark(tmp_path):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(textwrap.dedent(c)) for c in CELLS]
    client = nbclient.NotebookClient(
        notebook,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(tmp_path)}},
    )
    client.execute(env=with_repo_on_path(dict(os.environ)))
    last = notebook.cells[-1].outputs
    assert [o.get("text") for o in last] == ["same as pyspark\n"], last
