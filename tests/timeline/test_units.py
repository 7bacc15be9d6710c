"""The timeline's parts without a job: the file, the track converter, the summary, the env."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hora import environment
from hora.config import RunConfig
from hora.engines.base import AttemptSpec, LaunchContext, Launcher
from hora.environment import build
from hora.job.driver import Job
from hora.job.group import WorkerGroup
from hora.timeline._events import STOP, RankTrack
from hora.timeline._file import HEADER_NAME, TraceFile
from hora.timeline._summary import format_summary, load_trace, summarize
from tests.timeline._trace import names, read

REPO = Path(__file__).resolve().parents[2]


def ev(name: str, ts: float, pid: int = 0, tid: int = 1, ph: str = "i") -> str:
    return json.dumps({"name": name, "ph": ph, "ts": ts, "pid": pid, "tid": tid})


# -- the file ---------------------------------------------------------------------------------
def test_the_file_is_a_json_array_after_every_append(tmp_path: Path) -> None:
    path = tmp_path / "t.json"
    trace = TraceFile(str(path), "job")
    written: list[str] = []
    for n in range(60):  # batches small and large, crossing many pages
        batch = [ev("x" * (n * 7 % 300), n * 100 + i) for i in range(n % 13 * 9)]
        trace.append(batch)
        written += batch
        assert [json.dumps(e) for e in json.loads(path.read_text())[1:]] == written
    trace.close()


def test_a_shared_file_is_appended_by_its_job_and_replaced_by_another(tmp_path: Path) -> None:
    path = str(tmp_path / "t.json")
    first = TraceFile(path, "job-1", shared=True)
    first.append([ev("a", 1)])
    second = TraceFile(path, "job-1", shared=True)  # another rank of the same job
    second.append([ev("b", 2)])
    assert [e["name"] for e in json.loads(Path(path).read_text())[1:]] == ["a", "b"]
    TraceFile(path, "job-2", shared=True).append([ev("c", 3)])  # the next run
    assert [e["name"] for e in json.loads(Path(path).read_text())[1:]] == ["c"]


WRITER = """
import sys
from hora.timeline._file import TraceFile
n = int(sys.argv[2])
f = TraceFile(sys.argv[1], "job", shared=True)
batch = ['{"name":"X","ph":"i","ts":%d,"pid":0,"tid":1}' % i for i in range(n)]
print("ready", flush=True)
while True:
    f.append(batch)
