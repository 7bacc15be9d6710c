"""DeepSpeed's compiled ops under hora: an `AdamW` config's `fused_adam` is built once per host by
the ranks (one builds, the others wait), in DeepSpeed's own cache, and later runs and `make
setup`'s command load it without building; where nothing can be built the run stops with the
way out, on the driver before launch or in the rank that finds out."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("deepspeed", reason="DeepSpeed is not installed (pip install hora[deepspeed])")

from hora import Runner, _deepspeed_ops
from hora.errors import HoraError
from hora.spark import DeepspeedTorchDistributor
from tests.deepspeed import _ranks
from tests.deepspeed.conftest import ADAMW, BUILD_TIMEOUT, BuiltCache
from tests.deepspeed.test_door import SCRIPT, _seen, _trained

BUILDING = "hora: building DeepSpeed's 'fused_adam' op"
BUILT = "hora: built DeepSpeed's 'fused_adam' op"
WAITING = "hora: waiting for DeepSpeed's 'fused_adam' op"
NO_COMPILER = {"CXX": "/nonexistent/c++"}


def _lines(output: str, needle: str) -> list[str]:
    return [line for line in output.splitlines() if needle in line]


@pytest.mark.timeout(BUILD_TIMEOUT)
def test_adamw_config_builds_fused_adam_once_for_the_host(fused_adam_cache: BuiltCache):
    output = fused_adam_cache.first_output
    print(f"first run, build included: {fused_adam_cache.first_seconds:.0f} s")
    building, built = _lines(output, BUILDING), _lines(output, BUILT)
    assert len(building) == 1 and len(built) == 1, output  # one rank built it, for both
    assert building[0].startswith(("[0] ", "[1] "))  # a rank's line, relayed to the driver
    assert len(_lines(output, WAITING)) <= 1  # the other rank waited (unless it came late)
    assert fused_adam_cache.built_op.is_file()  # in the cache DeepSpeed's own jit_load reads
    _trained(_seen(fused_adam_cache.first_out), stage=2)


@pytest.mark.timeout(BUILD_TIMEOUT)
def test_a_second_run_loads_the_op_without_building(
    fused_adam_cache: BuiltCache, monkeypatch, capfd, tmp_path
):
    built_at = fused_adam_cache.built_op.stat().st_mtime_ns
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(fused_adam_cache.folder))
    DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=ADAMW).run(
        _ranks.function, str(tmp_path)
    )
    output = capfd.readouterr().out
    assert not _lines(output, "hora: building") and not _lines(output, WAITING), output
    assert fused_adam_cache.built_op.stat().st_mtime_ns == built_at
    _trained(_seen(tmp_path), stage=2)

    # `make deepspeed-ops`' command, on a built op: it loads it, under the same lock, and says where
    done = subprocess.run(
        [sys.executable, "-m", "hora._deepspeed_ops", "FusedAdamBuilder"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert f"fused_adam op is built in {fused_adam_cache.folder / 'fused_adam'}" in done.stdout
    assert "hora: building" not in done.stdout
    assert fused_adam_cache.built_op.stat().st_mtime_ns == built_at


def test_an_unbuildable_op_stops_a_local_run_before_any_rank_starts(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "cold"))
    monkeypatch.setenv("CXX", NO_COMPILER["CXX"])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(_deepspeed_ops.DeepspeedBuildImpossible) as caught:
        DeepspeedTorchDistributor(2, useGpu=False, deepspeedConfig=ADAMW).run(
            SCRIPT, "--out", str(out)
        )
    message = str(caught.value)
    assert "'fused_adam' op" in message and "/nonexistent/c++" in message
    assert "python -m hora._deepspeed_ops FusedAdamBuilder" in message
    assert '"torch_adam": true' in message and _deepspeed_ops.ALLOW_VAR in message
    assert not list(out.iterdir())  # no rank ran


def test_an_unbuildable_op_stops_the_rank_that_finds_out(tmp_path, monkeypatch):
    """Where the driver cannot know (a cluster's hosts, an op no config names), the rank says."""
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    with pytest.raises(HoraError, match=r"DeepspeedBuildImpossible: .*'fused_adam' op.*c\+\+"):
        Runner(-1, env=NO_COMPILER).run(_ranks.load_op, builder="FusedAdamBuilder")
    assert not (tmp_path / "fused_adam" / "fused_adam.so").exists()


def test_the_ops_a_config_needs():
    assert _deepspeed_ops.needed_builders(ADAMW) == ("FusedAdamBuilder",)
    adam = {"optimizer": {"type": "Adam"}}
    assert _deepspeed_ops.needed_builders(adam) == ("FusedAdamBuilder",)
    offload = {**adam, "zero_optimization": {"offload_optimizer": {"device": "cpu"}}}
    assert _deepspeed_ops.needed_builders(offload) == ("CPUAdamBuilder",)
    torch_adam = {"optimizer": {"type": "AdamW", "params": {"torch_adam": True}}}
    assert _deepspeed_ops.needed_builders(torch_adam) == ()
    assert _deepspeed_ops.needed_builders({"optimizer": {"type": "SGD"}}) == ()
    assert _deepspeed_ops.needed_builders({}) == ()


def test_a_lock_file_left_by_a_killed_build_is_removed_a_held_one_kept(tmp_path):
    """torch's own lock: a killed build leaves it and torch would wait for it forever."""
    lock = tmp_path / _deepspeed_ops.TORCH_LOCK_FILE
    fd = os.open(lock, os.O_CREAT | os.O_EXCL)  # as torch's FileBaton holds it while building
    try:
        _deepspeed_ops._remove_abandoned_torch_lock(str(tmp_path))
        assert lock.exists()
    finally:
        os.close(fd)
    _deepspeed_ops._remove_abandoned_torch_lock(str(tmp_path))
    assert not lock.exists()
