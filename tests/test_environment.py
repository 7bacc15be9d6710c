"""The rank contract read back: `environment.current()` is the one reader of what launchers set."""

from __future__ import annotations

import pytest

from hora import environment, placement
from hora.environment import build


def test_what_hora_writes_reads_back_whole() -> None:
    place = placement.placements(["a", "b", "a", "b"])[2]
    env = build.worker_env(place, "10.0.0.1", 29500, base={})
    env |= build.restart_env(1, 3)
    here = environment.current(env)
    assert here.placement == place
    assert (here.rank, here.size) == (2, 4)
    assert (here.master_addr, here.master_port) == ("10.0.0.1", 29500)
    assert (here.attempt, here.max_restarts) == (1, 3)


def test_torchrun_and_horovodrun_names_are_read_too() -> None:
    torchrun = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "h", "MASTER_PORT": "1"}
    torchrun |= {"TORCHELASTIC_RESTART_COUNT": "2", "TORCHELASTIC_MAX_RESTARTS": "5"}
    here = environment.current(torchrun)
    assert (here.rank, here.size, here.attempt, here.max_restarts) == (1, 2, 2, 5)
    assert here.placement is None  # torchrun gave no local/cross coordinates here
    horovodrun = {"HOROVOD_RANK": "3", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "1"}
    horovodrun |= {"HOROVOD_LOCAL_SIZE": "2", "HOROVOD_CROSS_RANK": "1", "HOROVOD_CROSS_SIZE": "2"}
    assert environment.current(horovodrun).placement == placement.RankPlacement(3, 4, 1, 2, 1, 2)


def test_a_plain_process_is_nobody_in_particular() -> None:
    here = environment.current({})
    assert (here.rank, here.size, here.placement, here.master_addr) == (None, None, None, None)
    assert (here.attempt, here.max_restarts) == (0, None)


def test_a_garbled_value_names_the_variable() -> None:
    with pytest.raises(ValueError, match="RANK='one' is not an integer"):
        environment.current({"RANK": "one"})


def test_torchrun_per_task_changes_torchrun_s_names_only() -> None:
    """A rank of TorchDistributor on Spark sees torchrun's names as pyspark's one-process
    torchrun of its task gives them; hora reads its own per-host place all the same."""
    place = placement.placements(["a", "b", "a", "b"])[2]  # the second rank of host a
    env = build.worker_env(place, "10.0.0.1", 29500, base={"CUDA_VISIBLE_DEVICES": "4,6"})
    assert environment.task_view(env) == {}  # unmarked: per host, as horovodrun
    env[environment.PER_TASK_VAR] = "1"
    env |= environment.task_view(env)
    assert (env["RANK"], env["WORLD_SIZE"]) == ("2", "4")
    assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == ("0", "1")
    assert env["GROUP_RANK"] == env["NODE_RANK"] == "2" and env["GROUP_WORLD_SIZE"] == "4"
    assert env["CUDA_VISIBLE_DEVICES"] == "6"  # its own GPU, cuda:0 as LOCAL_RANK says
    assert environment.current(env).placement == place


def test_every_run_looks_launched_by_torchrun() -> None:
    run = build.run_env("abc", elastic=False)
    assert run["TORCHELASTIC_RUN_ID"] == run["HORA_RUN_ID"] == "abc"
