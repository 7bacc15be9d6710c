"""`hora run -np N script.py [args...]`: horovodrun/torchrun's command line, as a thin adapter."""

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
        "--log-callback-only",
        action="store_true",
        help="forward only hora.log_to_driver messages, not all output",
    )
    run_cmd.add_argument("script", help="the Python script every rank runs")
    run_cmd.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `hora` command; returns the exit status."""
    ns = _parser().parse_args(argv)
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
