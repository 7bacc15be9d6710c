"""The Ray engine: `hora.run(fn, np=N, backend="ray")` (or `auto` after `ray.init()`) runs each
rank as a Ray actor, one per bundle of a placement group. See docs/ray.md.

Importing this package never imports ray; the engine does, when a job starts.
"""
