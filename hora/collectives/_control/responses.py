"""Carrying out rank 0's decisions on this rank (Horovod's `PerformOperation`): run each bucket on
the data path and complete its operations, fail the ones that failed validation, finish a join,
or end the loop.

Every rank applies the same responses in the same order, so the transports' order-matched
collectives always meet. A worker has expanded the buckets' cache ids first (`cache`).
"""

from __future__ import annotations

from hora.collectives._common import CollectiveRefusedError, HorovodInternalError
from hora.collectives._control.submissions import Op, SubmissionQueue
from hora.collectives._data.execute import run_bucket
from hora.collectives._data.groups import GroupInfo
from hora.collectives._messages import Bucket, Failure, JoinDone, Response, Shutdown
from hora.timeline import hooks as _th


class ResponseHandler:
    """Applies the responses of a round to this rank's operations in flight."""

    def __init__(self, queue: SubmissionQueue, process_sets: dict[int, GroupInfo]) -> None:
        self._queue = queue
        self._process_sets = process_sets  # shared with the caller's side, which adds sets

    def handle(self, responses: list[Response | Shutdown]) -> bool:
        """Apply the responses in order; True once the loop must stop."""
        queued = _th.recorder.enabled
        if queued:
            self._record_queued(responses)
        for resp in responses:
            kind = type(resp)
            if kind is Bucket:
                self._run(resp, queued)  # type: ignore[arg-type]
            elif kind is Failure:
                self._fail(resp)  # type: ignore[arg-type]
            elif kind is JoinDone:
                op = self._queue.pop_join()
                if op is not None:
                    op.complete(result=op.finish([resp.last_rank]))  # type: ignore[union-attr]
            elif kind is Shutdown:
                self._queue.fail_all(resp.reason)  # type: ignore[union-attr]
                return True
        return False  # a CacheDrop concerns a worker's cache only

    def _member(self, process_set_id: int) -> GroupInfo | None:
        info = self._process_sets.get(process_set_id)
        return info if info is not None and info.index >= 0 else None

    def _fail(self, failure: Failure) -> None:
        if self._member(failure.process_set_id) is None:
            return
        op = self._queue.pop(failure.process_set_id, failure.name)
        if op is None:
            return
        rec = _th.recorder
        if rec.enabled and op.request is not None:
            rec.end(op.request.name, "NEGOTIATE_" + op.request.kind.upper())
        op.complete(error=CollectiveRefusedError(failure.message))

    def _record_queued(self, responses: list[Response | Shutdown]) -> None:
        """The buckets of one response wait their turn on the data path: negotiation is over for
        all of them now, and each one's QUEUE lasts until it runs."""
        rec = _th.recorder
        for resp in responses:
            if type(resp) is Bucket and self._member(resp.process_set_id) is not None:
                kind = resp.kind.upper()
                for e in resp.entries:
                    rec.end(e.name, "NEGOTIATE_" + kind)
                    rec.begin(e.name, kind)
                    rec.begin(e.name, "QUEUE")

    def _run(self, bucket: Bucket, queued: bool) -> None:
        """Run a bucket; `queued`: its QUEUE phase was recorded and ends now."""
        info = self._member(bucket.process_set_id)
        if info is None:
            return
        ops = self._queue.pop_bucket(bucket.process_set_id, bucket.entries)
        if queued:
            for e in bucket.entries:
                _th.recorder.end(e.name, "QUEUE")
        try:
            run_bucket(bucket, [op.local if op is not None else None for op in ops], info)
        except Exception as exc:
            error = HorovodInternalError(f"{bucket.kind} failed: {type(exc).__name__}: {exc}")
            for op in ops:
                if op is not None:
                    op.complete(error=error)
            raise
        if queued:
            _record_done(bucket)
        _finish(ops)


def _record_done(bucket: Bucket) -> None:
    rec = _th.recorder
    kind = bucket.kind.upper()
    for entry in bucket.entries:
        ref = entry.ref
        args = {
            "dtype": ",".join(ref.dtypes),
            "shape": [list(s) for s in ref.shapes],
            "bytes": ref.nbytes,
        }
        rec.end(entry.name, kind, args)


def _finish(ops: list[Op | None]) -> None:
    """Complete a bucket's operations from their outputs. Waiters are woken once every one is
    done: a caller synchronizing them in turn then blocks (and is woken, a thread hand-over)
    once, not once per operation."""
    waiters = []
    for op in ops:
        if op is None:
            continue
        try:
            op.result = op.finish(op.local.outputs or [])
        except Exception as exc:  # a finishing step (e.g. a copy) failed on this rank only
            op.error = exc
        op.done = True
        if op.event is not None:  # read after `done` was set: see Op
            waiters.append(op.event)
    for event in waiters:
        event.set()
