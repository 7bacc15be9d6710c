"""`hora run -np N script.py [args...]`: horovodrun/torchrun's command line, as a thin adapter.

`hora timeline summary trace.json` prints where a recorded timeline's time went.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from hora._script import check_script, run_script
from hora.api import run
from hora.errors import HoraError, RunTimeoutError

EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 124
EXIT_INTERRUPTED = 130


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hora", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run_cmd = commands.add_parser("run", help="run a script on N local processes")
    run_cmd.add_argument(
        "-np", "--num-proc", dest="np", type=int, required=True, help="number of worker processes"
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
        default=0,
        help="restart every rank up to N times when one fails (default 0, as torchrun)",
    )
    run_cmd.add_argument(
        "--log-callback-only",
        action="store_true",
        help="forward only hora.log_to_driver messages, not all output",
    )
    run_cmd.add_argument("script", help="the Python script every rank runs")
    run_cmd.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    timeline_cmd = commands.add_parser("timeline", help="read a timeline (HOROVOD_TIMELINE) file")
    timeline_actions = timeline_cmd.add_subparsers(dest="action", required=True)
    summary_cmd = timeline_actions.add_parser(
        "summary", help="where the time went, per phase and per rank"
    )
    summary_cmd.add_argument("trace", help="the trace file (Chrome trace JSON)")
    return parser


def _timeline(ns: argparse.Namespace) -> int:
    from hora.timeline import summary_text

    try:
        print(summary_text(ns.trace))
    except (OSError, ValueError) as exc:
        print(f"hora: error: cannot read the timeline {ns.trace}: {exc}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hora` command; returns the exit status."""
    ns = _parser().parse_args(argv)
    if ns.command == "timeline":
        return _timeline(ns)
    try:
        script = check_script(ns.script)
        run(
            run_script,
            (script, list(ns.args)),
            np=ns.np,
            backend="local",
            timeout=ns.timeout,
            start_timeout=ns.start_timeout,
            driver_log_verbosity="log_callback_only" if ns.log_callback_only else "all",
            max_restarts=ns.max_restarts,
        )
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
    return 0


if __name__ == "__main__":
    sys.exit(main())
