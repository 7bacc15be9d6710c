"""Where the ranks' `hora.report` metrics can go besides the driver's output (`report_to=`).

A reporter is any callable taking `(step, metrics)`; these two cover the usual places. Both run
on the driver, so the ranks need neither tensorboard nor mlflow, nor access to their servers.
The first step after an elastic world re-formed in place carries `metrics["resized"]` (from,
to, seconds, commit, why): both chart the new world size (`hora/world_size`) and the resize's
seconds (`hora/resize_seconds`) at that step, and TensorBoard keeps its story as text.
"""

from __future__ import annotations

import sys
from typing import Any

from hora.wire.protocol import RESIZED_METRIC


def _numbers(metrics: dict[str, Any]) -> dict[str, float]:
    """The numbers among the metrics, and a resize's world size and seconds."""
    numbers = {
        k: float(v)
        for k, v in metrics.items()
        if isinstance(v, int | float) and not isinstance(v, bool)
    }
    resized = metrics.get(RESIZED_METRIC)
    if isinstance(resized, dict):
        numbers["hora/world_size"] = float(resized["to"])
        numbers["hora/resize_seconds"] = float(resized["seconds"])
    return numbers


def _story(resized: dict[str, Any]) -> str:
    """A resize as the driver's log says it."""
    return (
        f"resized in place from {resized['from']} to {resized['to']} ranks in "
        f"{resized['seconds']} s ({resized['why']}); went on from commit {resized['commit']}"
    )


class TensorBoard:
    """Every reported number as a TensorBoard scalar in `log_dir` (torch's SummaryWriter, which
    needs the `tensorboard` package), at the reported step."""

    def __init__(self, log_dir: str) -> None:
        self.log_dir = str(log_dir)
        self._writer: Any = None

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        if self._writer is None:
            from torch.utils.tensorboard import SummaryWriter  # only where it is asked for

            self._writer = SummaryWriter(log_dir=self.log_dir)
        for name, value in _numbers(metrics).items():
            self._writer.add_scalar(name, value, step)
        if isinstance(resized := metrics.get(RESIZED_METRIC), dict):
            self._writer.add_text("hora/resized", _story(resized), step)
        self._writer.flush()

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    def __repr__(self) -> str:
        return f"TensorBoard({self.log_dir!r})"


class MLflow:
    """Every reported number logged to MLflow at its step: to the active run if there is one,
    else to a run started for the job (named `run_name`) and ended with it."""

    def __init__(self, run_name: str | None = None) -> None:
        self.run_name = run_name
        self._started: Any = None

    def __call__(self, step: int, metrics: dict[str, Any]) -> None:
        import mlflow  # only where it is asked for: seconds of start-up

        if mlflow.active_run() is None:
            self._started = mlflow.start_run(run_name=self.run_name)
        mlflow.log_metrics(_numbers(metrics), step=step)

    def close(self) -> None:
        if self._started is not None:
            sys.modules["mlflow"].end_run()
            self._started = None

    def __repr__(self) -> str:
        return f"MLflow(run_name={self.run_name!r})"
