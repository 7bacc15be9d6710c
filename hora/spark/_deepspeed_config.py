"""A DeepSpeed config checked on the driver, by DeepSpeed's own config classes, before launch.

DeepSpeed ignores a top-level key it does not know (`"zero_optimisation"` trains without ZeRO,
silently) and checks the rest only once every rank has started and imported it. Here the whole
config is parsed as DeepSpeed parses it (its `DeepSpeedConfig` steps and pydantic models, with the
run's real world size for the batch-size arithmetic), and a top-level key that no part of
DeepSpeed reads is refused with the closest known name.
"""

from __future__ import annotations

import contextlib
import copy
import difflib
import json
import os
import re
import sys
from collections.abc import Mapping
from typing import Any

ConfigSource = str | os.PathLike[str] | Mapping[str, Any] | None


class DeepspeedConfigError(ValueError):
    """The DeepSpeed config cannot be used; raised before any rank starts."""


def load(source: ConfigSource) -> dict[str, Any] | None:
    """The config as a dict: a mapping as given, a path's JSON, None for DeepSpeed's defaults."""
    if source is None:
        return None
    if isinstance(source, Mapping):
        try:
            return json.loads(json.dumps(dict(source)))  # what the ranks will read, exactly
        except (TypeError, ValueError) as exc:
            raise DeepspeedConfigError(
                f"deepspeedConfig must be JSON-serialisable (it is written to a file the ranks "
                f"read): {exc}"
            ) from None
    if not isinstance(source, str | os.PathLike):
        raise DeepspeedConfigError(
            "deepspeedConfig must be a dict, the path of a JSON file, or None, got "
            f"{type(source).__name__}"
        )
    path = os.path.abspath(os.fspath(source))
    if not os.path.isfile(path):
        raise DeepspeedConfigError(f"no such DeepSpeed config file: {os.fspath(source)!r}")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        config = json.loads(text, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise DeepspeedConfigError(
            f"the DeepSpeed config {os.fspath(source)!r} is not JSON: {exc.msg} at line "
            f"{exc.lineno}, column {exc.colno}"
        ) from None
    if not isinstance(config, dict):
        raise DeepspeedConfigError(
            f"the DeepSpeed config {os.fspath(source)!r} must hold a JSON object ({{...}}), "
            f"not a {type(config).__name__}"
        )
    return config


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise DeepspeedConfigError(f"the DeepSpeed config names {key!r} twice")
        seen[key] = value
    return seen


def check(config: dict[str, Any], world_size: int) -> None:
    """Raise `DeepspeedConfigError` if DeepSpeed would refuse `config` on `world_size` ranks, or
    would silently ignore one of its top-level keys."""
    try:
        from deepspeed.runtime.config import DeepSpeedConfig
    except ImportError:
        raise DeepspeedConfigError(
            "DeepspeedTorchDistributor needs DeepSpeed on the driver and the workers: "
            "pip install 'hora[deepspeed]' (see README: it builds with --no-build-isolation)"
        ) from None
    unknown = sorted(set(config) - known_top_level_keys())
    if unknown:
        hints = []
        for key in unknown:
            close = difflib.get_close_matches(key, sorted(known_top_level_keys()), n=1)
            hints.append(f"{key!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise DeepspeedConfigError(
            f"the DeepSpeed config has top-level keys DeepSpeed does not read: {', '.join(hints)}; "
            "DeepSpeed would ignore them silently: fix or remove them"
        )
    # DeepSpeedConfig.__init__ takes the world size from an initialised process group, which the
    # driver has not: run its own steps with the run's world size instead.
    parsed = DeepSpeedConfig.__new__(DeepSpeedConfig)
    parsed._param_dict = config
    parsed.global_rank = 0
    parsed.world_size = world_size
    try:
        from deepspeed.runtime import config as ds_config

        ds_config._reject_removed_config_keys(config)
        parsed._initialize_params(copy.copy(config))
        parsed._configure_train_batch_size()
        parsed._do_sanity_check()
    except Exception as exc:  # pydantic's ValidationError, AssertionError, DeepSpeedConfigError
        text = str(exc).strip() or type(exc).__name__
        text = re.sub(r"\n\s*For further information visit \S+", "", text)
        raise DeepspeedConfigError(
            f"DeepSpeed refuses this config (on {world_size} ranks): {text}"
        ) from None


_KNOWN: set[str] = set()
_KEY = re.compile(r"[a-z][a-z0-9_]*\Z")


def known_top_level_keys() -> set[str]:
    """Every name DeepSpeed's modules define as a config key (their UPPER_CASE string constants),
    plus the keys `DeepSpeedConfig` itself reads; a superset of the top-level keys."""
    if _KNOWN:
        return _KNOWN
    from deepspeed.runtime import config as ds_config

    for name, module in list(sys.modules.items()):
        if name.startswith("deepspeed") and module is not None:
            for attr, value in list(vars(module).items()):
                if attr.isupper() and isinstance(value, str) and _KEY.match(value):
                    _KNOWN.add(value)
    _KNOWN.update(ds_config._REMOVED_TOP_LEVEL_CONFIG_KEYS)  # DeepSpeed's own message says why
    _KNOWN.update(_read_by_deepspeed_config())
    return _KNOWN


def _read_by_deepspeed_config() -> set[str]:
    """The keys DeepSpeedConfig looks up (`get`/`[]`/`in`) while parsing an empty config."""
    from deepspeed.runtime.config import DeepSpeedConfig

    seen: set[str] = set()

    class Recording(dict):
        def get(self, key: Any, default: Any = None) -> Any:
            seen.add(key)
            return super().get(key, default)

        def __getitem__(self, key: Any) -> Any:
            seen.add(key)
            return super().__getitem__(key)

        def __contains__(self, key: object) -> bool:
            seen.add(key)  # type: ignore[arg-type]
            return super().__contains__(key)

    parsed = DeepSpeedConfig.__new__(DeepSpeedConfig)
    parsed.global_rank, parsed.world_size = 0, 1
    with contextlib.suppress(Exception):  # only the keys it read matter here
        parsed._initialize_params(Recording(train_batch_size=1))
    return {key for key in seen if isinstance(key, str)}
