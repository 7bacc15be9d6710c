"""The local engine: `np` worker processes on this machine, the driver's children."""

from hora.engines import Engine, RanksRun

ENGINE = Engine(
    name="local",
    is_active=lambda: True,
    launcher="hora.engines.local.launcher:LocalLauncher",
    ranks_run=RanksRun.HERE,
    capacity="hora.engines.local.launcher:capacity",
    summary="processes on this machine (the default)",
)
