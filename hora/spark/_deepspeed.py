"""`DeepspeedTorchDistributor`: pyspark's DeepSpeed door, on hora's engines.

pyspark runs `python -m torch.distributed.run ... script args --deepspeed --deepspeed_config
<tmp.json>` and never removes the temp file. Here the script runs in hora's ranks (hora's logs,
failures, restarts, GPU pinning and timeline) with the same two arguments appended; a dict config
is written where every rank reads it and removed when the run ends, failed or not; and the config
is checked by DeepSpeed's own config classes on the driver, so a typo is an error before launch;
in local mode, so is an op the config needs that this host cannot build (hora._deepspeed_ops).
"""

from __future__ import annotations

import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

from hora import _deepspeed_ops
from hora._script import check_script, run_script
from hora.job import launch
from hora.spark import _deepspeed_config
from hora.spark._deepspeed_config import ConfigSource, DeepspeedConfigError
from hora.spark._distributor import TorchDistributor, positive_int

#: pyspark's DeepSpeed door's own opt-in to unencrypted training on a TLS cluster
DEEPSPEED_IGNORE_SSL = "deepspeed.spark.distributor.ignoreSsl"

#: The keyword a training function receives the config under (as a dict), if it takes it.
CONFIG_KEYWORD = "deepspeed_config"
CONFIG_FILE = "deepspeed_config.json"


class DeepspeedTorchDistributor(TorchDistributor):
    """pyspark.ml.deepspeed.deepspeed_distributor.DeepspeedTorchDistributor's contract on hora.

    `numGpus` processes per node times `nnodes` nodes is the number of ranks (pyspark's meaning:
    in local mode all of them run on the driver; a bool counts as its value, so pyspark's
    `numGpus=True` is one). `localMode`, `useGpu`: as TorchDistributor's, refused in the same
    moments with the same errors. `deepspeedConfig`: a dict, the path of a JSON file, or None
    (DeepSpeed's defaults). On a TLS cluster, pyspark's `deepspeed.spark.distributor.ignoreSsl`
    (or hora's `spark.hora.ignoreSsl`) opts in to unencrypted training.

    A script gets `--deepspeed --deepspeed_config <path>` after its own arguments (only
    `--deepspeed` without a config). A function gets the config as a dict through the keyword
    `deepspeed_config=` when its signature takes that keyword (or `**kwargs`); pyspark passes a
    function nothing, so a function without it runs as on pyspark. `max_restarts` (hora only,
    keyword): restart every rank up to that many times when one fails.
    """

    _IGNORE_SSL_KEY = DEEPSPEED_IGNORE_SSL
    _LOCAL_MODE = "localMode"

    def __init__(
        self,
        numGpus: int = 1,
        nnodes: int = 1,
        localMode: bool = True,
        useGpu: bool = True,
        deepspeedConfig: ConfigSource = None,
        *,
        max_restarts: int = 0,
        min_np: int | None = None,
        max_np: int | None = None,
    ):
        if min_np is not None or max_np is not None:
            raise ValueError(
                "DeepspeedTorchDistributor cannot run an elastic job (min_np/max_np): a ZeRO "
                "checkpoint loads only at the world size that saved it (DeepSpeed's universal "
                "checkpoint is an offline conversion). Use max_restarts, or TorchDistributor "
                "with hvd.elastic and FSDP2 (docs/elastic.md)"
            )
        processes = positive_int("numGpus", numGpus) * positive_int("nnodes", nnodes)
        super().__init__(processes, localMode, useGpu, max_restarts=max_restarts)
        self.deepspeed_config = deepspeedConfig
        self._config = _deepspeed_config.load(deepspeedConfig)  # not JSON: an error here
        self._checked = False

    def run(self, train_object: Callable[..., Any] | str, *args: Any, **kwargs: Any) -> Any:
        """Run the script at path `train_object` with string arguments `args` plus DeepSpeed's,
        and return None; or run `train_object(*args, **kwargs)` on every rank and return rank 0's
        value."""
        if self._config is not None and not self._checked:
            _deepspeed_config.check(self._config, self.num_processes)
            self._checked = True
        if self.local_mode and self._config is not None:  # the ranks' host is this one
            _deepspeed_ops.refuse_unbuildable(self._config)
        config = self._run_config
        if not isinstance(train_object, str | os.PathLike):
            if _takes_config(train_object):
                if CONFIG_KEYWORD in kwargs:
                    raise ValueError(
                        f"pass the DeepSpeed config as deepspeedConfig=, not as the keyword "
                        f"{CONFIG_KEYWORD}= of run(): the distributor gives it to the function"
                    )
                kwargs = {**kwargs, CONFIG_KEYWORD: self._config}
            return launch(train_object, args, kwargs, config)[0]
        if kwargs:
            raise ValueError(
                "a script takes only string arguments (run(path, '--lr=0.1', ...)); keyword "
                f"arguments {sorted(kwargs)} cannot be passed to it"
            )
        script = check_script(os.fspath(train_object))
        argv = [str(a) for a in args]
        if self._config is None:
            argv.append("--deepspeed")
            launch(run_script, (script, argv), {}, config)
        elif self.local_mode:  # one file on the driver, read by every rank, removed by the driver
            with _config_file(self.deepspeed_config, self._config) as path:
                argv += ["--deepspeed", "--deepspeed_config", path]
                launch(run_script, (script, argv), {}, config)
        else:  # executors do not see the driver's files: each rank writes its own copy
            text = json.dumps(self._config)
            job_args = (script, argv, text)
            launch(_run_with_config, job_args, {}, config)
        return None


class _config_file:
    """The path every local rank reads: the user's file as it is, or a dict written to a private
    temporary folder that is removed on the way out, whatever happened in the run."""

    def __init__(self, source: ConfigSource, config: dict[str, Any]):
        self.source, self.config = source, config
        self.folder: str | None = None

    def __enter__(self) -> str:
        if isinstance(self.source, str | os.PathLike):
            return os.path.abspath(os.fspath(self.source))
        self.folder = tempfile.mkdtemp(prefix="hora-deepspeed-")
        path = os.path.join(self.folder, CONFIG_FILE)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(self.config, f)
        return path

    def __exit__(self, *exc: object) -> None:
        if self.folder is not None:
            shutil.rmtree(self.folder, ignore_errors=True)


def _run_with_config(script: str, argv: list[str], config_text: str) -> None:
    """On a Spark rank: write the config to this rank's own temp folder, run, remove it."""
    folder = tempfile.mkdtemp(prefix="hora-deepspeed-")
    try:
        path = os.path.join(folder, CONFIG_FILE)
        with open(path, "w", encoding="utf-8") as f:
            f.write(config_text)
        run_script(script, [*argv, "--deepspeed", "--deepspeed_config", path])
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _takes_config(fn: Callable[..., Any]) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable: nothing to inspect
        return False
    return any(
        p.kind is p.VAR_KEYWORD
        or (p.name == CONFIG_KEYWORD and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )


__all__ = ["CONFIG_KEYWORD", "DeepspeedConfigError", "DeepspeedTorchDistributor"]
