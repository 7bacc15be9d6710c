"""What of the driver's code goes to a cluster's ranks: hora itself, and the user's own modules.

A cluster's nodes need only torch (and Python, cloudpickle) as the driver has them: hora is pure
Python, so it ships itself, as a zip (Spark: the session's Python files or Connect artifacts;
Ray: a `py_modules` of the actors' runtime_env), and the ranks import it from there. A module of
the user's (a `mymodels.py` beside the notebook: a file outside the interpreter's library and
site-packages) is pickled by value with the job, so `from mymodels import Net` in a cell does
not fail on the executors with `ModuleNotFoundError`.

`ship_code` (RunConfig, the doors) or `HORA_SHIP_CODE` says when: "auto" (the default) ships where
the ranks may lack the driver's code (a cluster engine, a Spark executor Python that Spark
chooses), True always, False never (hora and the user's modules must then be installed on every
node).
"""

from __future__ import annotations

import functools
import hashlib
import os
import site
import sys
import sysconfig
import tempfile
import threading
import types
import zipfile

ENV_VAR = "HORA_SHIP_CODE"
#: ship_code's values: None is "auto"
ShipCode = bool | None

_HORA_DIR = os.path.dirname(os.path.abspath(__file__))
_LOCK = threading.Lock()
_ZIPS: dict[str, str] = {}  # content hash -> the zip built for it in this process


def setting(ship_code: ShipCode) -> ShipCode:
    """`ship_code` as given, else `HORA_SHIP_CODE` ("auto", "1"/"true", "0"/"false")."""
    if ship_code is not None:
        if not isinstance(ship_code, bool):
            raise ValueError(f"ship_code must be True, False or None (auto), got {ship_code!r}")
        return ship_code
    value = os.environ.get(ENV_VAR, "auto").strip().lower()
    if value in ("", "auto"):
        return None
    if value in ("1", "true", "yes", "on"):
        return True
    if value in ("0", "false", "no", "off"):
        return False
    raise ValueError(f"{ENV_VAR}={value!r}: use auto, 1 (always ship) or 0 (never)")


def ships(ship_code: ShipCode, needed: bool) -> bool:
    """Whether to ship, `needed` being auto's answer (whether the ranks may lack the code)."""
    chosen = setting(ship_code)
    return needed if chosen is None else chosen


@functools.cache
def _library_dirs() -> tuple[str, ...]:
    paths = {
        sysconfig.get_paths().get(key) for key in ("stdlib", "platstdlib", "purelib", "platlib")
    }
    paths.update(site.getsitepackages() if hasattr(site, "getsitepackages") else [])
    paths.add(site.getusersitepackages() if hasattr(site, "getusersitepackages") else None)
    paths.update((sys.prefix, sys.base_prefix, sys.exec_prefix))
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def is_users_module(module: types.ModuleType) -> bool:
    """A module of the user's own: a file outside the interpreter's library, site-packages and
    hora (an installed package is the cluster's to have; `__main__` is pickled by value anyway)."""
    name = getattr(module, "__name__", "")
    path = getattr(module, "__file__", None)
    if not path or name in ("__main__", "__mp_main__") or name.split(".")[0] == "hora":
        return False
    real = os.path.realpath(path)
    return not real.startswith(_library_dirs())


def hora_zip() -> str:
    """A zip of this hora (`hora-<hash>.zip`, the hash of its files: another build is another
    name, so a Spark session never mixes two), built once per process."""
    files = sorted(_hora_files())
    digest = hashlib.sha256()
    for path in files:
        digest.update(os.path.relpath(path, _HORA_DIR).encode())
        with open(path, "rb") as f:
            digest.update(f.read())
    key = digest.hexdigest()[:16]
    with _LOCK:
        if key in _ZIPS and os.path.exists(_ZIPS[key]):
            return _ZIPS[key]
        folder = tempfile.mkdtemp(prefix="hora-ship-")
        path = os.path.join(folder, f"hora-{key}.zip")
        with zipfile.ZipFile(path + ".part", "w", zipfile.ZIP_DEFLATED) as zf:
            for name in files:
                zf.write(name, os.path.join("hora", os.path.relpath(name, _HORA_DIR)))
        os.replace(path + ".part", path)
        _ZIPS[key] = path
        return path


def hora_package_dir() -> str:
    """The folder of the hora package this driver runs (Ray's `py_modules` takes it)."""
    return _HORA_DIR


def _hora_files() -> list[str]:
    found = []
    for root, dirs, names in os.walk(_HORA_DIR):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        found += [os.path.join(root, n) for n in names if n.endswith((".py", ".typed"))]
    return found


def rank_pythonpath(env: dict[str, str]) -> dict[str, str]:
    """A rank's environment with this hora first on PYTHONPATH, unless it is installed in the
    interpreter's site-packages: a shipped hora (a zip on a Spark task's sys.path, a Ray
    `py_modules` folder) is not where the rank's fresh interpreter would look by itself."""
    root = os.path.dirname(_HORA_DIR)
    if (os.path.realpath(root) + os.sep).startswith(_library_dirs()):
        return env
    rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    env["PYTHONPATH"] = os.pathsep.join([root, *rest])
    return env
