"""A rank that falls silent (its host cut off, its process frozen) fails the attempt within the
silence time, and the story names its host: no collective waits for a peer that is gone."""

from __future__ import annotations

import socket
import time

import pytest

import hora
from hora.job.silence import DEFAULT_SILENCE_SECONDS, SILENCE_VAR, silence_seconds
from tests import _workers
from tests.conftest import wait_for_no_processes


def test_a_silent_rank_is_named_with_its_host_within_the_silence_time() -> None:
    start = time.monotonic()
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(_workers.freeze_rank_1, np=2, env={}, timeout=120)
    took = time.monotonic() - start
    text = str(info.value)
    assert text.startswith(f"rank 1 on host {socket.gethostname()}: no word from it for "), text
    assert "HORA_HEARTBEAT_TIMEOUT_SECONDS=6" in text and "process is frozen" in text
    assert took < 60, took
    assert wait_for_no_processes() == []


@pytest.fixture(autouse=True)
def _short_silence(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HORA_HEARTBEAT_TIMEOUT_SECONDS", "6")


def test_the_silence_time_is_30_s_by_default_and_read_from_the_variable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default the docs give (and tests/cluster's cut-off tests judge their reports by);
    the other tests here and there run with a shorter one."""
    monkeypatch.delenv(SILENCE_VAR)
    assert silence_seconds() == DEFAULT_SILENCE_SECONDS == 30.0
    monkeypatch.setenv(SILENCE_VAR, "")
    assert silence_seconds() == 30.0
    monkeypatch.setenv(SILENCE_VAR, "0")
    assert silence_seconds() == 0.0
    monkeypatch.setenv(SILENCE_VAR, "soon")
    with pytest.raises(ValueError, match="HORA_HEARTBEAT_TIMEOUT_SECONDS='soon'"):
        silence_seconds()
