# One place for set-up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# The venv's tools first (its ninja above all): torch's extension builds keep a ninja log that
# another ninja version does not read, so a driver and ranks that find different ninjas rebuild
# DeepSpeed's ops for each other (the multi-host tests' hosts put the venv first too).
WITH_VENV_TOOLS := PATH="$(abspath $(VENV))/bin:$$PATH"

.PHONY: setup nftables demo test lint bench clean

setup: $(STAMP) nftables

# nftables' `nft`: the multi-host tests (tests/cluster, root only) make a host's link lossy, or
# drop everything on it for a while, with nft rules (kernels without netem have no other way).
# Installed by root where apt-get is (as on CI); nothing is done where `nft` is there already,
# and nothing as another user (those tests are skipped without root).
nftables:
	@command -v nft >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1 || \
		{ apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }

# torch==2.13.0 goes in first and alone: anything that pulls a plain `torch` later is then satisfied
# and pip does not download a multi-GB CUDA build. DeepSpeed is an sdist whose setup imports torch
# (--no-build-isolation: it builds against this torch, no op compiled at install); the op its CPU
# accelerator loads in every init_distributed and its default optimizers' CPU ops (Adam/AdamW:
# fused_adam, cpu_adam under ZeRO-Offload) are built here, into torch's extension cache, where
# DeepSpeed itself finds them; an op missing there is built once per host in the job.
# Mosaic Streaming (the data tests' and bench/data.py's comparison) goes in with --no-deps and
# the `mosaic` extra's modules: its own requirements would replace torch with a CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -e '.[dev]'
	DS_BUILD_OPS=0 $(PY) -m pip install -q --no-build-isolation -e '.[deepspeed]'
	$(WITH_VENV_TOOLS) $(PY) -m hora._deepspeed_ops
	$(PY) -m pip install -q -e '.[estimator]'
	$(PY) -m pip install -q -e '.[clients]'
	$(PY) -m pip install -q -e '.[mosaic]'
	$(PY) -m pip install -q --no-deps 'mosaicml-streaming==0.13.0'
	touch $(STAMP)

demo: setup
	$(PY) examples/digits.py
	$(PY) examples/keras_digits.py
	$(PY) examples/sharded_demo.py
	$(PY) examples/estimator_digits.py

test: setup
	$(VENV)/bin/ruff check hora tests bench examples
	$(PY) .ci/mypy_baseline.py
	$(WITH_VENV_TOOLS) $(PY) -m pytest -q

lint: setup
	$(VENV)/bin/ruff check hora tests bench examples
	$(VENV)/bin/ruff format --check hora tests bench examples

bench: setup
	$(PY) bench/launch.py

clean:
	rm -rf $(VENV) build *.egg-info
