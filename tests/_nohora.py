"""A Python that has torch (the venv's) but cannot import hora: the executors' Python of a
cluster where nothing but torch was installed.

The venv has hora as an editable install (a finder on `sys.meta_path`) and the tests put the
worktree on PYTHONPATH; a `sitecustomize` that runs at every start-up of the wrapper's
interpreter drops both, so `import hora` fails there, and in every process it starts, unless a
shipped hora (a zip, or a folder that hora itself put first on PYTHONPATH) is on the path.
"""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

_SITECUSTOMIZE = """\
import os, sys
hidden = {hidden!r}
sys.meta_path[:] = [
    f for f in sys.meta_path if "__editable___hora" not in getattr(f, "__module__", "")
]
sys.path[:] = [p for p in sys.path if os.path.realpath(p or os.getcwd()) not in hidden]
"""


def hide_hora(folder: Path) -> str:
    """A folder whose `sitecustomize` hides hora: put it first on PYTHONPATH."""
    site = folder / "site"
    site.mkdir(parents=True, exist_ok=True)
    import hora  # where the tests' hora is: the worktree, on PYTHONPATH

    hidden = {os.path.realpath(os.path.dirname(os.path.dirname(hora.__file__)))}
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE.format(hidden=hidden))
    return str(site)


def make_python_without_hora(folder: Path) -> str:
    """An executable script that runs this interpreter without hora; checked."""
    site = hide_hora(folder)
    wrapper = folder / "python-without-hora"
    wrapper.write_text(
        "#!/bin/sh\n"  # in a folder of its own, as an executor: `-m` puts the folder first
        f'cd "{folder}" && PYTHONPATH="{site}${{PYTHONPATH:+:$PYTHONPATH}}" '
        f'exec "{sys.executable}" "$@"\n'
    )
    wrapper.chmod(wrapper.stat().st_mode | stat.S_IXUSR)
    found = subprocess.run(
        [str(wrapper), "-c", "import importlib.util as u; print(u.find_spec('hora'), end='')"],
        capture_output=True,
        text=True,
        check=True,
        cwd=folder,
    )
    assert found.stdout == "None", f"{wrapper} finds hora: {found.stdout}"
    torch = subprocess.run(
        [
            str(wrapper),
            "-c",
            "import importlib.util as u; print(bool(u.find_spec('torch')), end='')",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=folder,
    )
    assert torch.stdout == "True", "the Python without hora must have torch"
    return str(wrapper)
