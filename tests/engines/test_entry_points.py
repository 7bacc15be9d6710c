"""Engines that other distributions declare, in the `hora.engines` entry-point group: found by
`backend=` and `hora run --backend` with no import or `register()` in the user's program.

Each test writes real installed metadata (a `*.dist-info` folder with `METADATA` and
`entry_points.txt`) into a folder on a fresh interpreter's PYTHONPATH, so importlib.metadata
finds it as it finds any installed distribution; the toy engine it names is
tests/engines/_toy.py, written against `hora.engines` alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENTRY_POINTS = {
    "toy_hora_engine": ("1.0", {"toyep": "tests.engines._toy:entry_point_engine"}),
    "broken_hora_engine": (
        "0.3",
        {
            "broken": "no_such_module_hora:ENGINE",  # its module does not import
            "notengine": "os:sep",  # loads, to something that is no engine
            "local": "tests.engines._toy:TOY",  # hora's own engine's name
        },
    ),
}


def write_distributions(folder: Path) -> Path:
    """The installed metadata of ENTRY_POINTS' distributions, in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, (version, points) in ENTRY_POINTS.items():
        info = folder / f"{name}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {name.replace('_', '-')}\nVersion: {version}\n"
        )
        lines = [f"{point} = {value}" for point, value in points.items()]
        (info / "entry_points.txt").write_text("[hora.engines]\n" + "\n".join(lines) + "\n")
    return folder


@pytest.fixture
def installed(tmp_path: Path) -> dict[str, str]:
    """The environment of an interpreter that has the distributions installed."""
    site = write_distributions(tmp_path / "site")
    path = os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])
    return os.environ | {"PYTHONPATH": path.rstrip(os.pathsep)}


def python(env: dict[str, str], *args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=180
    )


def test_the_cli_lists_an_entry_points_engine_and_runs_a_script_on_it(installed, tmp_path):
    shown = python(installed, "-m", "hora", "run", "--help")
    assert shown.returncode == 0, shown.stderr
    text = " ".join(shown.stdout.split())  # argparse wraps its lines
    assert "toyep" in text and "toyep: a toy engine found by its entry point" in text
    assert "broken: cannot be used (--backend broken says why)" in text
    script = tmp_path / "train.py"
    script.write_text("import os\nprint(os.environ['TOY_ENGINE_SETUP'])\n")
    done = python(installed, "-m", "hora", "run", "-np", "2", "--backend", "toyep", str(script))
    assert done.returncode == 0, done.stderr
    assert "[0] rank 0 set up by the toy engine" in done.stdout, done.stdout
    assert "[1] rank 1 set up by the toy engine" in done.stdout, done.stdout


def test_backend_names_an_entry_points_engine_found_once_when_first_asked(installed):
    code = """
import importlib.metadata as metadata
calls = []
real = metadata.entry_points
metadata.entry_points = lambda **kw: calls.append(kw.get("group")) or real(**kw)
import hora
from hora import engines
from tests.engines._toy import what_the_rank_sees
assert "hora.engines" not in calls, calls  # importing hora reads no entry point
print(hora.run(what_the_rank_sees, np=2, backend="toyep"))
assert "toyep" in engines.names() and engines.names()[-1] == "local"
assert calls.count("hora.engines") == 1, calls  # read once, when first asked
"""
    done = python(installed, "-c", code)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "[('rank 0 set up by the toy engine', '2'), ('rank 1 set up by the toy engine', '2')]"
    )


def test_a_broken_entry_point_names_its_distribution_and_spoils_no_other_run(installed, tmp_path):
    script = tmp_path / "ok.py"
    script.write_text("print('ran')\n")
    refused = python(installed, "-m", "hora", "run", "-np", "2", "--backend", "broken", str(script))
    assert refused.returncode == 2
    assert refused.stderr.startswith(
        "hora: error: the engine entry point 'broken' (broken = 'no_such_module_hora:ENGINE' in "
        "the 'hora.engines' group of the distribution broken-hora-engine 0.3) cannot be used: "
        "ModuleNotFoundError: No module named 'no_such_module_hora'"
    ), refused.stderr
    code = """
from hora import engines
for name, why in sorted(engines.broken().items()):
    print(name, "|", why)
"""
    listed = python(installed, "-c", code)
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["broken", "local", "notengine"]
    assert "an engine named 'local' is registered already" in lines[1]
    assert "it loads to str, not a hora.engines.Engine" in lines[2]
    ran = python(installed, "-m", "hora", "run", "-np", "2", str(script))  # the local engine
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.count("ran") == 2
