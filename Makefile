# One place for set-up: `make demo` and `make test` work on a fresh machine.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# The installer: uv (from PyPI, into the venv) where it can be had, else pip; `make setup
# INSTALLER=pip` installs with pip alone. .ci/install takes pip install's arguments either way.
INSTALLER ?= uv
export INSTALLER
INSTALL := .ci/install $(VENV)
STAMP := $(VENV)/.installed
# The venv's tools first (its ninja above all): torch's extension builds keep a ninja log that
# another ninja version does not read, so a driver and ranks that find different ninjas rebuild
# DeepSpeed's ops for each other (the multi-host tests' hosts put the venv first too).
WITH_VENV_TOOLS := env PATH="$(abspath $(VENV))/bin:$$PATH"
# Each set-up and demo step says how long it took (`== step NAME: N s`), and a target, when done,
# how long make has run (`== TARGET done: N s in all`).
START := $(shell date +%s)
STEP := @.ci/step
TOTAL = @.ci/step --total "$@" $(START)

.PHONY: setup deepspeed-ops nftables demo test test-slow lint bench clean

# Installs, and builds nothing: DeepSpeed's ops come with `make test` and `make bench`, and the one
# op the demo needs just before the demo that needs it (see deepspeed-ops below).
setup: $(STAMP) nftables
	$(TOTAL)

# nftables' `nft`: the multi-host tests (tests/cluster, root only) make a host's link lossy, or
# drop everything on it for a while, with nft rules (kernels without netem have no other way).
# Installed by root where apt-get is (as on CI); nothing is done where `nft` is there already,
# and nothing as another user (those tests are skipped without root).
nftables:
	@command -v nft >/dev/null || [ "$$(id -u)" != 0 ] || ! command -v apt-get >/dev/null || \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null 2>&1 || \
		{ apt-get update -qq && \
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nftables >/dev/null; }

# torch==2.13.0 goes in first and alone: anything that pulls a plain `torch` later is then
# satisfied and no multi-GB CUDA build is downloaded. pip picks its wheel (this machine's pip
# configuration may name a local CPU wheel, a mirror or a constraint: uv reads none of pip's) and
# uv installs it; the extras' run names torch==2.13.0 again, so that no resolver replaces it. The
# rest is one resolver run. DeepSpeed is an sdist whose setup imports torch: --no-build-isolation
# (it builds against this torch; hora and pyspark's sdist build with the venv's setuptools,
# brought up to date by the bootstrap) and DS_BUILD_OPS=0 (no op compiled at install). Mosaic
# Streaming (the data tests' and bench/data.py's comparison) goes in with --no-deps after the
# `mosaic` extra's modules: its own requirements would replace torch with a CUDA build.
# uv, not pip, runs the installs (.ci/install): from cold caches on 2 cores it takes the set-up
# from 144 s to 82 s (load 2 to 4; DEVELOPERS.md, "The first minutes").
$(STAMP): pyproject.toml
	$(STEP) venv $(PYTHON) -m venv $(VENV)
	$(STEP) installer $(INSTALL) --bootstrap
	$(STEP) torch $(INSTALL) --as-pip-picks torch==2.13.0
	$(STEP) hora+extras env DS_BUILD_OPS=0 $(INSTALL) --no-build-isolation \
		-e '.[dev,deepspeed,estimator,clients,mosaic]' torch==2.13.0
	$(STEP) mosaicml-streaming $(INSTALL) --no-deps 'mosaicml-streaming==0.13.0'
	touch $(STAMP)

# DeepSpeed compiles its C++ ops on first use, into torch's extension cache (about a minute each
# on 2 free cores): the op its CPU accelerator loads in every init_distributed, and its default
# optimizers' CPU ops (Adam/AdamW: fused_adam, cpu_adam under ZeRO-Offload). Built here, where
# DeepSpeed itself finds them, so that no test builds one under its timeout; with the venv's ninja,
# as the tests' ranks run. Built already, they are only loaded (seconds). An op missing there is
# built once per host in the job (hora/_deepspeed_ops.py).
deepspeed-ops: setup
	$(STEP) deepspeed-ops $(WITH_VENV_TOOLS) $(PY) -m hora._deepspeed_ops
	$(TOTAL)

# The demos run with the venv's tools (WITH_VENV_TOOLS above). The sharded demo's DeepSpeed needs
# one op, the shared-memory collectives its CPU init_distributed loads (its Adam is torch's): its
# build (60 CPU-seconds of C++; seconds when built) starts in the background with the demo, where
# the first two demos leave a core idle, and the step before the sharded demo waits for it under
# hora's host lock (hora/_deepspeed_ops.py), builds it itself if that build failed, then prints
# what the background build said. Its ranks only load it.
DEMO_OP := $(WITH_VENV_TOOLS) $(PY) -m hora._deepspeed_ops ShareMemCommBuilder
demo: setup
	@$(DEMO_OP) > $(VENV)/demo-op.log 2>&1 &
	$(STEP) digits $(WITH_VENV_TOOLS) $(PY) examples/digits.py
	$(STEP) keras_digits $(WITH_VENV_TOOLS) $(PY) examples/keras_digits.py
	$(STEP) deepspeed_shm_comm-op $(DEMO_OP)
	@sed 's/^/  (background) /' $(VENV)/demo-op.log
	$(STEP) sharded_demo $(WITH_VENV_TOOLS) $(PY) examples/sharded_demo.py
	$(STEP) estimator_digits $(WITH_VENV_TOOLS) $(PY) examples/estimator_digits.py
	$(TOTAL)

# ruff, then pytest with DeepSpeed's ops (deepspeed-ops above) and mypy built and run beside it,
# where the suite leaves a core idle (.ci/test says why that is safe); their output follows pytest's.
test: setup
	.ci/test $(VENV) -q

# The `slow` family, left out of `make test` (the suite's budget): the costliest runs, whose parts
# the suite checks at a smaller size (DEVELOPERS.md lists them): np 64 on this host (11 GiB
# free), 32 ranks on 8 namespaced Spark hosts and on 8 Ray nodes (root). About 10 minutes.
test-slow: setup
	$(WITH_VENV_TOOLS) $(PY) -m pytest -q --slow -m slow

lint: setup
	$(VENV)/bin/ruff check hora tests bench examples
	$(VENV)/bin/ruff format --check hora tests bench examples

bench: setup deepspeed-ops
	$(PY) bench/launch.py

clean:
	rm -rf $(VENV) build *.egg-info
