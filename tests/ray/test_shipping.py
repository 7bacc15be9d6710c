"""hora ships itself to Ray workers that lack it: a local Ray head on 127.0.0.1 whose workers'
PYTHONPATH hides hora (tests/_nohora.py, through the job's runtime_env), so every actor imports
the copy that hora gave it (`runtime_env` `py_modules`)."""

from __future__ import annotations

import os

import pytest

import hora
from tests._nohora import hide_hora
from tests.ray.conftest import start_ray, stop_ray

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def ray_without_hora(tmp_path_factory):
    folder = tmp_path_factory.mktemp("no-hora")
    site = hide_hora(folder)
    here = os.getcwd()
    os.chdir(folder)  # Ray puts the driver's folder (hora's checkout) on its workers' path
    try:
        start_ray(num_cpus=2, runtime_env={"env_vars": {"PYTHONPATH": site}})
    finally:
        os.chdir(here)
    yield
    stop_ray()


def where_hora_is() -> str:
    import hora as rank_hora

    return rank_hora.__file__


def test_ray_workers_without_hora_get_the_driver_s(ray_without_hora, tmp_path, monkeypatch):
    import ray

    monkeypatch.chdir(tmp_path)  # the ranks start in the driver's folder: not hora's checkout

    @ray.remote
    def finds_hora() -> bool:
        import importlib.util

        return importlib.util.find_spec("hora") is not None

    assert ray.get(finds_hora.remote()) is False
    found = hora.run(where_hora_is, np=2, backend="ray", ship_code=True, timeout=240)
    here = os.path.dirname(os.path.dirname(hora.__file__))
    for path in found:
        assert not path.startswith(here + os.sep) and "runtime_resources" in path, path
