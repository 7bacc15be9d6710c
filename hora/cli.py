"""`hora run -np N ...`: horovodrun's and torchrun's command line, as a thin adapter over run().

    hora run -np 2 train.py --lr 0.1          a Python script
    hora run -np 2 python train.py --lr 0.1   the same, horovodrun's way
    hora run -np 2 -m package.module ...      a module, as `python -m` runs it
    hora run -np 2 ./run.sh ...               any executable, as a child of each rank
    hora run -np 2 --no-python cmd ...        any command, taken literally (torchrun's flag)

`hora timeline summary trace.json` prints where a recorded timeline's time went.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from types import FrameType
from typing import Any

from hora import engines
from hora._script import Program, UsageError, resolve, run_program
from hora._version import __version__
from hora.api import run
from hora.errors import HoraError, RunTimeoutError
from hora.job import stacks
from hora.timeline import summary_text

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130
# A stop request from outside (a scheduler's cancel, a preemption, `kill`, a closed terminal).
_TERMINATING = (signal.SIGTERM, signal.SIGHUP)


def _no_hosts(option: str) -> str:
    """Why horovodrun's host options are refused, and which engines reach other machines."""
    clusters = " or ".join(
        f"--backend {e.name}" for e in engines.engines() if e.ranks_run is not engines.RanksRun.HERE
    )
    return (
        f"{option} is not supported: hora does not log into other hosts. It runs the ranks on "
        f"this machine (--backend {engines.DEFAULT}) or on a cluster, through its engine "
        f"({clusters}): to use several machines, run on such a cluster with its --backend "
        "(`hora run --help` says what each engine runs on)."
    )


def _backend_help() -> str:
    """One line per engine, from the registry: hora's own and those of entry points."""
    lines = [f"{e.name}: {e.summary}" for e in engines.engines() if e.summary]
    lines += [f"{name}: cannot be used (--backend {name} says why)" for name in engines.broken()]
    return "; ".join(lines)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="hora", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    _version_option(parser)
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser(
        "run",
        help="run a script, module or command on N processes",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,  # `--no` must not silently mean --no-python
    )
    _version_option(run_cmd)
    run_cmd.add_argument(
        "-np",
        "--num-proc",
        "--nproc-per-node",
        "--nproc_per_node",
        dest="np",
        type=int,
        required=True,
        help="number of worker processes (ranks)",
    )
    run_cmd.add_argument(
        "--backend",
        # a broken entry point is a choice too: asking for it says what is wrong with it
        choices=sorted(
            (*engines.names(), *engines.broken()), key=lambda name: name != engines.DEFAULT
        ),
        default=engines.DEFAULT,
        help=_backend_help(),
    )
    run_cmd.add_argument(
        "--remote",
        metavar="URL",
        help=f"with --backend {' or '.join(_remote_takers())}: run on the Spark Connect server "
        "at URL (sc://host:port, or local[N] for one in this process), as pyspark's --remote; "
        "SPARK_REMOTE does the same",
    )
    run_cmd.add_argument(
        "--timeout", type=float, default=None, help="stop the job after this many seconds"
    )
    run_cmd.add_argument(
        "--start-timeout",
        type=float,
        default=600.0,
        help="seconds to wait for every worker to start (default 600)",
    )
    run_cmd.add_argument(
        "--max-restarts",
        dest="max_restarts",
        type=int,
        default=None,
        help="restart every rank up to N times when one fails (default 0, as torchrun; 10 for "
        "an elastic run, where every resize is an attempt too)",
    )
    run_cmd.add_argument(
        "--min-np",
        "--min-num-proc",
        dest="min_np",
        type=int,
        default=None,
        help="an elastic run (Horovod's flag): after a failure go on with as many ranks as the "
        "cluster can run, never fewer than this (default -np when --max-np is given)",
    )
    run_cmd.add_argument(
        "--max-np",
        "--max-num-proc",
        dest="max_np",
        type=int,
        default=None,
        help="an elastic run (Horovod's flag): grow back to this many ranks when slots return, "
        "at a commit of hvd.elastic (default -np when --min-np is given)",
    )
    run_cmd.add_argument(
        "--log-callback-only",
        action="store_true",
        help="forward only hora.log_to_driver messages, not all output",
    )
    run_cmd.add_argument(
        "--timeline-filename",
        metavar="PATH",
        help="record a Horovod timeline of the job (sets HOROVOD_TIMELINE) into PATH",
    )
    run_cmd.add_argument(
        "--output-filename",
        metavar="DIR",
        help="also write each rank's output to DIR/rank.<rank>/stdout and .../stderr",
    )
    run_cmd.add_argument(
        "--no-python",
        action="store_true",
        help="run the command as it is, not as a Python script",
    )
    run_cmd.add_argument(
        "-m",
        "--module",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE ...",
        help="run a module as `python -m` does (the current folder first on sys.path)",
    )
    for flags in (("-H", "--hosts"), ("--hostfile",)):
        run_cmd.add_argument(*flags, dest="hosts_option", action=_Refused, help=argparse.SUPPRESS)
    run_cmd.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        metavar="SCRIPT|COMMAND ...",
        help="what every rank runs, with its arguments",
    )
    timeline_cmd = commands.add_parser("timeline", help="read a timeline (HOROVOD_TIMELINE) file")
    timeline_actions = timeline_cmd.add_subparsers(dest="action", required=True)
    summary_cmd = timeline_actions.add_parser(
        "summary", help="where the time went, per phase and per rank"
    )
    summary_cmd.add_argument("trace", help="the trace file (Chrome trace JSON)")
    return parser


