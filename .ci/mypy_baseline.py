"""mypy over hora (settings in pyproject.toml) against a baseline that only goes down.

`mypy-baseline.txt` beside this file lists the errors tolerated today, one per line as
`path: message  [code]` (no line numbers, so that edits above an error do not move it). The
check fails on any error not in the list, and also when listed errors are gone, so that the
list is lowered in the same change that fixed them (`--update` rewrites it, never upwards).
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections import Counter
from pathlib import Path

BASELINE = Path(__file__).with_name("mypy-baseline.txt")
ERROR = re.compile(r"^(?P<path>[^:\s]+):\d+(?::\d+)?: error: (?P<message>.*)$")


def run_mypy() -> tuple[int, list[str]]:
    done = subprocess.run(
        [sys.executable, "-m", "mypy", "--no-pretty", "--no-error-summary"],
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, (done.stdout + done.stderr).splitlines()


def key(line: str) -> str | None:
    """The line's error without its line number; None for notes and anything else."""
    match = ERROR.match(line)
    return f"{match['path']}: {match['message']}" if match else None


def read_baseline() -> Counter[str]:
    lines = BASELINE.read_text(encoding="utf-8").splitlines() if BASELINE.exists() else []
    return Counter(line for line in lines if line.strip() and not line.startswith("#"))


def write_baseline(errors: Counter[str]) -> None:
    header = "# mypy errors tolerated in hora; only ever remove lines (see mypy_baseline.py)\n"
    BASELINE.write_text(header + "".join(f"{e}\n" for e in sorted(errors.elements())), "utf-8")


def main(argv: list[str]) -> int:
    code, lines = run_mypy()
    current = Counter(k for k in map(key, lines) if k is not None)
    if code != 0 and not current:  # mypy itself failed (not installed, bad settings, a crash)
        print("\n".join(lines))
        return code
    baseline = read_baseline()
    new, gone = current - baseline, baseline - current
    if new:
        print("\n".join(line for line in lines if key(line) in new))
        print(
            f"mypy: {new.total()} error(s) not in {BASELINE.name}: fix them (the baseline only "
            "goes down; an ignore needs `# type: ignore[code]` and a reason)"
        )
        return 1
    if "--update" in argv:
        write_baseline(current)
        print(f"mypy: baseline lowered to {current.total()} error(s)")
        return 0
    if gone:
        print("\n".join(sorted(gone.elements())))
        print(
            f"mypy: {gone.total()} error(s) of the baseline are fixed: lower it with "
            f"`{sys.executable} .ci/mypy_baseline.py --update`, and commit it"
        )
        return 1
    print(f"mypy: {current.total()} error(s), as in the baseline")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
