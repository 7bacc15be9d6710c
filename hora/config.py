"""The one validated description of a run: every door (Runner, run, the CLI) builds one of these.

Bad input fails here, before anything is launched, with a message that says what to change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from hora import _shipping, engines

#: an engine's name: the public keyword is `backend=` (Horovod's, pyspark's); hora.engines lists
#: the engines
Backend = str
Verbosity = Literal["all", "log_callback_only"]
#: gets the ranks' `hora.report` metrics: called with (step, metrics) for every complete step;
#: its `close()`, if it has one, at the end of the run
Reporter = Callable[[int, dict[str, Any]], None]
VERBOSITIES = ("all", "log_callback_only")
#: max_restarts of an elastic run when none is given: every shrink and growth is an attempt, so
#: 0 would make it fixed; Horovod's elastic driver resets up to its reset limit in the same way
ELASTIC_MAX_RESTARTS = 10


@dataclass(frozen=True)
class RunConfig:
    """How many processes, on which engine, under which limits."""

    np: int
    backend: Backend = engines.DEFAULT
    driver_log_verbosity: Verbosity = "all"
    start_timeout: float = 600.0
    timeout: float | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    #: how many attempts may follow the first (after a failure, or to resize an elastic run);
    #: None: 0, or ELASTIC_MAX_RESTARTS when the run is elastic
    max_restarts: int | None = None
    #: horovodrun's --output-filename: a folder where each rank's output also goes, to
    #: `rank.<rank>/stdout` and `rank.<rank>/stderr` (written by the driver); made absolute
    output_filename: str | None = None
    #: the engine's own options (hora.engines: each engine declares which it takes), checked
    #: and completed with the engine's defaults
    engine_options: Mapping[str, Any] = field(default_factory=dict)
    #: a cluster engine's GPU pinning: True gives every rank its GPUs (CUDA_VISIBLE_DEVICES),
    #: False none, None pins when the cluster gives ranks GPUs (the doors' `use_gpu`)
    use_gpu: bool | None = None
    #: whether every rank's return value comes back (hora.run), or only rank 0's (Runner.run,
    #: the pyspark doors): the others are then not even pickled
    collect_all: bool = True
    #: who gets the ranks' `hora.report` metrics, one call `(step, metrics)` per complete step
    #: (hora.reporters.TensorBoard, MLflow, or any callable); a `close()` is called at the end
    report_to: Sequence[Reporter] | Reporter = ()
    #: whether the driver prints a line per reported step
    progress: bool = True
    #: an elastic run (Horovod's --min-np/--max-np): after a failure it restarts with as many
    #: ranks as the cluster can run (never fewer than min_np, never more than max_np), and it
    #: grows back at a commit when slots return. Either one makes the run elastic; the other
    #: then defaults to np, as in horovodrun.
    min_np: int | None = None
    max_np: int | None = None
    #: whether hora ships itself and the user's own modules to the ranks (hora._shipping): None
    #: is HORA_SHIP_CODE's choice, by default "auto" (where the ranks may lack the code)
    ship_code: bool | None = None

    def __post_init__(self) -> None:
        if isinstance(self.np, bool) or not isinstance(self.np, int) or self.np <= 0:
            raise ValueError(f"the number of processes must be a positive int, got np={self.np!r}")
        engines.get(self.backend)  # an unknown name fails here, listing the engines
        if not isinstance(self.engine_options, Mapping):
            raise ValueError(f"engine_options must be a dict, got {self.engine_options!r}")
        options = engines.check_options(self.backend, self.engine_options)
        object.__setattr__(self, "engine_options", options)
        if self.driver_log_verbosity not in VERBOSITIES:
            raise ValueError(
                f"driver_log_verbosity must be one of {VERBOSITIES}, "
                f"got {self.driver_log_verbosity!r}"
            )
        _check_seconds("start_timeout", self.start_timeout)
        if self.timeout is not None:
            _check_seconds("timeout", self.timeout)
        self._check_elastic()
        if self.max_restarts is None:
            object.__setattr__(self, "max_restarts", ELASTIC_MAX_RESTARTS if self.elastic else 0)
        if (
            isinstance(self.max_restarts, bool)
            or not isinstance(self.max_restarts, int)
            or self.max_restarts < 0
        ):
            raise ValueError(
                "max_restarts must be an int >= 0 (how many times a failed run is restarted), "
                f"got {self.max_restarts!r}"
            )
        bad = {k: v for k, v in dict(self.env).items() if not (_is_str(k) and _is_str(v))}
        if bad:
            raise ValueError(f"env must map str to str; fix these entries: {bad!r}")
        if self.output_filename is not None:
            object.__setattr__(self, "output_filename", _output_folder(self.output_filename))
        if self.use_gpu is not None and not isinstance(self.use_gpu, bool):
            raise ValueError(f"use_gpu must be True, False or None, got {self.use_gpu!r}")
        self.reporters()  # a bad value fails here
        _shipping.setting(self.ship_code)  # a bad value (or HORA_SHIP_CODE) fails here

    def reporters(self) -> tuple[Reporter, ...]:
        """`report_to` as a tuple (one reporter needs no list); a ValueError for anything else."""
        given = self.report_to
        reporters = (given,) if callable(given) else tuple(given)
        if not all(callable(r) for r in reporters):
            raise ValueError(
                "report_to must be a list of callables taking (step, metrics), such as "
                f"hora.reporters.TensorBoard(log_dir); got {given!r}"
            )
        return reporters

    @property
    def elastic(self) -> bool:
        """Whether the run may change its number of ranks (min_np or max_np was given)."""
        return self.min_np is not None or self.max_np is not None

    @property
    def fewest_ranks(self) -> int:
        """The fewest ranks an attempt of the run may have, or a world re-formed in place:
        `min_np` where the run is elastic (np unless given, `_check_elastic`), else np."""
        return self.np if self.min_np is None else self.min_np

    @property
    def most_ranks(self) -> int:
        """The most ranks any attempt of the run may have (`hora.engines.most_ranks`)."""
        return engines.most_ranks(self.np, self.max_np)

    def _check_elastic(self) -> None:
        """1 <= min_np <= np <= max_np, ints, on an engine that can count its free slots."""
        if not self.elastic:
            return
        for name in ("min_np", "max_np"):
            value = getattr(self, name)
            if value is None:
                object.__setattr__(self, name, self.np)
            elif isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {name}={value!r}")
        if not self.min_np <= self.np <= self.max_np:  # type: ignore[operator]
            raise ValueError(
                f"an elastic run needs min_np <= np <= max_np, got min_np={self.min_np}, "
                f"np={self.np}, max_np={self.max_np}"
            )
        if not engines.get(self.backend).capacity:
            raise ValueError(
                f"the {self.backend!r} engine cannot count its free slots, so it cannot run an "
                "elastic job (min_np/max_np); drop them, or use the local, Spark or Ray engine"
            )


def _is_str(value: object) -> bool:
    return isinstance(value, str)


def _output_folder(value: object) -> str:
    if not isinstance(value, str | os.PathLike) or not os.fspath(value):
        raise ValueError(f"output_filename must be a folder's path, got {value!r}")
    folder = os.path.abspath(os.fspath(value))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise ValueError(
            f"output_filename={os.fspath(value)!r} is a file; it must be a folder (hora writes "
            "rank.<rank>/stdout and rank.<rank>/stderr in it): choose another path"
        )
    return folder


def _check_seconds(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
