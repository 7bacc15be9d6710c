"""The hora timeline: every collective of every rank in one Chrome trace, cheap enough to leave on.

`HOROVOD_TIMELINE=/path/trace.json` (or `HORA_TIMELINE`) records from `hvd.init()`;
`HOROVOD_TIMELINE=DYNAMIC` lets `start_timeline` / `stop_timeline` choose when;
`timeline_context("forward")` marks user regions; `hora timeline summary trace.json` prints where
the time went. See docs/timeline.md.

Beside the user's calls, the two ends hora itself calls: a rank's collective loop starts and
ends its recording with `on_init` / `on_shutdown` (`hvd.init()`, `hvd.shutdown()`), and the
driver writes every rank's events with a `DriverTimeline`. The loop reports its phases through
`hooks`.
"""

from hora.timeline._control import on_init as on_init
from hora.timeline._control import on_shutdown as on_shutdown
from hora.timeline._control import start_timeline as start_timeline
from hora.timeline._control import stop_timeline as stop_timeline
from hora.timeline._control import timeline_context as timeline_context
from hora.timeline._control import timeline_setting as timeline_setting
from hora.timeline._driver import DriverTimeline as DriverTimeline
from hora.timeline._summary import load_trace as load_trace
from hora.timeline._summary import summarize as summarize
from hora.timeline._summary import summary_text as summary_text

__all__ = [
    "DriverTimeline",
    "load_trace",
    "on_init",
    "on_shutdown",
    "start_timeline",
    "stop_timeline",
    "summarize",
    "summary_text",
    "timeline_context",
    "timeline_setting",
]
