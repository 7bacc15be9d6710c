"""hora ships itself to a Spark Connect server's executors as a session artifact: a server over
`local[2]` whose tasks run a Python with torch and no hora (tests/_nohora.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests._nohora import make_python_without_hora
from tests.spark.connect._server import ConnectServer
from tests.spark.connect.conftest import require_spark_connect

require_spark_connect()
pytestmark = pytest.mark.spark

HERE = Path(__file__).parent


def test_connect_executors_without_hora_get_the_client_s(tmp_path):
    python = make_python_without_hora(tmp_path / "no-hora")
    server = ConnectServer.start("local[2]", python, tmp_path / "server.log", dict(os.environ))
    try:
        done = subprocess.run(
            [sys.executable, str(HERE / "_shipping_client.py"), server.url, str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=400,
        )
    finally:
        server.stop()
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-3000:] + done.stderr[-3000:]
    out = json.loads(lines[-1][len("RESULT ") :])
    assert "(hora differs)" in out["off"]  # not shipped: hora's own refusal, as before
    for path in out["on"]:
        shipped = path.split(os.sep + "hora" + os.sep)[0]
        assert os.path.basename(shipped).startswith("hora-") and shipped.endswith(".zip"), path
