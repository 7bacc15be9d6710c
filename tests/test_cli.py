"""`hora run`: every form of program, exit statuses and the story of a failure on stderr.

Each launch is a real `python -m hora` with real workers; usage errors call `main()` in this
process, since they must be refused before anything is launched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

import hora
from hora.cli import main
from hora.environment.build import threads_per_rank
from tests import _workers
from tests.conftest import wait_for_no_processes

SCRIPT = """
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", sys.argv[1:])
if "--fail" in sys.argv and os.environ["RANK"] == "1":
    raise RuntimeError("script failed on purpose")
"""

CONTRACT = tuple(name for name in _workers.CONTRACT if name != "USER_VAR")  # the rank contract

# Prints the contract as NAME=value lines, its arguments one per line, and a line on stderr.
SHELL_SCRIPT = f"""#!/bin/sh
for name in {" ".join(CONTRACT)}; do echo "$name=$(printenv $name)"; done
for arg in "$@"; do echo "arg:$arg"; done
echo "to stderr from $RANK" >&2
"""


def _hora(*args: str, cwd=None, env=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hora", *args],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=cwd,
        env=env,
    )


def _executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def _rank_lines(stdout: str, rank: int) -> list[str]:
    marker = f"[{rank}] "
    return [line[len(marker) :] for line in stdout.splitlines() if line.startswith(marker)]


def test_script_runs_on_every_rank_with_its_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    # after the program, even --version is the program's (not hora's own --version)
    done = _hora("run", "-np", "2", str(script), "--lr", "0.1", "--version")
    assert done.returncode == 0, done.stderr
    assert "[0] rank 0 of 2 args ['--lr', '0.1', '--version']" in done.stdout
    assert "[1] rank 1 of 2 args ['--lr', '0.1', '--version']" in done.stdout


@pytest.mark.parametrize(
    "args", [["--version"], ["run", "--version"], ["run", "-np", "2", "--version"]]
)
def test_version_is_the_installed_distributions(args):
    # the `hora` command pip installed next to this interpreter, as a user types it
    command = Path(sys.executable).parent / "hora"
    assert command.is_file(), f"no {command}: hora is not installed in this environment"
    done = subprocess.run(
        [str(command), *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout == f"hora {metadata.version('hora')}\n"
    assert metadata.version("hora") == hora.__version__  # pyproject's and the package's agree


def test_failure_exits_non_zero_with_the_root_cause_on_stderr(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = _hora("run", "-np", "2", str(script), "--fail")
    assert done.returncode == 1
    assert "rank 1 failed: RuntimeError: script failed on purpose" in done.stderr
    assert f'File "{script}", line 5' in done.stderr


def test_timeout_exits_124(tmp_path):
    script = tmp_path / "hang.py"
    script.write_text("import time\ntime.sleep(3600)\n")
    done = _hora("run", "-np", "2", "--timeout", "2", str(script))
    assert done.returncode == 124
    assert "timeout=2" in done.stderr


def test_shell_script_sees_the_contract_and_its_output_is_relayed_and_written(tmp_path):
    script = _executable(tmp_path / "run.sh", SHELL_SCRIPT)
    out = tmp_path / "logs"
    done = _hora("run", "-np", "2", "--output-filename", str(out), str(script), "a", "b c")
    assert done.returncode == 0, done.stderr
    threads = os.environ.get("OMP_NUM_THREADS") or str(threads_per_rank(2))
    ports = set()
    for rank in (0, 1):
        lines = _rank_lines(done.stdout, rank)
        seen = dict(line.split("=", 1) for line in lines if "=" in line)
        ports.add(seen.pop("MASTER_PORT"))
        r = str(rank)
        assert seen == {
            "RANK": r,
            "WORLD_SIZE": "2",
            "LOCAL_RANK": r,
            "LOCAL_WORLD_SIZE": "2",
            "GROUP_RANK": "0",
            "MASTER_ADDR": "127.0.0.1",
            "HOROVOD_RANK": r,
            "HOROVOD_SIZE": "2",
            "HOROVOD_LOCAL_RANK": r,
            "HOROVOD_LOCAL_SIZE": "2",
            "HOROVOD_CROSS_RANK": "0",
            "HOROVOD_CROSS_SIZE": "1",
            "LOCAL_SIZE": "2",
            "CROSS_RANK": "0",
            "CROSS_SIZE": "1",
            "OMP_NUM_THREADS": threads,
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"),
        }
        assert [line for line in lines if line.startswith("arg:")] == ["arg:a", "arg:b c"]
        assert f"[{rank}] to stderr from {rank}" in done.stderr
        # horovodrun's layout; the files hold the lines as the rank printed them
        assert (out / f"rank.{rank}" / "stdout").read_text().splitlines() == lines
        assert (out / f"rank.{rank}" / "stderr").read_text() == f"to stderr from {rank}\n"
    assert len(ports) == 1 and ports.pop().isdigit()


def test_python_script_runs_in_the_workers_interpreter_and_records_the_timeline(tmp_path):
    train = tmp_path / "train.py"
    train.write_text(
        "import sys, torch\n"
        "import hora.torch as hvd\n"
        "hvd.init()\n"
        "total = hvd.allreduce(torch.ones(2), name='grad', op=hvd.Sum)\n"
        "print('rank', hvd.rank(), total.tolist(), sys.argv[1:], sys.executable)\n"
    )
    trace = tmp_path / "trace.json"
    done = _hora(
        "run", "-np", "2", "--timeline-filename", str(trace), "python", str(train), "--lr", "1"
    )
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[{rank}] rank {rank} [2.0, 2.0] ['--lr', '1'] {sys.executable}" in done.stdout
    events = json.loads(trace.read_text())
    ranks = {e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert ranks == {"rank 0", "rank 1"}
    allreduces = [e for e in events if e["name"] == "ALLREDUCE" and e["ph"] == "B"]
    assert sorted(e["pid"] for e in allreduces) == [0, 1]
    assert {e["args"]["tensor"] for e in allreduces} == {"allreduce.grad"}


def test_module_runs_as_python_m_with_the_current_folder_first(tmp_path):
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "tool.py").write_text(
        "import os, sys\nprint(__name__, os.environ['RANK'], sys.argv, sys.path[0])\n"
    )
    done = _hora("run", "-np", "2", "-m", "app.tool", "--flag", "x", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    argv = [str(package / "tool.py"), "--flag", "x"]
    for rank in (0, 1):
        assert f"[{rank}] __main__ {rank} {argv} {tmp_path}" in done.stdout


def test_folder_with_main_runs_as_python_runs_it(tmp_path):
    folder = tmp_path / "app"
    folder.mkdir()
    (folder / "__main__.py").write_text("import os, sys\nprint('main', os.environ['RANK'])\n")
    done = _hora("run", "-np", "2", str(folder))
    assert done.returncode == 0, done.stderr
    assert "[0] main 0" in done.stdout and "[1] main 1" in done.stdout


def test_failing_command_is_the_ranks_failure_and_stops_the_others(tmp_path):
    # rank 0 would sleep for an hour, with a grandchild: both must be stopped with the job
    command = 'echo "up $RANK"; [ "$RANK" = 1 ] && exit 3; sleep 3600 & sleep 3600'
    done = _hora("run", "-np", "2", "--no-python", "sh", "-c", command)
    assert done.returncode == 1, done.stderr
    assert "[0] up 0" in done.stdout
    story = done.stderr
    assert "rank 1 failed: the command sh -c " in story
    assert "exited with status 3" in story
    assert "last 1 lines of rank 1's output:\n  | up 1" in story
    assert "Traceback" not in story  # hora's own frames are not the story


def test_command_killed_by_a_signal(tmp_path):
    script = _executable(
        tmp_path / "die.sh",
        '#!/bin/sh\necho "dying $RANK"\n[ "$RANK" = 1 ] && kill -KILL $$\nsleep 3600\n',
    )
    done = _hora("run", "-np", "2", str(script))
    assert done.returncode == 1, done.stderr
    assert f"rank 1 failed: the command {script} was killed by signal 9 (SIGKILL)" in done.stderr
    assert "  | dying 1" in done.stderr


def _start_until_up(*args: str) -> subprocess.Popen:
    """`hora run -np 2 ...` in the background, returned once both ranks printed "up <rank>"."""
    driver = subprocess.Popen(
        [sys.executable, "-m", "hora", "run", "-np", "2", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert driver.stdout is not None
    try:
        seen = {driver.stdout.readline().strip() for _ in range(2)}
        assert seen == {"[0] up 0", "[1] up 1"}
    except BaseException:
        _kill(driver)
        raise
    return driver


def _kill(driver: subprocess.Popen) -> None:
    driver.kill()
    driver.communicate()  # reaps it and closes its pipes


def test_killing_the_driver_stops_every_command(tmp_path):
    command = 'echo "up $RANK"; sleep 3600 & sleep 3600'
    _kill(_start_until_up("--no-python", "sh", "-c", command))
    # the workers see their channel close and kill their process groups: shells and sleeps
    assert wait_for_no_processes() == []


# Saves a checkpoint on SIGTERM and exits, as a preemptible job's script does.
CHECKPOINT_ON_SIGTERM = """
import os, signal, sys, time
def save(signum, frame):
    with open(os.path.join(sys.argv[1], "saved." + os.environ["RANK"]), "w") as f:
        f.write("step 7")
    sys.exit(0)
