"""The public packages' names: each package's `__all__` is built from the modules it star-imports
and from the ops' specs (`hora.collectives.framework.op_faces`), so a name added to a module's
`__all__`, or an op's face added to its spec, reaches every package."""

from __future__ import annotations

import types

import pytest

import hora.collectives
import hora.torch
import hora.torch.mpi_ops
from hora.collectives import _basics, ops
from hora.torch import _autograd

NEUTRAL = (set(_basics.__all__) | set(ops.__all__)) - {"NOT_INITIALIZED"}


def _functions_defined_in(module: types.ModuleType) -> set[str]:
    return {
        name
        for name, value in vars(module).items()
        if isinstance(value, types.FunctionType)
        and value.__module__ == module.__name__
        and not name.startswith("_")
    }


def test_collectives_lists_init_and_ops():
    assert set(hora.collectives.__all__) == NEUTRAL | {"NOT_INITIALIZED"}


def test_torch_mpi_ops_lists_the_neutral_surface_and_the_differentiable_forms():
    assert set(hora.torch.mpi_ops.__all__) == NEUTRAL | _functions_defined_in(_autograd)


def test_torch_lists_mpi_ops():
    assert set(hora.torch.mpi_ops.__all__) <= set(hora.torch.__all__)


def test_tensorflow_lists_init_ranks_and_process_sets():
    hvd = pytest.importorskip("hora.tensorflow")
    assert set(_basics.__all__) - {"NOT_INITIALIZED"} <= set(hvd.__all__)


@pytest.mark.parametrize(
    "module", ["hora.collectives", "hora.torch", "hora.tensorflow", "hora.tensorflow.keras"]
)
def test_every_listed_name_exists(module):
    package = pytest.importorskip(module)
    assert [name for name in package.__all__ if not hasattr(package, name)] == []


def test_import_hora_reaches_its_subpackages_without_importing_torch_or_pyarrow():
    """`import hora; hora.data.from_spark(...)` works as `import ray; ray.data` does, and a
    plain `import hora` (a driver, the CLI) pays for neither torch nor pyarrow."""
    import subprocess
    import sys

    code = (
        "import sys, hora\n"
        "heavy = [m for m in ('torch', 'pyarrow', 'pyspark') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "assert callable(hora.data.from_spark) and callable(hora.data.from_parquet)\n"
        "assert hora.spark.TorchDistributor and hora.storage.Location\n"
        "try:\n"
        "    hora.nothing\n"
        "except AttributeError as e:\n"
        "    assert 'nothing' in str(e)\n"
        "else:\n"
        "    raise AssertionError('hora.nothing')\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
