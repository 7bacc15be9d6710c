"""hora on Ray nodes without installing it: the actors' `runtime_env` carries this hora.

Ray takes a local folder as `py_modules` only in `ray.init`'s job-wide runtime_env; an actor's
own needs a URI. So the folder is uploaded to the cluster's store as `ray.init` would (once per
content: Ray names the package by its hash) and the actors name that URI. Each Ray worker then
has it first on its path, and the rank's supervisor hands it on to the rank's interpreter
(`hora.engines.rank_pythonpath`).
"""

from __future__ import annotations

import tempfile
from typing import Any

from hora import engines


def hora_runtime_env() -> dict[str, Any]:
    """`{"py_modules": [<URI of this hora in the cluster's store>]}`."""
    from ray._private.runtime_env import py_modules

    upload: Any = py_modules.upload_py_modules_if_needed  # Ray's own, as ray.init calls it
    env = {"py_modules": [engines.hora_package_dir()]}
    scratch = tempfile.gettempdir()
    try:
        return dict(upload(env, include_gitignore=True, scratch_dir=scratch))
    except TypeError:  # an older Ray (>= 2.9): no include_gitignore
        return dict(upload(env, scratch_dir=scratch))
