# The two commands a fresh machine needs: `make demo` and `make test` (both set up .venv first).
VENV ?= .venv
PY := $(VENV)/bin/python
DEMO_ARGS ?= --dp 2 --steps 100 --global-batch 16 --bucket-mb 0.03

.PHONY: setup compile demo test test-all test-gpu test-browser lint notebook notebooks-html benchmark clean

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
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not slow and not gpu" tests --nbmake notebooks

test-all: setup compile  # also the `slow` cases: more strategies for behaviours `make test` checks once each
	$(PY) -m pip install -q -e ".[ray]"   # --launcher ray's cases run on a local Ray
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -m "not gpu" tests --nbmake notebooks

test-gpu: setup  # every strategy on NCCL on this machine's GPUs (tests/gpu); each case skips without its GPUs
	OMP_NUM_THREADS=1 $(PY) -m pytest -q -rs -m gpu tests/gpu

test-browser: setup compile  # every notebook in JupyterLab in a real chromium (installs it); screenshots in traces/browser/
	bash scripts/browser_setup.sh $(VENV)
	OMP_NUM_THREADS=1 $(PY) -m pytest -q tests_browser

lint: setup
	$(PY) -m ruff check conftest.py workbench tests tests_browser benchmarks scripts

notebook: setup
	$(VENV)/bin/jupyter lab notebooks

# every notebook executed, as HTML with its charts interactive (plotly.js inside each page), to read before
# running anything: traces/html/NN_name.html
notebooks-html: setup
	OMP_NUM_THREADS=1 $(PY) scripts/notebooks_html.py

benchmark: setup
	$(PY) benchmarks/dp_vs_ddp.py

clean:
	rm -rf $(VENV) traces/* .pytest_cache
