# UMJoin for Spark. `make test` and `make demo` do all set-up themselves (venv, install, build, data).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
JAR := python/umjoin/jars/umjoin-spark.jar
SCALA_SOURCES := $(shell find jvm-shim/src/main/scala -name '*.scala')
RULES := $(wildcard rules/*.yaml)
BENCH_SF ?= 1
BENCH_REPS ?= 3

.PHONY: venv build test demo bench clean

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# Rebuilt only when a Scala source or a rules file changed.
build: $(JAR)

$(JAR): $(INSTALLED) $(SCALA_SOURCES) $(RULES) jvm-shim/build.sh
	jvm-shim/build.sh $(PY) $@

test: build
	$(PY) -m pytest -q

demo: build
	$(VENV)/bin/umjoin demo

bench: build
	$(VENV)/bin/umjoin bench --sf $(BENCH_SF) --repetitions $(BENCH_REPS) --out bench/results

clean:
	rm -rf build $(JAR)
