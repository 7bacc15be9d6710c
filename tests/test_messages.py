"""Messages a user reads when something cannot start, word for word: they must read as sentences.

Pickling is checked where it happens (`dumps_job` on the driver, `dumps_result` on a worker; a
real run of each is in test_launcher.py), so no process is started here.
"""

from __future__ import annotations

import threading

import pytest

import hora
from hora._payload import dumps_job, dumps_result
from hora.spark import TorchDistributor

CANNOT_PICKLE_LOCK = "(TypeError: cannot pickle '_thread.lock' object)"
CREATE_INSIDE = (
    "Create such objects inside the function, on each worker, instead of capturing them from "
    "the driver or passing them as arguments."
)
PLAIN_DATA = "Return plain data (numbers, tensors, state_dicts)."


def test_a_captured_lock_is_named_once_with_its_type():
    lock = threading.Lock()

    def train():
        with lock:
            return 1

    with pytest.raises(hora.UnpicklableError) as info:
        dumps_job(train, (), {})
    assert str(info.value) == (
        f"hora cannot send {train.__qualname__} to the workers: variable 'lock' captured by "
        f"train (a lock) cannot be pickled {CANNOT_PICKLE_LOCK}. {CREATE_INSIDE}"
    )


def test_a_lock_inside_an_argument_says_where_it_is():
    with pytest.raises(hora.UnpicklableError) as info:
        dumps_job(_takes_state, (), {"state": {"lock": threading.Lock()}})
    assert str(info.value) == (
        "hora cannot send _takes_state to the workers: key 'lock' (a lock) in argument 'state' "
        f"(a dict) cannot be pickled {CANNOT_PICKLE_LOCK}. {CREATE_INSIDE}"
    )


def test_a_returned_lock_reads_as_a_sentence():
    with pytest.raises(hora.UnpicklableError) as info:
        dumps_result(threading.Lock(), rank=1)
    assert str(info.value) == (
        "the return value of rank 1 cannot be pickled: it is a lock "
        f"{CANNOT_PICKLE_LOCK}. {PLAIN_DATA}"
    )
    with pytest.raises(hora.UnpicklableError) as info:
        dumps_result({"writer": _Writer()}, rank=0)
    assert str(info.value) == (
        "the return value of rank 0 cannot be pickled: attribute 'lock' (a lock) in its key "
        f"'writer' (a _Writer) is not picklable {CANNOT_PICKLE_LOCK}. {PLAIN_DATA}"
    )


def test_torch_distributor_without_a_session_speaks_its_own_words():
    """No SparkSession is active here (the Spark tests stop theirs)."""
    with pytest.raises(RuntimeError) as info:
        TorchDistributor(num_processes=2, local_mode=False, use_gpu=False).run(_takes_state)
    assert str(info.value) == (
        "TorchDistributor(local_mode=False) runs its processes as Spark tasks and needs an "
        "active SparkSession: create one first (SparkSession.builder...getOrCreate()), or pass "
        "local_mode=True to run them on the driver"
    )


class _Writer:
    def __init__(self):
        self.lock = threading.Lock()


def _takes_state(state=None):
    return state
