"""The Ray engine: `hora.run(fn, np=N, backend="ray")` (or `auto` after `ray.init()`) runs each
rank as a Ray actor, one per bundle of a placement group. See docs/ray.md.

- `launcher`: the launcher on the driver (placement group, actors, watching them, stopping).
- `actor`: a rank's actor, which supervises the rank's worker process.
- `options`: the engine's options and `hora run --backend ray`'s session.

Importing this package never imports ray; the engine does, when a job starts.
"""

from hora.engines import Engine
from hora.engines.ray.options import OPTIONS, check_options, ray_is_active

ENGINE = Engine(
    name="ray",
    is_active=ray_is_active,
    launcher="hora.engines.ray.launcher:RayLauncher",
    options=OPTIONS,
    check_options=check_options,
    cli_session="hora.engines.ray.options:cli_session",
    capacity="hora.engines.ray.cluster:capacity",
    summary="one Ray actor per rank in a placement group (RAY_ADDRESS's cluster, else a local Ray)",
)
