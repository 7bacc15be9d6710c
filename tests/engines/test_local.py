"""The local launcher with real processes: results, the env contract, failures, timeouts, logs."""

from __future__ import annotations

import os
import pickle
import re
import socket
import threading
from pathlib import Path

import pytest

import hora
from hora import engines
from hora.engines import process
from tests import _workers
from tests.conftest import tagged_processes

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_run_returns_every_rank_in_order():
    assert hora.run(_workers.rank_times, (10,), np=3) == [0, 10, 20]


def test_runner_returns_rank_zero_and_is_horovod_runner():
    assert hora.HorovodRunner is hora.Runner
    assert hora.Runner(np=-2).run(_workers.rank_times, x=7) == 0


def test_env_contract_is_torchrun_and_horovod():
    envs = hora.run(_workers.env_contract, np=3, env={"USER_VAR": "mine", "OMP_NUM_THREADS": "5"})
    ports = {e["MASTER_PORT"] for e in envs}
    assert len(ports) == 1 and ports.pop().isdigit()
    for rank, env in enumerate(envs):
        assert env["RANK"] == env["HOROVOD_RANK"] == env["LOCAL_RANK"] == str(rank)
        assert env["HOROVOD_LOCAL_RANK"] == str(rank)
        assert env["WORLD_SIZE"] == env["HOROVOD_SIZE"] == env["LOCAL_WORLD_SIZE"] == "3"
        assert env["HOROVOD_LOCAL_SIZE"] == "3"
        assert env["GROUP_RANK"] == env["HOROVOD_CROSS_RANK"] == "0"
        assert env["HOROVOD_CROSS_SIZE"] == "1"
        assert env["LOCAL_SIZE"] == "3"  # the deepspeed launcher's names
        assert env["CROSS_RANK"] == "0" and env["CROSS_SIZE"] == "1"
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["USER_VAR"] == "mine"
        assert env["OMP_NUM_THREADS"] == "5"  # the user's env wins over the default


def test_threads_default_to_cores_per_local_rank():
    envs = hora.run(_workers.env_contract, np=2)
    expected = str(max(1, (os.cpu_count() or 1) // 2))
    assert [e["OMP_NUM_THREADS"] for e in envs] == [expected, expected]
    assert [e["OMP_WAIT_POLICY"] for e in envs] == ["PASSIVE", "PASSIVE"]
    mine = hora.run(_workers.env_contract, np=1, env={"OMP_WAIT_POLICY": "ACTIVE"})
    assert mine[0]["OMP_WAIT_POLICY"] == "ACTIVE"  # the user's choice wins


def test_init_process_group_needs_no_arguments():
    assert hora.run(_workers.gloo_allreduce, np=2) == [3.0, 3.0]


@pytest.mark.parametrize(
    ("how", "story"),
    [
        ("raise", "ValueError: deliberate failure"),
        ("exit", "exited with status 3"),
        ("sys.exit", "called sys.exit(4)"),
        ("sigkill", "killed by signal 9 (SIGKILL)"),
        ("segv", "killed by signal 11 (SIGSEGV)"),
    ],
)
def test_failing_rank_stops_the_others(how, story):
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.fail_on, (1, how), np=3, timeout=60)
    err = info.value
    message = str(err)
    assert message.startswith(f"rank 1 failed: {story}")
    assert "rank 1 about to fail" in message  # the last lines of its output
    assert err.rank == 1
    if how == "raise":
        assert 'raise ValueError("deliberate failure")' in message  # the worker's traceback
        assert "hora/rank/worker.py" not in message
    assert pickle.loads(pickle.dumps(err)).rank == 1


def test_root_cause_is_the_killed_rank_not_its_waiting_peer():
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.killed_while_peer_in_collective, np=2, timeout=60)
    assert str(info.value).startswith("rank 1 failed: killed by signal 9 (SIGKILL)")


