# The two commands a fresh machine needs: `make demo` and `make test` (both set up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_ARGS ?= --dp 2 --steps 100 --global-batch 16 --bucket-mb 0.03

.PHONY: setup compile demo test test-all test-gpu test-slurm test-browser lint notebook docs benchmark clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml scripts/setup.sh
	bash scripts/setup.sh $(VENV)
	touch $@

demo: setup  # backend auto: NCCL where each of the 2 ranks has a GPU, else the CPU (it says so in one line)
	$(PY) -m workbench.cli run $(DEMO_ARGS) --backend auto --name demo --out traces/demo --force
	$(PY) -m workbench.cli validate traces/demo

# Byte-compile our sources first: where PYTHONDONTWRITEBYTECODE is set (this project's CI machines) every
# process would otherwise compile workbench again at import — each rank of every launch (≈0.5 s a process)
compile: setup
	$(PY) -m compileall -q workbench tests tests_browser conftest.py

test: lint compile
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not gpu and not slurm" tests --nbmake notebooks

test-all: setup compile  # also the `slow` cases: more strategies for behaviours `make test` checks once each
	$(PY) -m pip install -q -e ".[ray]"   # --launcher ray's cases run on a local Ray
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not gpu and not slurm" tests --nbmake notebooks

test-gpu: setup  # every strategy on NCCL on this machine's GPUs (tests/gpu); each case skips without its GPUs
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -m gpu tests/gpu

# a Slurm cluster on this machine (launching/local_slurm.py: munge, slurmctld and a slurmd in each node of a local
# cluster) and a job from `workbench slurm-script` across 2 nodes: installs Debian's Slurm and munge where we are root
# with apt-get (elsewhere the cases skip, saying why); ~30 s once installed
test-slurm: setup compile
	bash scripts/slurm_setup.sh
	OMP_NUM_THREADS=1 timeout 300 $(PY) -m pytest -q -rs -m slurm tests/test_slurm_cluster.py

# every notebook in JupyterLab in a real chromium (installs it), and the docs site built and opened; screenshots in
# traces/browser/
test-browser: setup compile docs
	bash scripts/browser_setup.sh $(VENV)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests_browser

LINTED := conftest.py workbench tests tests_browser benchmarks scripts
# the formatter's check (lines of 100), ruff's rules, and the type checker over workbench/
lint: setup
	$(PY) -m ruff format --check --quiet $(LINTED)
	$(PY) -m ruff check $(LINTED)
	$(PY) -m mypy

notebook: setup
	$(VENV)/bin/jupyter lab notebooks

# the documentation site, built strict and without the network into traces/site/ (open traces/site/index.html):
# the guides, every notebook executed (the copies `make test` kept, else executed now; FRESH=1: all again), the
# architecture, the formulas, the run format, the CLI and API references generated from the code
docs: setup $(VENV)/.docs-installed
	OMP_NUM_THREADS=1 $(PY) scripts/build_docs.py $(if $(FRESH),--fresh)

$(VENV)/.docs-installed: pyproject.toml
	$(PY) -m pip install --quiet -e ".[docs]"
	touch $@

benchmark: setup
	$(PY) benchmarks/dp_vs_ddp.py

clean:
	rm -rf $(VENV) traces/* .pytest_cache