"""


@pytest.mark.parametrize("batch", [300, 30000])
def test_a_writer_killed_at_any_moment_leaves_valid_json(tmp_path: Path, batch: int) -> None:
    for k in range(6):
        path = tmp_path / f"k{k}.json"
        proc = subprocess.Popen(
            [sys.executable, "-c", WRITER, str(path), str(batch)], cwd=REPO, stdout=subprocess.PIPE
        )
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
        time.sleep(0.02 + 0.03 * k)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait() == -signal.SIGKILL
        proc.stdout.close()
        text = path.read_text()
        try:
            events = json.loads(text)
        except json.JSONDecodeError:  # killed inside a write (mostly between two pages)
            events = load_trace(path)  # the summary keeps what came before the cut
        # every complete event, in order, none lost or doubled before the tear
        assert [e["ts"] for e in events[1:]] == [i % batch for i in range(len(events) - 1)]
        assert events[0]["name"] == HEADER_NAME
        path.unlink()


def test_a_trace_torn_anywhere_keeps_every_complete_event(tmp_path: Path) -> None:
    """A kill can, rarely, cut a write inside a page (seen once in CI): the summary keeps every
    event before the cut, wherever it falls."""
    path = tmp_path / "t.json"
    trace = TraceFile(str(path), "job")
    for first in range(0, 40, 10):
        trace.append(ev("X", i) for i in range(first, first + 10))
    trace.close()
    whole = path.read_bytes()
    for cut in range(len(whole) - 1, len(whole) - 200, -7):
        path.write_bytes(whole[:cut])
        events = load_trace(path)
        assert [e["ts"] for e in events[1:]] == list(range(len(events) - 1))
        assert 35 <= len(events) - 1 <= 40  # only the torn tail is lost
    path.write_bytes(b"[\n{not json")
    with pytest.raises(json.JSONDecodeError):
        load_trace(path)


# -- the track converter ----------------------------------------------------------------------
def convert(rank: int, raw: list[tuple[int, str, str, str, Any]], tmp_path: Path):
    path = tmp_path / "c.json"
    trace = TraceFile(str(path), "job")
    trace.append(RankTrack(rank).convert(raw))
    return read(path)


def test_a_negotiation_end_recorded_before_its_begin_is_repaired(tmp_path: Path) -> None:
    # The caller's thread records NEGOTIATE's begin after the engine already ended it.
    raw = [
        (2000, "E", "allreduce.w", "NEGOTIATE_ALLREDUCE", None),
        (2001, "B", "allreduce.w", "ALLREDUCE", None),
        (2500, "E", "allreduce.w", "ALLREDUCE", {"bytes": 4}),
        (2100, "B", "allreduce.w", "NEGOTIATE_ALLREDUCE", None),
    ]
    trace = convert(3, raw, tmp_path)
    assert trace.ranks == {3: "rank 3"} and trace.unfinished == 0
    negotiate, op = trace.track(3, "allreduce.w")
    assert (negotiate.name, op.name) == ("NEGOTIATE_ALLREDUCE", "ALLREDUCE")
    assert negotiate.start <= negotiate.end <= op.start and op.args["bytes"] == 4


def test_unnamed_ops_share_lanes_and_a_stop_closes_what_is_open(tmp_path: Path) -> None:
    raw = [
        (10, "B", "allreduce.noname.0", "NEGOTIATE_ALLREDUCE", None),
        (11, "B", "allreduce.noname.1", "NEGOTIATE_ALLREDUCE", None),  # overlaps: a 2nd lane
        (12, "E", "allreduce.noname.0", "NEGOTIATE_ALLREDUCE", None),
        (13, "E", "allreduce.noname.1", "NEGOTIATE_ALLREDUCE", None),
        (14, "B", "allreduce.noname.2", "NEGOTIATE_ALLREDUCE", None),  # reuses lane 1
        (15, "E", "allreduce.other", "ALLREDUCE", None),  # ends nothing: dropped
        (16, "B", "\0MainThread", "forward", None),
        (20, STOP, "", "", None),
    ]
    trace = convert(0, raw, tmp_path)
    assert sorted(trace.threads.values()) == [
        "regions (MainThread)",
        "unnamed ops #1",
        "unnamed ops #2",
    ]
    assert trace.unfinished == 0  # the stop ended the open negotiation and region
    lane1 = trace.track(0, "unnamed ops #1")
    assert [s.args["tensor"] for s in lane1] == ["allreduce.noname.0", "allreduce.noname.2"]
    assert lane1[1].args["unfinished"] is True
    assert names(trace.track(0, "regions (MainThread)")) == ["forward"]


# -- the summary ------------------------------------------------------------------------------
def test_the_summary_counts_fused_time_once_and_names_the_slowest_rank() -> None:
    events = [{"name": "process_name", "ph": "M", "pid": 0, "args": {"name": "rank 0"}}]
    for tid in (1, 2):  # two fused tensors on rank 0 share one 100 µs call
        events += [
            {"name": "GLOO_ALLREDUCE", "ph": "B", "ts": 0, "pid": 0, "tid": tid},
            {"name": "GLOO_ALLREDUCE", "ph": "E", "ts": 100, "pid": 0, "tid": tid},
        ]
    events += [
        {"name": "GLOO_ALLREDUCE", "ph": "B", "ts": 0, "pid": 1, "tid": 1},
        {"name": "GLOO_ALLREDUCE", "ph": "E", "ts": 300, "pid": 1, "tid": 1},
        {"name": "forward", "ph": "X", "ts": 0, "dur": 50, "pid": 1, "tid": 9},
        {"name": "ALLGATHER", "ph": "B", "ts": 400, "pid": 1, "tid": 1},  # never ended
    ]
    summary = summarize(events)
    gloo = summary.phases["GLOO_ALLREDUCE"]
    assert gloo.count == 3 and gloo.busy_us == {0: 100.0, 1: 300.0}
    assert gloo.slowest_rank == 1 and gloo.mean_us == pytest.approx(500 / 3)
    assert summary.phases["forward"].total_us == 50
    assert summary.unfinished == 1 and summary.ranks == [0, 1]
    text = format_summary(summary)
    assert text.index("GLOO_ALLREDUCE") < text.index("forward")  # most time first
    assert "1 slice(s) never ended" in text


# -- the driver's variables reach the workers --------------------------------------------------
class _Capture(Launcher):
    def __init__(self, spec: AttemptSpec) -> None:
        self.env = dict(spec.env)

    def start(self, ctx: LaunchContext) -> None:
        raise RuntimeError("captured")

    def stop(self) -> None:
        pass


def test_timeline_variables_set_on_the_driver_are_sent_to_every_engine(monkeypatch) -> None:
    monkeypatch.setenv("HOROVOD_TIMELINE", "/somewhere/trace.json")
    monkeypatch.setenv("HOROVOD_TIMELINE_MARK_CYCLES", "1")
    monkeypatch.delenv("HORA_TIMELINE", raising=False)
    launchers: list[_Capture] = []

    def new_group(spec: AttemptSpec) -> WorkerGroup:
        launchers.append(_Capture(spec))
        return WorkerGroup(launchers[-1])

    config = RunConfig(np=2, env={"HOROVOD_TIMELINE_MARK_CYCLES": "0", "OTHER": "x"})
    with pytest.raises(RuntimeError, match="captured"):
        Job(config, b"", new_group).run()
    [launcher] = launchers
    run_id = launcher.env.pop(environment.RUN_ID_VAR)
    assert len(run_id) >= 8  # the run's id, every attempt's; torchrun's name for it too
    assert launcher.env.pop("TORCHELASTIC_RUN_ID") == run_id
    assert launcher.env == {
        "HOROVOD_TIMELINE": "/somewhere/trace.json",
        "HOROVOD_TIMELINE_MARK_CYCLES": "0",  # the run's own env wins
        "OTHER": "x",
    } | build.restart_env(0, 0)
    assert build.driver_env({"HORA_TIMELINE": "", "PATH": "/bin"}) == {}
