"""Live metrics: `hora.report` from any rank, aggregated per step on the driver, printed, handed
to the reporters and returned where asked."""

from __future__ import annotations

import os
import time

import pytest

import hora
from hora.job import metrics as job_metrics
from hora.job.metrics import MetricsLog, aggregate
from tests import _workers


def test_numbers_are_averaged_and_the_rest_is_the_lowest_ranks() -> None:
    by_rank = {1: {"loss": 3.0, "note": "b"}, 0: {"loss": 1.0, "note": "a", "lr": 0.5}}
    assert aggregate(by_rank) == {"loss": 2.0, "note": "a", "lr": 0.5}


def test_a_step_is_emitted_when_every_rank_reported_it_or_after_a_second(monkeypatch) -> None:
    monkeypatch.setattr(job_metrics, "SETTLE_SECONDS", 0.2)
    seen: list[tuple[int, dict]] = []
    log = MetricsLog([lambda step, values: seen.append((step, values))], progress=False)
    log.start_attempt(0, np=2)
    log.receive(0, 1, {"loss": 1.0})
    log.flush()
    assert seen == []  # rank 1 has not reported step 1 yet
    log.receive(1, 1, {"loss": 3.0})
    log.receive(0, 2, {"loss": 5.0})  # rank 0 alone: emitted once it settled
    log.flush()
    time.sleep(0.25)
    log.flush()
    log.receive(1, 2, {"loss": 7.0})  # late for the line, still in the history
    log.close()  # the reporters have had every step
    assert seen == [(1, {"loss": 2.0}), (2, {"loss": 5.0})]
    assert log.history() == [{"step": 1, "loss": 2.0}, {"step": 2, "loss": 6.0}]


def test_a_step_reported_by_rank_0_alone_is_not_held_back_once_that_is_known(monkeypatch) -> None:
    monkeypatch.setattr(job_metrics, "SETTLE_SECONDS", 0.2)
    log = MetricsLog(progress=False)
    log.start_attempt(0, np=2)
    log.receive(0, 1, {"loss": 1.0})
    time.sleep(0.25)
    log.flush()  # settled: rank 0 is the only rank that reports
    log.receive(0, 2, {"loss": 0.5})
    log.flush()
    assert [h["step"] for h in log.history()] == [1, 2]


def test_a_failing_reporter_is_named_once_and_dropped(capsys) -> None:
    calls: list[int] = []

    def broken(step: int, values: dict) -> None:
        calls.append(step)
        raise RuntimeError("no space left")

    log = MetricsLog([broken], progress=False)
    for step in (1, 2):
        log.receive(0, step, {"loss": 1.0})
    log.close()
    assert calls == [1]
    assert capsys.readouterr().err.count("failed (RuntimeError: no space left)") == 1


def test_reports_reach_the_driver_its_reporters_and_the_caller(tmp_path, capfd) -> None:
    got: list[tuple[int, dict]] = []
    board = hora.reporters.TensorBoard(str(tmp_path / "tb"))
    results, history = hora.run(
        _workers.report_steps,
        np=2,
        report_to=[lambda step, values: got.append((step, values)), board],
        return_metrics=True,
    )
    assert results == [0, 1]
    want = [
        {"step": s, "loss": s + 0.5, "lr": 0.1 / s, "phase": "warmup" if s == 1 else "train"}
        for s in (1, 2, 3)
    ]
    assert history == want  # (1 + 2 + 2s) / 2 and 0.1 / s are exact as the ranks compute them
    assert [step for step, _ in got] == [1, 2, 3]
    err = capfd.readouterr().err
    assert "hora: step 2: loss=2.5, lr=0.05, phase=train (mean of 2 ranks)" in err
    assert any(name.startswith("events.out.tfevents") for name in os.listdir(tmp_path / "tb"))


def test_runner_returns_the_metrics_beside_rank_0s_value_where_asked() -> None:
    runner = hora.Runner(np=-2, return_metrics=True, progress=False)
    value, history = runner.run(_workers.report_steps, steps=2)
    assert value == 0 and [h["step"] for h in history] == [1, 2]
    assert hora.Runner(np=-2, progress=False).run(_workers.report_steps, steps=1) == 0


def test_mlflow_gets_every_step(tmp_path, monkeypatch) -> None:
    mlflow = pytest.importorskip("mlflow")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # mlflow 3 asks for this opt-in
    reporter = hora.reporters.MLflow(run_name="digits")
    hora.run(_workers.report_steps, np=2, report_to=reporter, progress=False)
    (run,) = mlflow.search_runs(search_all_experiments=True, output_format="list")
    client = mlflow.tracking.MlflowClient()
    losses = [(m.step, m.value) for m in client.get_metric_history(run.info.run_id, "loss")]
    assert sorted(losses) == [(1, 1.5), (2, 2.5), (3, 3.5)]
    assert run.info.status == "FINISHED"  # the run it started ended with the job


def test_bad_metrics_and_reporters_are_refused_before_anything_is_sent(capsys) -> None:
    with pytest.raises(TypeError, match="not a number or a string"):
        hora.report({"weights": [1, 2]})
    with pytest.raises(ValueError, match=r"'resized' is hora's own .* call your metric something"):
        hora.report({"resized": 1.0})  # else replaced, unsaid, on the step after a resize
    with pytest.raises(ValueError, match="report_to must be a list of callables"):
        hora.run(_workers.report_steps, np=2, report_to=["tensorboard"])
    hora.report({"loss": 0.5}, step=3)  # outside a worker: printed
    assert "hora.report: step 3: {'loss': 0.5}" in capsys.readouterr().out


def test_a_world_resized_in_place_shows_in_the_first_step_after_it(tmp_path) -> None:
    """The old world's pending step is emitted with the ranks it has; the next steps are whole
    at the new size, and the first carries the resize, for the history and the reporters."""
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    got: list[tuple[int, dict]] = []
    board = hora.reporters.TensorBoard(str(tmp_path / "tb"))
    log = MetricsLog([lambda step, values: got.append((step, values)), board], progress=False)
    log.start_attempt(0, np=3)
    for rank in range(3):
        log.receive(rank, 1, {"loss": 3.0})
    log.receive(0, 2, {"loss": 2.0})  # rank 2 is lost before it reports step 2
    log.receive(1, 2, {"loss": 4.0})
    log.flush()
    event = {"from": 3, "to": 2, "seconds": 0.4, "commit": 1, "why": "rank 2 failed"}
    log.resized(event)
    for step in (3, 4):
        for rank in range(2):
            log.receive(rank, step, {"loss": 1.0})
        log.flush()  # whole at 2 ranks: emitted at once
    log.close()
    assert [step for step, _ in got] == [1, 2, 3, 4]
    assert log.history() == [
        {"step": 1, "loss": 3.0},
        {"step": 2, "loss": 3.0},
        {"step": 3, "loss": 1.0, "resized": event},
        {"step": 4, "loss": 1.0},
    ]
    tb = EventAccumulator(str(tmp_path / "tb"), size_guidance={"tensors": 0})
    tb.Reload()
    assert [(e.step, e.value) for e in tb.Scalars("hora/world_size")] == [(3, 2.0)]
    (text,) = tb.Tensors("hora/resized/text_summary")
    assert (
        text.step == 3
        and b"from 3 to 2 ranks in 0.4 s (rank 2 failed)" in (text.tensor_proto.string_val[0])
    )