def test_timeout_stops_a_hanging_job_even_if_it_ignores_sigterm():
    with pytest.raises(hora.RunTimeoutError) as info:
        hora.run(_workers.ignore_sigterm_and_hang, np=2, timeout=2)
    assert "timeout=2" in str(info.value)
    assert info.value.ranks == (0, 1)


def test_grandchildren_are_stopped_too():
    with pytest.raises(hora.RunTimeoutError):
        hora.run(_workers.spawn_grandchild_and_hang, np=2, timeout=3)


def test_start_timeout_names_the_ranks_that_did_not_start():
    env = {"PYTHONPATH": os.path.join(TESTS, "slow_start"), "HORA_TEST_SLOW_RANK": "1"}
    with pytest.raises(hora.RunTimeoutError) as info:
        hora.run(_workers.hang, np=3, env=env, start_timeout=8)
    assert info.value.ranks == (1,)
    assert "ranks 1 never connected" in str(info.value)


def test_unpicklable_closure_is_named_before_anything_starts():
    writer = threading.Lock()  # stands for a SummaryWriter, an open file, a client...

    def main():
        return writer.locked()

    with pytest.raises(hora.UnpicklableError) as info:
        hora.run(main, np=2)
    assert "variable 'writer' captured by main" in str(info.value)
    assert not tagged_processes()


def test_unpicklable_argument_is_named():
    with pytest.raises(hora.UnpicklableError, match="argument 'lock'"):
        hora.Runner(np=-2).run(_workers.rank_times, lock=threading.Lock())


def test_unpicklable_return_value_is_a_clear_failure():
    with pytest.raises(hora.WorkerFailedError, match="return value of rank 0 cannot be pickled"):
        hora.Runner(np=-2).run(_workers.return_unpicklable)


def test_sys_exit_zero_is_success():
    assert hora.run(_workers.exit_zero, np=2) == [None, None]


def test_logs_arrive_once_each_marked_with_rank(capfd):
    assert hora.run(_workers.chatter, (200,), np=2) == ["done", "done"]
    out, err = capfd.readouterr()
    for rank in (0, 1):
        for i in range(200):
            assert out.count(f"[{rank}] out {rank} {i}\n") == 1
            assert err.count(f"[{rank}] err {rank} {i}\n") == 1
        assert out.count(f"[{rank}] last words of {rank} without newline") == 1


def test_progress_bars_keep_their_rank_prefix(capfd, tmp_path):
    """Every redraw of a bar ("\\r") comes with its rank's prefix, as it happens, and no prefix
    stands alone; main printed "[0] " then the whole bar's history, unprefixed, at its end."""
    hora.run(_workers.progress_bars, (3,), np=2, output_filename=str(tmp_path))
    out, err = capfd.readouterr()
    for rank in (0, 1):
        bar = [d for d in re.split(r"[\r\n]", err) if f"bar {rank}" in d]
        assert len(bar) >= 4 and all(d.startswith(f"[{rank}] bar {rank}:") for d in bar), bar
        assert bar[-1].startswith(f"[{rank}] bar {rank}: 100%")
        steps = [d for d in re.split(r"[\r\n]", out) if f" {rank}." in d or f"done {rank}" in d]
        assert steps == [f"[{rank}] step {rank}.{i}" for i in range(3)] + [f"[{rank}] done {rank}"]
        with open(tmp_path / f"rank.{rank}" / "stdout", newline="") as f:  # as printed
            redraws = "".join(f"step {rank}.{i}\r" for i in range(3))
            assert f.read() == f"{redraws}done {rank}\n"
    pieces = re.split(r"[\r\n]", out + err)
    assert "[0]" not in [p.strip() for p in pieces] and "[1]" not in [p.strip() for p in pieces]