def _version_option(parser: argparse.ArgumentParser) -> None:
    """`--version`, as horovodrun's, torchrun's and ray's: prints `hora X.Y.Z` (hora.__version__,
    what the Spark engine's version check reports too) and exits 0, before any required argument
    is asked for. After the program (`hora run -np 2 train.py --version`) it is the program's."""
    parser.add_argument(
        "--version", action="version", version=f"hora {__version__}", help="print hora's version"
    )


def _remote_takers() -> list[str]:
    """The engines whose session takes `--remote` (a Spark Connect server)."""
    return [e.name for e in engines.engines() if "remote" in e.session_options]


class _Refused(argparse.Action):
    """An option horovodrun has and hora deliberately does not: remember which, refuse later."""

    def __call__(self, parser: Any, namespace: Any, values: Any, option_string: Any = None) -> None:
        setattr(namespace, self.dest, option_string)


def _timeline(ns: argparse.Namespace) -> int:
    try:
        print(summary_text(ns.trace))
    except (OSError, ValueError) as exc:
        print(f"hora: error: cannot read the timeline {ns.trace}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def _job_env(ns: argparse.Namespace) -> dict[str, str]:
    if not ns.timeline_filename:
        return {}
    path = os.path.abspath(ns.timeline_filename)
    if os.path.isdir(path):
        raise UsageError(
            f"--timeline-filename {ns.timeline_filename!r} is a directory: name a file"
        )
    if not os.path.isdir(os.path.dirname(path)):
        raise UsageError(
            f"--timeline-filename {ns.timeline_filename!r}: the folder {os.path.dirname(path)} "
            "does not exist"
        )
    return {"HOROVOD_TIMELINE": path}


def _run(ns: argparse.Namespace) -> None:
    if ns.hosts_option:
        raise UsageError(_no_hosts(ns.hosts_option))
    takers = _remote_takers()
    if ns.remote and ns.backend not in takers:
        raise UsageError(
            f"--remote names a Spark Connect server: use it with --backend {' or '.join(takers)}"
        )
    words = ns.program[1:] if ns.program[:1] == ["--"] else ns.program
    program: Program = resolve(
        words,
        module=ns.module,
        no_python=ns.no_python,
        on_this_host=engines.get(ns.backend).ranks_run is engines.RanksRun.HERE,
    )
    options: dict[str, Any] = {
        "np": ns.np,
        "backend": ns.backend,
        "env": _job_env(ns),
        "timeout": ns.timeout,
        "start_timeout": ns.start_timeout,
        "driver_log_verbosity": "log_callback_only" if ns.log_callback_only else "all",
        "output_filename": ns.output_filename,
        "max_restarts": ns.max_restarts,
        "min_np": ns.min_np,
        "max_np": ns.max_np,
    }
    session_options = {"remote": ns.remote} if ns.remote else {}
    with engines.get(ns.backend).session(**session_options) or nullcontext():
        run(run_program, (program,), **options)


class _Terminated(BaseException):
    """Raised in the driver by SIGTERM or SIGHUP; a BaseException, as KeyboardInterrupt is, so
    that nothing on the way out takes it for an error of the job's."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


@contextmanager
def _stop_on_termination() -> Iterator[None]:
    """SIGTERM and SIGHUP end the run as Ctrl-C does, through the driver's stop: every rank's
    process group gets SIGTERM (a script's handler can save a checkpoint, as under torchrun,
    which forwards them too), then SIGKILL after a grace. Without this the driver would die on
    the spot and its workers would only notice their channel closing: SIGKILL, no handler.
    A second signal while the workers stop is ignored (SIGKILL remains the way to hurry).
    SIGUSR1 prints where every rank is (each thread's Python stack) and the run goes on."""

    def terminate(signum: int, _frame: FrameType | None) -> None:
        for sig in _TERMINATING:
            signal.signal(sig, signal.SIG_IGN)
        raise _Terminated(signum)

    if threading.current_thread() is not threading.main_thread():
        yield  # only the main thread may set handlers; a caller elsewhere keeps its own
        return
    previous = {sig: signal.signal(sig, terminate) for sig in _TERMINATING}
    # SIGUSR1 prints where every rank is (their Python stacks) and the run goes on.
    previous[stacks.DUMP_SIGNAL] = signal.signal(
        stacks.DUMP_SIGNAL, lambda _signum, _frame: stacks.request_dump()
    )
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hora` command; returns the exit status."""
    ns = _parser().parse_args(argv)
    if ns.command == "timeline":
        return _timeline(ns)
    try:
        with _stop_on_termination():
            _run(ns)
    except (ValueError, FileNotFoundError) as exc:
        print(f"hora: error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except RunTimeoutError as exc:
        print(f"hora: {exc}", file=sys.stderr)
        return EXIT_TIMEOUT
    except HoraError as exc:
        print(f"hora: {exc}", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("hora: interrupted; every worker was stopped", file=sys.stderr)
        return EXIT_INTERRUPTED
    except _Terminated as exc:
        name = signal.Signals(exc.signum).name
        print(f"hora: stopped by {name}; every worker was stopped", file=sys.stderr)
        return 128 + exc.signum  # as a shell reports a command ended by that signal
    return 0


if __name__ == "__main__":
    sys.exit(main())
