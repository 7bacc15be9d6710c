"""Which Spark task runs which rank: the first world numbered host by host, each rank with the
GPUs `task_gpu_counts` leaves it."""

from __future__ import annotations

from hora.engines.spark.task_ranks import TaskRanks


def _reports() -> TaskRanks:
    return TaskRanks(
        {
            0: {"host": "b", "gpus": [0, 1]},
            1: {"host": "a", "gpus": [2, 3]},
            2: {"host": "b", "gpus": [4, 5]},
        }
    )


def test_the_first_world_is_numbered_host_by_host() -> None:
    ranks, order = _reports().start([0, 1, 2])
    assert order == [0, 2, 1]
    assert [r["gpus"] for r in ranks] == [[0, 1], [4, 5], [2, 3]]


def test_each_rank_keeps_the_first_gpus_its_task_s_count_leaves_it() -> None:
    ranks, order = _reports().start([0, 1, 2], gpu_counts=[1, 0, 2])
    assert order == [0, 2, 1]
    assert [r["gpus"] for r in ranks] == [[0], [4, 5], []]
