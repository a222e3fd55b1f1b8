VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
export PYSPARK_PYTHON := $(abspath $(PY))
export SPARK_LOCAL_IP := 127.0.0.1

.PHONY: setup test demo bench clean

$(STAMP): pyproject.toml scripts/setup.sh
	VENV=$(VENV) scripts/setup.sh
	touch $@

setup: $(STAMP)

test: setup
	$(PY) -m pytest -q

demo: setup
	$(PY) -m rockstate.cli demo

bench: setup
	VENV=$(VENV) scripts/setup.sh redis-server
	@set -e; for f in bench/*.py; do echo "== $$f"; $(PY) $$f; done

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
