# sparkdist: `make demo` runs the demo jobs on local Spark; `make test` runs the test suite.
# Both create .venv and install the pinned, tested dependency set (constraints.txt) first.

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
HVD_STAMP := $(VENV)/.horovod

export SPARK_LOCAL_IP     ?= 127.0.0.1
export GLOO_SOCKET_IFNAME ?= lo
export PYSPARK_PYTHON     := $(abspath $(PY))
export PYSPARK_DRIVER_PYTHON := $(abspath $(PY))

.PHONY: setup horovod demo test test-unit test-fast bench docs lint data accessors check-java clean

setup: $(STAMP)

$(STAMP): pyproject.toml constraints.txt | check-java
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "sparkdist needs Python 3.10 or newer; set PYTHON=python3.11 (or another) on the make command line.")'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -c constraints.txt -e '.[all,dev]'
	touch $@

# Horovod 0.28.1 built from source against the venv's torch (C++17 patch, gloo only); the
# wheel is cached in ~/.cache/sparkdist/wheels, so only the first build takes minutes (about 6 on 2 cores).
horovod: $(HVD_STAMP)

$(HVD_STAMP): $(STAMP) .ci/build_horovod.sh
	bash .ci/build_horovod.sh $(PY)
	touch $@

check-java:
	@java="$${JAVA_HOME:+$$JAVA_HOME/bin/}java"; \
	v=$$("$$java" -version 2>&1 | awk -F'"' '/version/ {print $$2}' | sed 's/^1\.//' | cut -d. -f1); \
	if [ -z "$$v" ] || [ "$$v" -lt 17 ] 2>/dev/null; then \
	  echo "sparkdist needs Java 17 or newer for Spark 4 (found: $${v:-no java})."; \
	  echo "Install it (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless;" \
	       "macOS: brew install openjdk@17) and put java on PATH or set JAVA_HOME."; \
	  exit 1; \
	fi

demo: setup
	$(PY) jobs/train.py

# The whole suite (CI runs this): lint and types first, any finding fails it.
# SPARKDIST_REQUIRE_HOROVOD: a Horovod that does not import fails its tests here, never skips them.
test: lint $(HVD_STAMP)
	SPARKDIST_REQUIRE_HOROVOD=1 $(PY) -m pytest -q --durations=15

# No Spark, no JVM: seconds.
test-unit: setup
	$(PY) -m pytest -q -m "not slow" tests/unit

# Unit tests and the quick Spark tests (each a few seconds at most): about 3 minutes on 2 cores.
# Slow, cluster, Connect, notebook and Horovod tests run only in `make test`.
test-fast: setup
	$(PY) -m pytest -q -m "not slow and not cluster and not horovod and not gpu" \
	  tests/unit tests/spark tests/jobs

# Every benchmark, then bench/results/latest.{json,md,png} (about an hour on 2 cores).
bench: setup
	$(PY) bench/report.py

# The generated pages, measuring nothing: docs/reference/*.md from the code, and
# docs/performance.md with bench/results/latest.{json,md,png} from bench/results/*.json.
docs: setup
	$(PY) docs/gen.py
	$(PY) bench/report.py --page

lint: setup
	$(PY) -m ruff check sparkdist tests jobs bench notebooks
	$(PY) -m mypy sparkdist

data: setup
	$(PY) -m sparkdist.datasets data

# The typed getX/setX of every public stage, written as source into _accessors_*.py next to
# the stage modules: run after adding or changing a Param (tests/unit/test_accessors.py checks).
accessors: setup
	$(PY) -m sparkdist.models._accessors_gen

clean:
	rm -rf $(VENV) spark-warehouse metastore_db derby.log .pytest_cache
