"""`hora run -np N script.py`: exit status and the story of a failure on stderr."""

from __future__ import annotations

import subprocess
import sys

SCRIPT = """
import os, sys
print("rank", os.environ["RANK"], "of", os.environ["WORLD_SIZE"], "args", sys.argv[1:])
if "--fail" in sys.argv and os.environ["RANK"] == "1":
    raise RuntimeError("script failed on purpose")
"""


def _hora(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hora", *args], capture_output=True, text=True, timeout=120, cwd=cwd
    )


def test_script_runs_on_every_rank_with_its_arguments(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    done = _hora("run", "-np", "2", str(script), "--lr", "0.1")
    assert done.returncode == 0, done.stderr
    assert "[0] rank 0 of 2 args ['--lr', '0.1']" in done.stdout
    assert "[1] rank 1 of 2 args ['--lr', '0.1']" in done.stdout


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


def test_usage_errors_exit_2_before_anything_runs(tmp_path):
    missing = _hora("run", "-np", "2", str(tmp_path / "missing.py"))
    assert missing.returncode == 2 and "no such script" in missing.stderr
    script = tmp_path / "ok.py"
    script.write_text("")
    assert _hora("run", "-np", "0", str(script)).returncode == 2