signal.signal(signal.SIGTERM, save)
print("up", os.environ["RANK"], flush=True)
time.sleep(3600)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_to_the_driver_reaches_every_rank_first(tmp_path, sig):
    """A scheduler stops `hora run` with SIGTERM (a closed terminal sends SIGHUP): every rank
    gets SIGTERM, its handler saves a checkpoint, and only then is anything killed."""
    script = tmp_path / "train.py"
    script.write_text(CHECKPOINT_ON_SIGTERM)
    driver = _start_until_up(str(script), str(tmp_path))
    driver.send_signal(sig)
    try:
        _, stderr = driver.communicate(timeout=60)
    except BaseException:
        _kill(driver)
        raise
    name = signal.Signals(sig).name
    assert driver.returncode == 128 + sig, stderr
    assert f"hora: stopped by {name}; every worker was stopped" in stderr
    assert sorted(p.name for p in tmp_path.glob("saved.*")) == ["saved.0", "saved.1"]
    assert (tmp_path / "saved.1").read_text() == "step 7"
    assert wait_for_no_processes() == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-H", "host1:2,host2:2", "train.py"], "-H is not supported: hora does not log into"),
        (["--hosts", "h:1", "train.py"], "--backend spark"),
        (["--hostfile", "hosts.txt", "train.py"], "--hostfile is not supported"),
        (["app"], "'app' is a directory, not a script"),
        (["missing.py"], "no such script: 'missing.py'"),
        (["nosuchcommand-hora"], "neither a file in"),
        (["./missing"], "no such script or executable: './missing'"),
        (["plain.sh"], "'plain.sh' is not executable: make it so (chmod +x plain.sh)"),
        (["--no-python", "plain.sh"], "'plain.sh' is not executable"),
        (["-m", "no_such_module_hora"], "no module named 'no_such_module_hora'"),
        (["--no-python", "-m", "app"], "-m and --no-python exclude each other"),
        (["-m"], "-m needs a module name"),
        (["python"], "python needs a script or -m module"),
        ([], "say what every rank runs"),
        (["--output-filename", "plain.sh", "ok.py"], "it must be a folder"),
        (["--timeline-filename", "nowhere/t.json", "ok.py"], "does not exist"),
    ],
)
def test_bad_input_exits_2_before_anything_starts(tmp_path, monkeypatch, capsys, args, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "app").mkdir()
    (tmp_path / "ok.py").write_text("")
    (tmp_path / "plain.sh").write_text("#!/bin/sh\necho hi\n")
    # a second --output-filename in `args` wins
    assert main(["run", "-np", "2", "--output-filename", "out", *args]) == 2
    assert not (tmp_path / "out").exists()  # nothing was started, nothing written
    err = capsys.readouterr().err
    assert message in err
    assert err.startswith("hora: error: ")


