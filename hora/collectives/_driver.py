"""The collectives' one hook to a hora run's driver: every word hora.collectives says to it or
hears from it passes here, and no other module of the package imports `hora.wire.link` or the
rank's half of the elastic talk (`hora.elastic`).

Outside a hora worker (torchrun, a plain process) there is no driver: each call here does
nothing, says there is none, or hears nothing, and the collectives work as Horovod's do.
"""

from __future__ import annotations

from hora.collectives._control.stall import StallNotice, log_stall
from hora.elastic import GROW_IN_PLACE as GROW_IN_PLACE
from hora.elastic import ResizeExit as ResizeExit
from hora.elastic import announce_in_place as announce_in_place
from hora.elastic import await_reform as await_reform
from hora.elastic import begin as begin
from hora.elastic import generation as generation
from hora.elastic import grown as grown
from hora.elastic import growth_word as growth_word
from hora.elastic import reformed as reformed
from hora.elastic import say_formed as say_formed
from hora.elastic import say_joining as say_joining
from hora.elastic import say_reformed as say_reformed
from hora.elastic import say_resumed as say_resumed
from hora.elastic import wait_reform as wait_reform
from hora.elastic import watching_reforms as watching_reforms
from hora.wire import link
from hora.wire.protocol import Stall


def attached() -> bool:
    """Whether this process is a hora worker, with a driver to tell and to hear from."""
    return link.current() is not None


def negotiation_key() -> bytes | None:
    """The key the run's secret derives for the negotiation tree; None outside a hora worker."""
    driver = link.current()
    return driver.negotiation_key if driver is not None else None


def steps_reported() -> int:
    """`hora.report`'s own step count on this rank (0 outside a hora worker)."""
    driver = link.current()
    return driver.steps_reported if driver is not None else 0


def set_steps_reported(steps: int) -> None:
    """Take a world's step count (a rank new to a world re-formed in place counts on from it)."""
    driver = link.current()
    if driver is not None:
        driver.steps_reported = steps


def report_stall(text: str | None) -> None:
    """A stall, to the driver (None: the stall is over), else to rank 0's stderr."""
    missing = text.missing if isinstance(text, StallNotice) else ()
    stopping = isinstance(text, StallNotice) and text.stopping
    try:
        if link.send_to_driver(Stall(text if text is None else str(text), missing, stopping)):
            return
    except OSError:
        pass  # the driver is gone; this process will be stopped soon
    log_stall(text)
