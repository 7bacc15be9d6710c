"""What `hora run` runs on every rank: a Python script or module, or any command.

Python (`train.py`, `python train.py`, `-m package.module`) runs inside the worker's own
interpreter, the driver's: hora is importable there whatever `python` is first on PATH,
`hora.log_to_driver` and the timeline reach the driver, and a failure reports the user's own
traceback. Anything else (`./run.sh`, `--no-python cmd`, `python -c ...`) runs as a child of the
worker, in the worker's process group (stopping the job stops it too), with the worker's
environment (the rank contract) and its stdout/stderr (relayed live, marked with the rank).

`resolve` runs on the driver, so a typo is a usage error before anything starts; `run_program`
runs in each worker.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import re
import runpy
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from hora.engines.process import describe_exit

Kind = Literal["script", "module", "python", "command"]

# `python`, `python3`, `python3.11`: the words that mean "the Python", as torchrun reads them.
_PYTHON_WORD = re.compile(r"python(?:(\d+)(?:\.(\d+))?)?")
_SHOWN_CHARS = 200


class UsageError(ValueError):
    """`hora run` was asked for something that cannot run; found before anything is launched."""


class CommandFailed(Exception):
    """A rank's command exited non-zero or died by a signal; its output tail is its story."""


@dataclass(frozen=True)
class Program:
    """What every rank runs.

    `script`: a file (or a folder with `__main__.py`) run as `__main__`; `module`: a module run as
    `python -m` runs it; `python`: the worker's interpreter as a child, with `args` as its
    command line; `command`: `target` as a child.
    """

    kind: Kind
    target: str
    args: tuple[str, ...] = ()

    def argv(self) -> list[str]:
        """The child's command line (`python` and `command` kinds), evaluated on the worker."""
        if self.kind == "python":
            return [sys.executable, *self.args]
        return [self.target, *self.args]


# -- on the driver: what did the user ask for? -----------------------------------------------
def resolve(
    words: Sequence[str],
    *,
    module: Sequence[str] | None = None,
    no_python: bool = False,
    on_this_host: bool = True,
) -> Program:
    """The program for `hora run [-m module | --no-python] words...`; raises `UsageError`.

    `on_this_host` is False on Spark, where commands and modules are looked for on the
    executors: only what can be checked here is checked.
    """
    if module is not None:
        if no_python:
            raise UsageError("-m and --no-python exclude each other: a module is Python")
        if not module:
            raise UsageError("-m needs a module name, as in: hora run -np 2 -m package.module")
        return _module(module[0], module[1:], on_this_host)
    if not words:
        raise UsageError(
            "say what every rank runs: a script (train.py), python train.py, -m package.module, "
            "or any executable (./run.sh)"
        )
    first, rest = words[0], tuple(words[1:])
    if no_python:
        return _command(first, rest, on_this_host)
    if _is_this_python(first):
        return _python(rest, on_this_host)
    if first.endswith(".py") or os.path.isdir(first):
        return _script(first, rest)
    if os.path.isfile(first):
        return _file(first, rest)
    return _command(first, rest, on_this_host)


def _file(path: str, args: tuple[str, ...]) -> Program:
    """A file named without `.py`: run it if it is executable, else as Python if it reads so."""
    if os.access(path, os.X_OK):
        return Program("command", os.path.abspath(path), args)
    if not _python_source(path):
        raise UsageError(
            f"{path!r} is not executable: make it so (chmod +x {shlex.quote(path)}), or "
            f"name its interpreter (hora run -np N bash {shlex.quote(path)})"
        )
    return _script(path, args)  # python runs a file whatever its name


def _is_this_python(word: str) -> bool:
    """`python`/`python3`/`python3.X` (this version), or a path to this interpreter's folder."""
    match = _PYTHON_WORD.fullmatch(os.path.basename(word))
    if match is None:
        return False
    major, minor = match.groups()
    if major is not None and int(major) != sys.version_info.major:
        return False
    if minor is not None and int(minor) != sys.version_info.minor:
        return False
    if os.sep not in word:
        return True
    here = os.path.dirname(os.path.abspath(sys.executable))
    return os.path.dirname(os.path.abspath(word)) == here


def _python(args: tuple[str, ...], on_this_host: bool) -> Program:
    """`python [-u] script.py ...` and `python [-u] -m module ...` run in the worker itself."""
    if args[:1] == ("-u",):  # the workers' output is unbuffered anyway
        args = args[1:]
    if not args:
        raise UsageError(
            "python needs a script or -m module here (a rank has no terminal for a prompt)"
        )
    if args[0] == "-m":
        if len(args) < 2:
            raise UsageError("python -m needs a module name, as in: python -m package.module")
        return _module(args[1], args[2:], on_this_host)
    if args[0].startswith("-"):  # any other interpreter option: run exactly that, as a child
        return Program("python", "", args)
    return _script(args[0], args[1:])


