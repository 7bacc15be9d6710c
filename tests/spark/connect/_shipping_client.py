"""A Connect client (its own process) for test_shipping.py: `python _shipping_client.py URL FOLDER`
runs a job with shipping off, then on, and prints one line `RESULT <json>`."""

from __future__ import annotations

import json
import os
import sys

from pyspark.sql import SparkSession

import hora


def where() -> str:
    import hora as rank_hora

    return rank_hora.__file__


def main(url: str, folder: str) -> None:
    spark = SparkSession.builder.remote(url).getOrCreate()
    os.chdir(folder)  # the ranks start in the client's folder: not hora's checkout
    out: dict[str, object] = {}
    try:
        hora.run(where, np=2, ship_code=False)
    except hora.WorkerFailedError as exc:
        out["off"] = str(exc).splitlines()[0]
    out["on"] = hora.run(where, np=2)
    spark.stop()
    print("RESULT " + json.dumps(out), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
