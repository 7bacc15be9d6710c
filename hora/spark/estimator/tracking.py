"""MLflow: when mlflow is installed and a run is active on the driver, a fit logs its params,
every epoch's metrics (step = epochs done) and the final model to it. Logged from the driver
after training, from the run's history, so the executors need neither mlflow nor its server."""

from __future__ import annotations

import os
import sys
from typing import Any


def log_fit(params: dict[str, Any], history: list[dict[str, float]], store_model_dir: str) -> bool:
    """Log to the active run; False when there is none. A program with an active run has
    imported mlflow: one that has not is never made to import it (seconds of start-up)."""
    mlflow = sys.modules.get("mlflow")
    if mlflow is None or mlflow.active_run() is None:
        return False
    mlflow.log_params({k: _short(v) for k, v in params.items()})
    for epoch, logs in enumerate(history, start=1):
        mlflow.log_metrics(logs, step=epoch)
    if store_model_dir and os.path.isdir(store_model_dir):
        mlflow.log_artifacts(store_model_dir, artifact_path="model")
    return True


def _short(value: Any) -> str:
    text = repr(value) if not isinstance(value, str) else value
    return text if len(text) <= 500 else text[:497] + "..."
