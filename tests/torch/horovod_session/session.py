"""Run a Horovod-style pytest session inside a rank, as `horovodrun -np 2 pytest ...` does.

Every rank runs the same pytest session in its own process; the outcome of each test comes back
to the driver, with the text of what failed, so the outer test can say which one broke.
"""

from __future__ import annotations

import os
from typing import Any

SUITE = os.path.join(os.path.dirname(__file__), "horovod_torch_suite.py")


class _Outcomes:
    """A pytest plugin that records each test's outcome (a failed setup or teardown counts)."""

    def __init__(self) -> None:
        self.outcomes: dict[str, str] = {}
        self.failures: dict[str, str] = {}
        self.foreign_warnings: list[str] = []

    def pytest_warning_recorded(self, warning_message: Any, when: str, nodeid: str) -> None:
        """Warnings a test's own lines cause are the user's business (e.g. `average=`); any
        other comes from inside hora or torch, and no user should see it."""
        if warning_message.filename != SUITE:
            w = warning_message
            self.foreign_warnings.append(
                f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno}, in {nodeid})"
            )

    def pytest_runtest_logreport(self, report: Any) -> None:
        name = report.nodeid.rsplit("::", 1)[-1]
        counts = report.when == "call" or report.outcome != "passed"
        if counts and self.outcomes.get(name) in (None, "passed"):
            self.outcomes[name] = report.outcome
        if report.failed:
            self.failures[name] = str(report.longrepr)[-3000:]


def run_session(*selection: str) -> dict[str, Any]:
    """Run the suite (or `-k`-style selection) in this rank; never raises."""
    import pytest

    plugin = _Outcomes()
    args = [
        SUITE,
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
        "warnings": plugin.foreign_warnings,
    }
