# UMJoin for Spark. `make report` and `make test` do all set-up themselves (venv, install, build, data).
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
JAR := python/umjoin/jars/umjoin-spark.jar
SCALA_SOURCES := $(shell find jvm-shim/src/main/scala -name '*.scala') $(shell find jvm-shim/src/main/resources -type f)
# The tests' and benchmarks' own JVM classes (cost models asked directly, the arrival replay); never installed.
TESTKIT := build/umjoin-spark-testkit.jar
TESTKIT_SOURCES := $(shell find jvm-shim/src/test/scala -name '*.scala')
RULES := $(wildcard rules/*.yaml)
REPORT_SF ?= 0.1
BENCH_SF ?= 1
BENCH_REPS ?= 5
BENCH_MEMORY_SF ?= 1
BENCH_ENRICHMENT_SF ?= 0.1
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)

.PHONY: venv build testkit readme-settings browser test report demo bench bench-memory bench-streaming bench-enrichment bench-static bench-psp bench-probe-order bench-planning clean

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml setup.py
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[dev]'
	touch $@

# Rebuilt only when a Scala source or a rules file changed.
build: $(JAR)

$(JAR): $(INSTALLED) $(SCALA_SOURCES) $(RULES) jvm-shim/build_jar.py
	$(PY) jvm-shim/build_jar.py $@

testkit: $(TESTKIT)

$(TESTKIT): $(JAR) $(TESTKIT_SOURCES)
	$(PY) jvm-shim/build_jar.py --testkit $(JAR) $@

# The README's configuration table, from the settings the jar declares (a test checks it is current).
readme-settings: build
	$(PY) jvm-shim/readme_settings.py $(JAR)

# Two pytest workers, each a Spark session; each test file runs whole in one of them.
test: build testkit browser
	$(PY) -m pytest -q -n 2 --dist loadfile

# The report test renders the HTML report in Debian's Chromium; installed here when missing.
browser:
	@command -v chromium >/dev/null 2>&1 || { echo "Installing Debian's chromium for the HTML report test"; \
	  $(SUDO) apt-get install -y chromium >/dev/null || { $(SUDO) apt-get update >/dev/null && $(SUDO) apt-get install -y chromium >/dev/null; }; }

report: build
	$(VENV)/bin/umjoin tpch-report --sf $(REPORT_SF) --out reports/tpch

demo: build
	$(VENV)/bin/umjoin demo

bench: build
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench tpch --sf $(BENCH_SF) --repetitions $(BENCH_REPS) --out bench/results

# The paper's memory experiment (TPC-DS SF 1, 4-way join); plots need matplotlib (the bench extra).
bench-memory: build
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench memory --sf $(BENCH_MEMORY_SF) --out bench/results

# The paper's main claim in Structured Streaming: the 4-way join over streams, UMJoin vs Spark's joins.
bench-streaming: build testkit
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench streaming --sf $(BENCH_MEMORY_SF) --workload tpcds --out bench/results
	$(PY) -m bench streaming --sf $(BENCH_MEMORY_SF) --workload tpch --out bench/results

# Enrichment chains (orders LEFT JOIN 5 and 10 side streams): Spark's joins, UMJoin, and Flink 2.3's MultiJoin
# and binary joins beside them (PyFlink, the peers extra, shares this venv: its py4j pin is one pyspark accepts).
bench-enrichment: build testkit
	$(PY) -m pip install --quiet -e '.[dev,bench,peers]'
	$(PY) -m bench streaming --sf $(BENCH_ENRICHMENT_SF) --workload enrichment --out bench/results

# Paper 004's setting: a 3-way window join without an equi-join key (a similarity UDF), UMJoin with 1, 2,
# 4, 8 time slices against a foreachBatch that keeps the windows and joins them by hand.
bench-psp: build testkit
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench psp --out bench/results

# Paper 003's setting: orders as a stream joined with customer and nation as static tables, Zipf skew
# 0, 0.5, 1; Spark's stream-static join against UMJoin by default (which leaves it to Spark) and storing customer
# with each cache mode; 3 runs of each, rotating their order. About 25 minutes.
bench-static: build
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench static --sf 1 --out bench/results

# Paper 001's probe-order experiments: the 4-way TPC-DS join's rows replayed in random order, 24 initial
# orders x policies; in-memory stores at SF 1, RocksDB stores (slower probes) at SF 0.3. About an hour.
bench-probe-order: build testkit
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench probe-order --sf 1 --backend memory --out bench/results
	$(PY) -m bench probe-order --sf 0.3 --backend rocksdb --out bench/results

# Planning per micro-batch (durationMs.queryPlanning) and latency: chains of 3 and 6 streams, UMJoin against
# Spark's stream-stream joins with the default store and with RocksDB and join state format 4.
bench-planning: build
	$(PY) -m pip install --quiet -e '.[dev,bench]'
	$(PY) -m bench planning --out bench/results

clean:
	rm -rf build $(JAR)
