# Set-up and the two commands of README.md. Everything installs into .venv from the hash-locked files.
#   make train   set up, fetch Fashion-MNIST (Debian's package or the mirrors), train PyTorch on the CPU
#   make test    set up (Docker and the CPU image included), lint, and run every test
#   make lint    ruff format --check and ruff check
#   make test-quick  the tests not marked `process` (pyproject.toml): none starts a process (the inner loop, a minute or two)
#   make test CONTAINERS=0   the same without Docker: the container tests are skipped
#   make test SLURM=0        the same without the local SLURM cluster: the SLURM tests are skipped
#   make test APPTAINER=0    the same without Apptainer: the Singularity tests are skipped (CONTAINERS=0 too:
#                            the SIF is built from the Docker image)
#   make test TEST_WORKERS=0 the test files one after another (default: three at a time)
PYTHON ?= python3
VENV := .venv
# The MLCube launcher lives in its own venv (mlcube 0.0.9 pins omegaconf 2.1.0; hydra needs 2.3).
MLCUBE_VENV := .venv-mlcube
FASHION_MNIST_DEB := /usr/share/datasets/fashion-mnist
# Where no PyTorch CPU index is reachable pip fails over fast instead of retrying for minutes.
PIP_INSTALL := $(VENV)/bin/pip install --quiet --disable-pip-version-check --retries 1 --require-hashes

CONTAINERS ?= 1
SLURM ?= 1
APPTAINER ?= $(CONTAINERS)

.PHONY: setup system-packages test-packages container-setup slurm-setup apptainer-setup train lint test test-quick clean
setup: $(VENV)/.installed $(MLCUBE_VENV)/.installed

$(VENV)/.installed: requirements-cpu.txt requirements-test.txt pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP_INSTALL) -r requirements-cpu.txt -r requirements-test.txt
	$(VENV)/bin/pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
	touch $@

# The trainers of docs/frameworks.md (transformers, accelerate, lightning) for tests/test_frameworks.py: make test
# only, from their own lock, so that make train installs no more than before.
$(VENV)/.trainers: requirements-trainers.txt $(VENV)/.installed
	$(PIP_INSTALL) -r requirements-cpu.txt -r requirements-test.txt -r requirements-trainers.txt
	touch $@

# uv (from the test lock) because pip >= 24.1 refuses mlcube's omegaconf 2.1.0 metadata. The noshell patch
# (a .pth file and its module) makes this venv's mlcube run docker/singularity without a shell (issue 15);
# --install fails unless the patch is active.
$(MLCUBE_VENV)/.installed: requirements-mlcube.txt scripts/reprocube_mlcube_noshell.py $(VENV)/.installed
	$(VENV)/bin/uv venv --quiet --allow-existing --python $(PYTHON) $(MLCUBE_VENV)
	$(VENV)/bin/uv pip install --quiet --python $(MLCUBE_VENV)/bin/python --require-hashes -r requirements-mlcube.txt
	$(MLCUBE_VENV)/bin/python scripts/reprocube_mlcube_noshell.py --install
	touch $@

# Fashion-MNIST from Debian (offline): all `make train` installs from apt. Chromium and QEMU (test-packages)
# only for `make test` (tests/test_report_browser.py renders report.html; the golden and cross-machine tests
# train on QEMU's model of the AVX2 machine's CPU, reprocube.runtime.cpu_emulation). Both without apt's recommends (a
# browser's recommends are a desktop); need root or sudo; each is skipped where it is already there.
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
APT_INSTALL := $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends
system-packages:
	@if [ ! -d $(FASHION_MNIST_DEB) ] && command -v apt-get >/dev/null; then \
	  $(APT_INSTALL) dataset-fashion-mnist || { $(SUDO) apt-get update -q && $(APT_INSTALL) dataset-fashion-mnist; }; \
	fi

test-packages:
	@if ! command -v chromium >/dev/null && command -v apt-get >/dev/null; then \
	  $(APT_INSTALL) chromium || { $(SUDO) apt-get update -q && $(APT_INSTALL) chromium; }; \
	fi
	@if ! command -v qemu-x86_64 >/dev/null && command -v apt-get >/dev/null; then \
	  $(APT_INSTALL) qemu-user || { $(SUDO) apt-get update -q && $(APT_INSTALL) qemu-user; }; \
	fi

train: setup system-packages
	@if [ -d $(FASHION_MNIST_DEB) ]; then \
	  $(VENV)/bin/reprocube download dataset=fashion_mnist data_dir=data data.source_dir=$(FASHION_MNIST_DEB); \
	else \
	  $(VENV)/bin/reprocube download dataset=fashion_mnist data_dir=data; \
	fi
	$(VENV)/bin/reprocube train framework=pytorch dataset=fashion_mnist data_dir=data $(ARGS)

# Docker from Debian, a debootstrapped base image and the CPU image (needs root: dockerd).
container-setup:
	$(SUDO) scripts/container-setup.sh

# Apptainer 1.4.5 (Debian sid) in a trixie root file system, as `apptainer` and `singularity` on PATH (needs root).
apptainer-setup:
	$(SUDO) scripts/apptainer-setup.sh

# slurm-wlm and munge from Debian, slurmctld and slurmd on 127.0.0.1 (needs root).
SLURM_DIR ?= /tmp/reprocube-slurm
slurm-setup:
	$(SUDO) env SLURM_DIR=$(SLURM_DIR) scripts/slurm-setup.sh

# ruff (pyproject.toml): formatting and lint, before any test runs.
lint: $(VENV)/.installed
	$(VENV)/bin/ruff format --check --diff .
	$(VENV)/bin/ruff check .

# Each enabled suite turns its missing prerequisites from a skip into a failure.
TEST_DEPS := setup $(VENV)/.trainers system-packages test-packages lint
TEST_ENV :=
ifeq ($(CONTAINERS),1)
TEST_DEPS += container-setup
TEST_ENV += REPROCUBE_CONTAINER_TESTS=1
endif
ifeq ($(APPTAINER),1)
TEST_DEPS += apptainer-setup
TEST_ENV += REPROCUBE_APPTAINER_TESTS=1
endif
ifeq ($(SLURM),1)
TEST_DEPS += slurm-setup
TEST_ENV += REPROCUBE_SLURM_TESTS=1 SLURM_CONF=$(SLURM_DIR)/slurm.conf
endif
# Three test files at a time (pytest-xdist) on 2 cores: a third of the suite's wall time is waiting (SLURM,
# Docker, check's stops and restarts, watchdog stalls), and a third worker fills it (2026-12-07, AMD EPYC
# AVX-512, 2 CPUs: 2448 s with two, 2281 s with three, every test passing; benchmarks/test-suite.md).
# tests/conftest.py hands out the longest files first. TEST_WORKERS=0 runs the files one after another.
TEST_WORKERS ?= 3
XDIST := $(if $(filter 0,$(TEST_WORKERS)),-p no:xdist,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)
test: $(TEST_DEPS)
	$(TEST_ENV) $(VENV)/bin/python -m pytest $(XDIST) --durations=30 $(PYTEST_ARGS)

# The inner loop: the tests not marked `process` (none starts a process, so none trains), in a minute or two;
# no set-up beyond the venv. REPROCUBE_TEST_QUICK=1: tests/conftest.py fails an unmarked test that starts one.
test-quick: $(VENV)/.installed
	REPROCUBE_TEST_QUICK=1 $(VENV)/bin/python -m pytest -q -p no:cacheprovider -m "not process" $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) $(MLCUBE_VENV) .pytest_cache
