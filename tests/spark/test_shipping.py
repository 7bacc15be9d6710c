"""Nothing to install on the executors but torch: hora ships itself (a zip through the session's
Python files) to executors whose Python lacks it, and a notebook's own module goes by value.

Real local Spark: `local[2]` whose executors run a Python with torch and no hora
(tests/_nohora.py), chosen by Spark (`spark.hora.executorPython=spark`), as on a cluster.
"""

from __future__ import annotations

import os
import sys
import uuid

import pytest

import hora
from tests._nohora import make_python_without_hora
from tests.spark.conftest import start_spark, stop_spark

pytestmark = pytest.mark.spark


@pytest.fixture(scope="module")
def spark(tmp_path_factory):
    python = make_python_without_hora(tmp_path_factory.mktemp("no-hora"))
    saved = os.environ.get("PYSPARK_PYTHON")
    os.environ["PYSPARK_PYTHON"] = python  # read once, as the SparkContext starts
    try:
        session = start_spark("local[2]", **{"spark.hora.executorPython": "spark"})
    finally:
        if saved is None:
            os.environ.pop("PYSPARK_PYTHON", None)
        else:
            os.environ["PYSPARK_PYTHON"] = saved
    yield session, python
    stop_spark(session)


def where_hora_is() -> tuple[str, str]:
    import sys

    import hora as rank_hora

    return rank_hora.__file__, sys.executable


def test_hora_ships_itself_to_executors_without_it(spark, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the ranks start in the driver's folder: not hora's checkout
    session, python = spark
    sc = session.sparkContext

    def finds_hora(_partition):  # defined here: pickled by value, as the executors lack tests/
        import importlib.util

        yield importlib.util.find_spec("hora") is not None

    assert sc.parallelize([0], 1).mapPartitions(finds_hora).collect() == [False]
    with pytest.raises(hora.WorkerFailedError, match=r"\(hora differs\)"):
        hora.run(where_hora_is, np=2, ship_code=False)  # as before: hora's own refusal
    found = hora.run(where_hora_is, np=2)  # auto: Spark chose the executors' Python
    for path, executable in found:
        assert executable == python or os.path.realpath(executable) == os.path.realpath(
            sys.executable
        )
        shipped = path.split(os.sep + "hora" + os.sep)[0]
        assert shipped.endswith(".zip") and os.path.basename(shipped).startswith("hora-"), path


def test_a_notebook_module_goes_by_value(spark, tmp_path):
    """A module in a folder only the driver has on its path: `from mymodels import Net`."""
    name = f"mymodels_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(
        "class Net:\n    def forward(self, x):\n        return 2 * x\n\n"
        "def scale():\n    return 3\n"
    )
    sys.path.insert(0, str(tmp_path))
    try:
        module = __import__(name)
    finally:
        sys.path.remove(str(tmp_path))  # the ranks' path (the driver's) no longer has it
    net = module.Net

    def train(x):
        return net().forward(x) * module.scale()

    assert hora.run(train, (7,), np=2, ship_code=True) == [42, 42]
    with pytest.raises(hora.WorkerFailedError, match=f"No module named '{name}'"):
        hora.run(train, (7,), np=2, ship_code=False)
    assert name not in sys.modules or sys.modules[name] is module  # the driver's, untouched
