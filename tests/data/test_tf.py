"""`dataset.tf_dataset` in two ranks: the loader's shares as a tf.data.Dataset, each row once per
epoch, a new order each epoch."""

from __future__ import annotations

import itertools

import pytest

import hora
from tests.data import _jobs
from tests.data._parquet import write_ids

pytestmark = pytest.mark.tensorflow

pytest.importorskip("tensorflow", reason="tensorflow is not installed")


def test_tf_dataset_gives_each_rank_its_share(tmp_path):
    dataset = write_ids(tmp_path, files=2, rows=50, group=16)
    ranks = hora.run(_jobs.tf_ids, (dataset, 2), np=2)
    for epoch in range(2):
        assert sorted(itertools.chain(*(r[epoch] for r in ranks))) == list(range(100))
    assert ranks[0][0] != ranks[0][1]
