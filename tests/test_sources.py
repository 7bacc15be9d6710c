"""Tracebacks as the user wrote them: code from a string, a notebook cell or the REPL shows its
lines on the ranks (real processes), and the driver's error leads with the rank's exception."""

from __future__ import annotations

import linecache
import os
import pickle
import traceback
import uuid

import cloudpickle
import pytest

import hora
from hora import _payload, _sources
from hora.errors import RankTraceback
from tests import _workers

CELL = """\
import os

def broken_hvd(scale):
    total = scale * 2
    raise ValueError(f"rank {os.environ['RANK']} saw {total}")
"""


def _define(filename: str, register: bool = True):
    """`broken_hvd` compiled from a string under `filename`, its lines in linecache where a
    notebook (IPython, ipykernel) or a tool registers them: never on disk."""
    if register:
        lines = CELL.splitlines(True)
        linecache.cache[filename] = (len(CELL), None, lines, filename)
    namespace: dict = {}
    exec(compile(CELL, filename, "exec"), namespace)
    return namespace["broken_hvd"]


@pytest.fixture
def filenames():
    made: list[str] = []
    yield made
    for name in made:
        linecache.cache.pop(name, None)


@pytest.mark.parametrize(
    "filename",
    [
        "<dynamic-code>",
        "<ipython-input-3-{}>",  # IPython's terminal
        "/tmp/ipykernel_{}/2735914093.py",  # ipykernel (Jupyter): a file name, never written
    ],
)
def test_a_rank_s_traceback_shows_the_lines_of_code_from_a_string(filename, filenames):
    filename = filename.format(uuid.uuid4().hex[:8])
    filenames.append(filename)
    assert not os.path.exists(filename)
    fn = _define(filename)
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(fn, (21,), np=2)
    error = info.value
    cause = error.__cause__
    assert isinstance(cause, RankTraceback) and cause.rank == error.rank
    expected = f'  File "{filename}", line 5, in broken_hvd\n    raise ValueError('
    assert expected in cause.text, cause.text
    assert "saw 42" in cause.text
    # Printed as Python prints it: the rank's exception first, then hora's story.
    printed = "".join(traceback.format_exception(error))
    assert printed.index(f"ValueError: rank {error.rank} saw 42") < printed.index(
        "WorkerFailedError"
    )
    assert printed.startswith(f"hora.errors.RankTraceback: rank {error.rank} raised:\nTraceback")


def test_without_the_lines_anywhere_the_traceback_is_as_before(filenames):
    filenames.append("<unregistered-code>")
    fn = _define("<unregistered-code>", register=False)
    with pytest.raises(hora.WorkerFailedError) as info:
        hora.run(fn, (1,), np=1)
    text = info.value.__cause__.text
    assert 'File "<unregistered-code>", line 5, in broken_hvd\nValueError' in text


def test_a_function_from_a_file_travels_as_before():
    """Code pickled by reference ships no lines: the payload is the plain pickle."""
    data = _payload.dumps_job(_workers.rank_times, (3,), {})
    assert data == cloudpickle.dumps((_workers.rank_times, (3,), {}))


def test_the_lines_travel_only_with_code_pickled_by_value(filenames):
    filenames.append("<cell-a>")
    fn = _define("<cell-a>")
    data = _payload.dumps_job(fn, (), {})
    linecache.cache.pop("<cell-a>")
    loaded, args, kwargs = pickle.loads(data)  # registers the lines, as a rank does
    assert linecache.getlines("<cell-a>") == CELL.splitlines(True)
    assert loaded.__code__.co_filename == "<cell-a>" and args == () and kwargs == {}


def test_cells_are_named_as_ipython_names_them():
    _sources.register({"/tmp/ipykernel_1/99.py": (CELL.splitlines(True), 3)})
    try:
        text = 'Traceback:\n  File "/tmp/ipykernel_1/99.py", line 5, in broken_hvd\n'
        named = _sources.name_cells(text)
        assert named == "Traceback:\n  Cell In[3], line 5, in broken_hvd\n"
        other = '  File "/tmp/ipykernel_1/100.py", line 2, in f\n'
        assert _sources.name_cells(other) == other
    finally:
        _sources._CELLS.clear()
        linecache.cache.pop("/tmp/ipykernel_1/99.py", None)