def test_np_must_be_positive(tmp_path, capsys):
    script = tmp_path / "ok.py"
    script.write_text("")
    assert main(["run", "-np", "0", str(script)]) == 2
    assert "positive int" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:  # argparse: -np is required
        main(["run", str(script)])
    assert exited.value.code == 2


@pytest.mark.spark
def test_backend_spark_runs_a_command_in_every_task(tmp_path):
    pytest.importorskip("pyspark", reason="pyspark is not installed")
    if not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        pytest.skip("Java is not installed: Spark cannot start")
    script = _executable(tmp_path / "run.sh", SHELL_SCRIPT)
    env = os.environ | {
        "PYSPARK_PYTHON": sys.executable,
        "PYSPARK_SUBMIT_ARGS": "--master local[2] --conf spark.ui.enabled=false "
        "--conf spark.ui.showConsoleProgress=false pyspark-shell",
    }
    done = _hora("run", "-np", "2", "--backend", "spark", str(script), "x", env=env)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        lines = [line.split("] ", 1)[1] for line in done.stdout.splitlines() if f"[{rank}@" in line]
        assert f"RANK={rank}" in lines and "HOROVOD_SIZE=2" in lines and "arg:x" in lines
    # the CLI stopped its SparkSession: its JVM, Spark's Python daemons and the ranks are gone
    assert wait_for_no_processes(timeout=30) == []
