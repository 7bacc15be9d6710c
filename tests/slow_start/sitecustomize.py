"""Put on PYTHONPATH by a test: the rank named in HORA_TEST_SLOW_RANK starts 60 s late."""

import os
import time

if os.environ.get("HORA_TEST_SLOW_RANK") == os.environ.get("RANK"):
    time.sleep(60)
