"""min_np/max_np at every door, checked before anything starts."""

from __future__ import annotations

import pytest

import hora
from hora import cli
from hora.config import ELASTIC_MAX_RESTARTS, RunConfig
from hora.spark import DeepspeedTorchDistributor, MirroredStrategyRunner, TorchDistributor

BAD = [
    ({"min_np": 3, "max_np": 2}, "min_np <= np <= max_np, got min_np=3, np=2, max_np=2"),
    ({"min_np": 0}, "min_np must be an int >= 1, got min_np=0"),
    ({"max_np": 1}, "min_np <= np <= max_np, got min_np=2, np=2, max_np=1"),
    ({"min_np": 1.5}, "min_np must be an int >= 1"),
    ({"max_np": True}, "max_np must be an int >= 1"),
]


def never_runs() -> None:
    raise AssertionError("nothing may start")


@pytest.mark.parametrize(("bad", "message"), BAD)
def test_bad_values_are_a_value_error_at_every_door_before_launch(bad, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        hora.Runner(np=-2, **bad)
    with pytest.raises(ValueError, match=message):
        hora.run(never_runs, np=2, backend="local", **bad)
    with pytest.raises(ValueError, match=message):
        TorchDistributor(num_processes=2, use_gpu=False, **bad)


def test_doors_that_cannot_resize_refuse_an_elastic_run():
    with pytest.raises(ValueError, match="DeepspeedTorchDistributor cannot run an elastic job"):
        DeepspeedTorchDistributor(numGpus=2, useGpu=False, min_np=1)
    with pytest.raises(ValueError, match="MirroredStrategyRunner cannot run an elastic job"):
        MirroredStrategyRunner(num_slots=2, use_gpu=False, max_np=3)


def test_defaults_follow_horovodrun_and_an_elastic_run_gets_restarts():
    assert (RunConfig(np=4, min_np=2).max_np, RunConfig(np=4, max_np=8).min_np) == (4, 4)
    assert RunConfig(np=4, min_np=2).max_restarts == ELASTIC_MAX_RESTARTS
    assert RunConfig(np=4, min_np=2, max_restarts=1).max_restarts == 1
    fixed = RunConfig(np=4)
    assert (fixed.elastic, fixed.max_restarts, fixed.min_np, fixed.max_np) == (False, 0, None, None)


def test_the_fewest_and_most_ranks_of_a_run_are_its_bounds():
    """What the driver sizes attempts by and shrinks in place to: min_np..max_np where the run
    is elastic (the one default: np), np..np where it is not."""
    configs = [RunConfig(np=4, min_np=2), RunConfig(np=4, max_np=8), RunConfig(np=4)]
    assert [(c.fewest_ranks, c.most_ranks) for c in configs] == [(2, 4), (4, 8), (4, 4)]


def test_the_command_line_takes_horovods_flags_and_refuses_bad_ones(capsys):
    status = cli.main(["run", "-np", "2", "--min-np", "3", "--max-np", "4", "python", "-c", "1"])
    assert status == cli.EXIT_USAGE
    assert "min_np <= np <= max_np, got min_np=3, np=2, max_np=4" in capsys.readouterr().err
    parsed = cli._parser().parse_args(
        ["run", "-np", "2", "--min-num-proc", "1", "--max-num-proc", "4", "train.py"]
    )
    assert (parsed.min_np, parsed.max_np, parsed.max_restarts) == (1, 4, None)
