"""Run a Horovod-style pytest session inside a rank, as `horovodrun -np 2 pytest ...` does.

Every rank runs the same pytest session in its own process; the outcome of each test comes back
to the driver, with the text of what failed, so the outer test can say which one broke. The
TensorFlow door's session (tests/tensorflow/horovod_session) runs its suites through `run_pytest`.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

SUITE = os.path.join(os.path.dirname(__file__), "horovod_torch_suite.py")


class _Outcomes:
    """A pytest plugin that records each test's outcome (a failed setup or teardown counts),
    keyed "Class::test", and every warning with the file that raised it."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.warnings: list[dict[str, str]] = []

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str) -> None:
        w = warning_message
        where = f"{w.filename}:{w.lineno}, in {nodeid}"
        text = f"{w.category.__name__}: {w.message} ({where})"
        self.warnings.append({"filename": w.filename, "text": text})

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.split("::", 1)[-1]
        counts = report.when == "call" or report.outcome != "passed"
        if counts and self.outcomes.get(name) in (None, "passed"):
            self.outcomes[name] = report.outcome
        if report.failed:
            self.failures[name] = str(report.longrepr)[-3000:]


def run_pytest(suites: Sequence[str], *selection: str) -> dict[str, Any]:
    """Run the `suites` (test files, or a `-k`-style selection of them) in this rank, in one
    pytest session; never raises."""
    import pytest

    plugin = _Outcomes()
    args = [
        *suites,
        "-q",
        "-p",
        "no:cacheprovider",
        "--noconftest",  # tests/conftest.py checks for leftover workers: we are one
        *selection,
    ]
    code = pytest.main(args, plugins=[plugin])
    return {
        "exit": int(code),
        "outcomes": plugin.outcomes,
        "failures": plugin.failures,
        "warnings": plugin.warnings,
    }


def run_session(*selection: str) -> dict[str, Any]:
    """Run the torch suite (or `-k`-style selection) in this rank; never raises."""
    return run_pytest([SUITE], *selection)
