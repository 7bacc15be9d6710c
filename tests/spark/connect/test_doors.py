"""Every Spark door of hora on real Spark Connect, on both kinds of Connect session:

- `remote-local`: `SparkSession.builder.remote("local[2]")` in the client's process (pyspark
  starts the server there);
- `separate-server`: a Connect server started here from the pyspark wheel over
  `local-cluster[2,1,1024]` on 127.0.0.1, and the client in another process on
  `sc://127.0.0.1:<port>`. That server ends a query's response stream after 5 s (2 min by
  default), so hora's stages, which last as long as the training, outlive their stream and the
  client reattaches to them, as a long training does on any server.

One client process per kind (`doors_client`) runs the checks, those of test_data.py and
test_estimator.py too (a session and its Python workers start once), and reports each; the
tests below judge one check each. A few run on one kind only, the kind that tells something
(`conftest.ONE_KIND_ONLY`: the DeepSpeed and MirroredStrategyRunner doors and the timeline on the
separate server, TorchDistributor's local mode on `remote("local[2]")`); their test on the other
kind is skipped, saying so. `hora run` runs in its own process.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.spark.connect.conftest import SCRIPT, client_env, require_spark_connect

require_spark_connect()
pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def client(doors_client):
    return doors_client


def test_the_connect_session_is_found_and_auto_picks_spark(client, url):
    found = client.value("session")
    assert found["kind"] == "connect"
    assert found["auto"] == "spark"
    # remote("local[2]") has a classic SparkContext in the process: it is the server's
    assert found["spark_context"] is False
    assert found["master"] == ("local[2]" if url == "local[2]" else "local-cluster[2,1,1024]")
    assert found["slots"] == 2
    assert found["channel_host"] == "127.0.0.1"
    assert found["channel_host_override"] == "localhost"  # HORA_DRIVER_HOST


def test_horovod_runner_runs_a_function_with_live_marked_logs(client):
    rank, pid, _host = client.value("runner")
    assert rank == 0 and pid > 0
    for rank in (0, 1):
        assert any(
            line.startswith(f"[{rank}@") and line.endswith(f"hello from rank {rank}")
            for line in client.output.splitlines()
        ), client.output[-3000:]


def test_hora_run_auto_from_another_thread_returns_every_rank(client):
    assert client.value("run_auto_from_a_thread") == [0, 10]


def _script_lines(output: str, door: str) -> list[str]:
    return sorted(line for line in output.splitlines() if line.endswith(f"--door {door}"))


def test_torch_distributor_runs_a_function_and_a_script_as_spark_tasks(client):
    assert client.value("torch_distributor") == 6.0  # (1 + 2) * 2.0
    assert client.value("torch_distributor_script") is None
    lines = _script_lines(client.output, "td-spark")
    assert [line.split("@")[0] for line in lines] == ["[0", "[1"], client.output[-3000:]
    assert all("script rank" in line and "of 2 sum 1 " in line for line in lines), lines


def test_torch_distributor_local_mode_runs_on_the_client(client):
    value, script = client.value("torch_distributor_local_mode")
    assert value == 3.0 and script is None
    lines = _script_lines(client.output, "td-local")
    assert [line.split("]")[0] for line in lines] == ["[0", "[1"]  # local ranks: no host


def test_deepspeed_distributor_runs_a_function_and_a_script(client):
    from_function, from_script = client.value("deepspeed")
    assert from_function == ["0", "2", True]
    assert from_script is None
    lines = _script_lines(client.output, "ds-spark --deepspeed")  # DeepSpeed's flag appended
    assert [line.split("@")[0] for line in lines] == ["[0", "[1"], client.output[-3000:]


def test_mirrored_strategy_runner_runs_a_function(client):
    if "mirrored" not in client.results and "mirrored" not in client.left_out:
        pytest.skip("TensorFlow is not installed")
    result = client.value("mirrored")
    assert result["value"] == result["expected"]


def test_hora_run_on_spark_records_the_ranks_collectives_in_the_timeline(client):
    result = client.value("timeline")
    assert result["values"] == [[3.0, 3.0], [3.0, 3.0]]
    assert "allreduce.connect.probe" in result["trace"]
    assert '"name":"rank 1"' in result["trace"]


def test_a_failing_rank_gives_its_story(client):
    failed = client.error("failing_rank")
    assert failed["error"] == "WorkerFailedError"
    message = failed["message"]
    assert message.startswith("rank 1 failed: RuntimeError: deliberate failure on rank 1")
    assert "fail_after_peer_started" in message  # the rank's own traceback


def test_max_restarts_survives_a_killed_rank(client):
    assert client.value("restart_after_a_killed_rank") == [1, 1]
    assert "hora: attempt 1 of 2 failed: rank 1 failed: killed by signal 9" in client.output


def test_too_many_ranks_are_refused_before_a_stage_starts(client):
    refused = client.error("too_many_ranks")
    assert refused["error"] == "ValueError"
    assert "np=3 needs 3 Spark task slots" in refused["message"]
    assert "Lower np to 2" in refused["message"]


def test_the_stage_is_cancelled_by_its_tag_from_another_thread(client):
    result = client.value("cancel_by_tag")
    assert result["dialled"] == 4  # each task probed the driver, then dialled it
    assert "OPERATION_CANCELED" in result["ended"]
    assert result["alive"] is False
    assert result["after"] == 3  # the session runs queries after the cancel


def test_hora_run_command_line_runs_a_script(url, tmp_path):
    """`hora run --backend spark --remote URL` (remote-local), and SPARK_REMOTE (server)."""
    command = [sys.executable, "-m", "hora", "run", "--backend", "spark", "-np", "2"]
    env = client_env()
    if url.startswith("local"):
        command += ["--remote", url]
    else:
        env["SPARK_REMOTE"] = url
    command += [str(SCRIPT), "--door", "cli"]
    done = subprocess.run(
        command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    lines = _script_lines(done.stdout, "cli")
    assert [line.split("@")[0] for line in lines] == ["[0", "[1"], done.stdout[-2000:]