@pytest.mark.parametrize(
    ("data", "lines", "rest"),
    [
        (b"a\nb\r\nc", ["a", "b"], b"c"),
        (b"\r 0%\r50%\r100%\n", [" 0%\r", "50%\r", "100%"], b""),
        (b"x\r", [], b"x\r"),  # a "\n" may follow
        (b"\r\r\n", [""], b""),
    ],
)
def test_lines_end_at_newlines_and_carriage_returns(data, lines, rest):
    assert process.split_lines(data) == (lines, rest)


def test_log_callback_only_forwards_log_to_driver_alone(capfd):
    hora.Runner(np=-2, driver_log_verbosity="log_callback_only").run(_workers.log_and_print)
    out, _ = capfd.readouterr()
    assert "plain print" not in out
    assert "[0] callback message from 0" in out and "[1] callback message from 1" in out


def test_log_to_driver_prints_outside_a_worker(capsys):
    hora.log_to_driver("hello")
    assert capsys.readouterr().out == "hello\n"


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"np": 0}, "positive int"),
        ({"np": 2, "backend": "yarn"}, "backend must be"),
        ({"np": 2, "start_timeout": 0}, "start_timeout must be a positive"),
        ({"np": 2, "timeout": -1}, "timeout must be a positive"),
        ({"np": 2, "env": {"A": 1}}, "env must map str to str"),
        ({"np": 2, "driver_log_verbosity": "some"}, "driver_log_verbosity must be"),
    ],
)
def test_bad_settings_fail_before_launch(kwargs, match):
    with pytest.raises(ValueError, match=match):
        hora.run(_workers.rank_times, (1,), **kwargs)


def test_runner_np_zero_says_what_to_do():
    with pytest.raises(ValueError, match="np=-N"):
        hora.Runner(np=0)


def test_not_callable():
    with pytest.raises(TypeError, match="must be callable"):
        hora.run("main", np=2)  # type: ignore[arg-type]


def test_worker_atexit_handlers_run(tmp_path):
    hora.run(_workers.register_atexit, (str(tmp_path),), np=2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["atexit-0", "atexit-1"]


def test_workers_import_what_the_driver_put_on_sys_path(tmp_path, monkeypatch):
    (tmp_path / "driver_only_module.py").write_text("VALUE = 'found'\n")
    monkeypatch.syspath_prepend(str(tmp_path))  # as a notebook's sys.path.append(...) would
    assert hora.run(_workers.import_from_driver_path, np=2) == ["found", "found"]


def test_deepspeeds_shared_memory_of_a_run_is_removed_and_no_other(tmp_path):
    from hora._deepspeed_ops import remove_segments_left

    uid = os.getuid()
    ours = [tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_4242_{r}" for r in (0, 1)]
    theirs = tmp_path / f"deepspeed_allreduce_buffer_{uid}_127.0.0.1_42420_0"
    for path in [*ours, theirs]:
        path.write_bytes(b"x")
    remove_segments_left(("127.0.0.1", 4242), folder=str(tmp_path))
    assert [p.exists() for p in ours] == [False, False] and theirs.exists()


@pytest.mark.skipif(not os.path.isdir("/dev/shm"), reason="no /dev/shm")
def test_stopping_workers_removes_deepspeeds_shared_memory_of_their_rendezvous():
    """`engines.stop_all` removes what DeepSpeed's CPU collectives leave in /dev/shm, named after
    the workers' MASTER_ADDR and MASTER_PORT: every engine that runs a `WorkerProcess` gets it."""
    listener = socket.create_server(("127.0.0.1", 0))  # a driver that never answers
    port = listener.getsockname()[1]
    left = Path("/dev/shm") / f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_{port}_0"
    left.write_bytes(b"x")
    boot = engines.Boot(("127.0.0.1", port), os.urandom(32), 0, (), "")
    env = {**os.environ, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    try:
        worker = engines.WorkerProcess(boot, env, lambda *_: None, lambda _: None)
        assert left.exists() and worker.poll() is None
        engines.stop_all([worker], 1.0)
        assert not left.exists()
    finally:
        listener.close()
        left.unlink(missing_ok=True)