def _script(path: str, args: tuple[str, ...]) -> Program:
    full = os.path.abspath(path)
    if os.path.isdir(full):
        if os.path.isfile(os.path.join(full, "__main__.py")):
            return Program("script", full, args)  # as `python folder/` runs it
        raise UsageError(
            f"{path!r} is a directory, not a script: name the script inside it "
            f"(hora run -np N {os.path.join(path, 'train.py')}), or give the folder a "
            "__main__.py to run it as python does"
        )
    if not os.path.isfile(full):
        raise UsageError(f"no such script: {path!r} (looked for {full})")
    return Program("script", full, args)


def check_script(path: str) -> str:
    """The script's absolute path; raises before launch if it cannot be run (TorchDistributor)."""
    full = os.path.abspath(path)
    if not os.path.isfile(full):
        raise FileNotFoundError(f"no such script: {path!r} (looked for {full})")
    return full


def _module(name: str, args: Sequence[str], on_this_host: bool) -> Program:
    if not all(part.isidentifier() for part in name.split(".")):
        raise UsageError(f"-m takes a module name (package.module), got {name!r}")
    top = name.split(".")[0]
    # Only the top-level package is looked for: finding `a.b` would import `a` on the driver.
    cwd = os.getcwd()
    found = (
        importlib.util.find_spec(top) is not None
        or importlib.machinery.PathFinder.find_spec(top, [cwd]) is not None
    )
    if on_this_host and not found:
        raise UsageError(f"no module named {top!r} (looked in {cwd} and on sys.path)")
    return Program("module", name, tuple(args))


def _command(word: str, args: tuple[str, ...], on_this_host: bool) -> Program:
    """An executable file (a path, or a file in this folder) or a command on PATH."""
    if os.sep in word or os.path.isfile(word):
        full = os.path.abspath(word)
        if os.path.isdir(full):
            return _script(word, args)  # the same message (or `__main__.py`) as for a script
        if os.path.isfile(full):
            if not os.access(full, os.X_OK):
                raise UsageError(f"{word!r} is not executable: chmod +x {shlex.quote(word)}")
            return Program("command", full, args)
        if on_this_host:
            raise UsageError(f"no such script or executable: {word!r} (looked for {full})")
        return Program("command", word, args)  # it may exist on the executors
    if shutil.which(word) is None and on_this_host:
        raise UsageError(
            f"no such script or command: {word!r} is neither a file in {os.getcwd()} nor a "
            "command on PATH"
        )
    return Program("command", word, args)


def _python_source(path: str) -> bool:
    """False for a file whose `#!` line names another interpreter (a shell script, say)."""
    try:
        with open(path, "rb") as f:
            first = f.readline(200)
    except OSError:
        return True  # let Python say what is wrong with it
    return not first.startswith(b"#!") or b"python" in first


# -- in the worker --------------------------------------------------------------------------
def run_program(program: Program) -> None:
    """Run `program` on this rank; a failing command raises `CommandFailed`."""
    if program.kind == "script":
        run_script(program.target, list(program.args))
    elif program.kind == "module":
        _run_module(program.target, list(program.args))
    else:
        _run_child(program.argv())


def run_script(path: str, argv: list[str]) -> None:
    """Execute `path` with `sys.argv = [path, *argv]` and its folder first on `sys.path`."""
    sys.argv = [path, *argv]
    sys.path.insert(0, path if os.path.isdir(path) else os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def _run_module(name: str, argv: list[str]) -> None:
    """As `python -m name argv...`: the current folder first on `sys.path`."""
    sys.argv = [name, *argv]  # runpy puts the module's file in sys.argv[0], as python -m does
    sys.path.insert(0, os.getcwd())
    runpy.run_module(name, run_name="__main__", alter_sys=True)


def _run_child(argv: list[str]) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        # Same stdout/stderr (the launcher relays them line by line), same environment, same
        # process group (the launcher signals the whole group).
        child = subprocess.Popen(argv, stdin=subprocess.DEVNULL)
    except OSError as exc:
        raise CommandFailed(f"cannot start {_shown(argv)}: {exc.strerror or exc}") from None
    code = child.wait()
    if code != 0:
        how = describe_exit(code)
        raise CommandFailed(f"the command {_shown(argv)} {'was ' if code < 0 else ''}{how}")


def _shown(argv: list[str]) -> str:
    text = shlex.join(argv)
    return text if len(text) <= _SHOWN_CHARS else text[: _SHOWN_CHARS - 3] + "..."
