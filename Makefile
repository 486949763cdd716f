# Tidewater: `make demo` and `make test` set everything up from a fresh clone (idempotent).
SHELL := /bin/bash
.DEFAULT_GOAL := help

ROOT     := $(abspath .)
VENV     := $(ROOT)/.venv
PY       := $(VENV)/bin/python
DATA     := $(ROOT)/.data
PORT     ?= 19092
PYTEST_ARGS ?=
# make test runs the suite on this many pytest-xdist workers (0: in this one process), a test file to a worker, so
# that a module's fixtures (the install tests' built package, the standalone cluster) are made once. (xdist_group
# marks are not honoured with pytest 9.2 here: the group never reaches the test ids.) Files are dealt in the order
# pytest collects them (--no-loadscope-reorder): xdist would otherwise start the files with most tests first, which
# left the end-to-end files (few tests, the longest: the soak alone takes 9 minutes) to the end of the run.
# Three workers took longer (3,395 s against 3,287 s for two, from clean clones on 2026-11-29): the two cores are
# already 78% busy with two, and every file ran slower.
TEST_WORKERS ?= 2

export TIDEWATER_HOME := $(DATA)
export TIDEWATER_KAFKA_BOOTSTRAP ?= 127.0.0.1:$(PORT)
export PATH := $(VENV)/bin:$(PATH)
export AIRFLOW_HOME := $(DATA)/airflow
export AIRFLOW__CORE__DAGS_FOLDER := $(ROOT)/dags
export AIRFLOW__CORE__PLUGINS_FOLDER := $(ROOT)/plugins
export AIRFLOW__CORE__LOAD_EXAMPLES := False
export AIRFLOW__CORE__PARALLELISM := 4
export AIRFLOW__DATABASE__SQL_ALCHEMY_CONN ?= sqlite:///$(DATA)/airflow/airflow.db
export AIRFLOW_CONN_TIDEWATER_SPARK ?= {"conn_type": "spark", "host": "local[*]"}
export JAVA_HOME ?= $(shell dirname $$(dirname $$(readlink -f $$(command -v java 2>/dev/null || echo /usr/lib/jvm/java-17-openjdk-amd64/bin/java))))
export GX_ANALYTICS_ENABLED := false
export SPARK_LOCAL_IP := 127.0.0.1
export PYTHONWARNINGS := ignore::DeprecationWarning

.PHONY: bench-sizing-celery release kafka rest-catalog schema-registry glue-env peers bench-peers bench-broker install-check bench-scale bench-sizing ui-bundle soak s3-stand-in spark-connect spark-connect-install spark-connect-stop executor-env bench bench-maintenance bench-routing bench-metadata bench-cdc bench-cdc-tables bench-data-docs bench-audit bench-cluster bench-profile bench-dag airflow tidewater help setup system-deps test-system-deps venv airflow-db demo test test-unit bench ui broker-start broker-stop docs lint clean

help:
	@echo "make demo   - set up, start the embedded broker, ingest pizza events through Airflow, show the result"
	@echo "make test   - set up and run the test suite"
	@echo "make release VERSION=X.Y.Z - version, CHANGELOG, the wheel and sdist in dist/, an annotated tag; nothing pushed"
	@echo "make install-check - the wheel installed into Airflow 3.1.x, 3.2.x and 3.3.x without our constraints: no downgrade, provider, plugin and DAGs load (make test runs 3.1.x and 3.3.x, in tests/e2e/test_install.py; make release runs it all)"
	@echo "make ui     - start the Airflow UI (api-server, scheduler, ...) on http://127.0.0.1:8080"
	@echo "make docs   - regenerate docs/configuration.md from the code and build the documentation site into site/ (MkDocs, strict)"
	@echo "make lint   - ruff (checks and formatter) and mypy (part of make test)"
	@echo "make ui-bundle - build the Tidewater apps for Airflow's UI (TypeScript, npm; part of make setup)"
	@echo "make executor-env - pack a virtualenv for Spark executors that lack the packages (spark.python_env)"
	@echo "make s3-stand-in  - the local S3 endpoint the tests use (moto's server, its own virtualenv)"
	@echo "make glue-env - the Glue catalog's test environment (boto3 in its own virtualenv: its botocore needs python-dateutil<3; pyspark for maintenance through Glue)"
	@echo "make rest-catalog - the Iceberg REST catalog server the tests use (Iceberg 1.12 handlers from Maven Central, .data/rest-catalog)"
	@echo "make schema-registry - the schema registry the tests use (Apicurio Registry 2.4.2, built from Maven Central into .data/schema-registry)"
	@echo "make spark-connect - install (pyspark 4.0.x distribution, its own folder) and start a Spark Connect server on 127.0.0.1:15002; make spark-connect-stop stops it"
	@echo "make soak   - SOAK_MINUTES (default 60) of production with faults (scheduler on PostgreSQL, three pipelines), then every table audited; writes SOAK.md"
	@echo "make bench  - throughput/memory benchmark into BENCHMARKS.md (make bench-broker: the embedded Kafka broker's start, memory and 1M records; make bench-maintenance: maintenance effect; make bench-routing: 100 tables; make bench-metadata: row metadata storage; make bench-cdc: change batches vs table size, then 100 change tables in one pipeline vs 100 pipelines (make bench-cdc-tables alone); make bench-data-docs: Data Docs page cost as history grows; make bench-audit: the audit's cost as the ledger grows; make bench-cluster: local[2] vs a standalone cluster; make bench-profile: the data path's CPU per stage in one worker; make bench-dag: a one-record batch through the ingest DAG on a running scheduler; make bench-scale: costs against pipelines, partitions, history, dead letters and routed tables; make bench-sizing: Airflow's CPU per pipeline, docs/explanation/sizing.md; make bench-peers: beside the Iceberg Kafka Connect sink and Structured Streaming, docs/explanation/peers.md)"

# --- set-up (idempotent) -------------------------------------------------------------------------
# Java and JDBC drivers for Spark; Chromium for the browser tests of the Airflow UI (Playwright drives it);
# the compose client, which the tests use to validate docker-compose.yml; PostgreSQL's server programs, which the
# production-shaped tests start on a local port (the package's own service is not used); Node.js and npm, which
# build the Tidewater apps in Airflow's UI (ui-bundle).
# what the demo needs: Java for Spark, SQLite's JDBC driver (the demo's catalog), Node.js to build the UI apps
system-deps: $(DATA)/.system-deps-6
$(DATA)/.system-deps-6:
	@mkdir -p $(DATA)
	@if ! command -v java >/dev/null || [ ! -f /usr/share/java/sqlite-jdbc.jar ] || ! command -v npm >/dev/null; then \
	  echo "installing Java 17, the SQLite JDBC driver and Node.js (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends \
	    openjdk-17-jre-headless libxerial-sqlite-jdbc-java $$(command -v npm >/dev/null || echo nodejs npm) >/dev/null; \
	fi
	@touch $@

# what only the tests need: Chromium (browser tests), PostgreSQL and its JDBC driver (production-shaped tests),
# docker-compose (the compose file is checked)
test-system-deps: $(DATA)/.test-system-deps-2
$(DATA)/.test-system-deps-2: $(DATA)/.system-deps-6
	@if [ ! -x /usr/bin/chromium ] || ! command -v docker-compose >/dev/null || [ ! -f /usr/share/java/postgresql.jar ] \
	    || ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || [ ! -x /usr/bin/redis-server ]; then \
	  echo "installing Chromium, docker-compose, PostgreSQL and its JDBC driver, Redis for the tests (apt-get)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends \
	    libpostgresql-jdbc-java chromium docker-compose postgresql redis-server >/dev/null; \
	fi
	@touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	@test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -r requirements-dev.txt -c constraints.txt
	@# the distribution was named tidewater up to 0.2: its editable install would keep a second plugin entry point
	$(PY) -m pip uninstall -q -y tidewater 2>/dev/null || true
	$(PY) -m pip install -q --no-deps -e .
	@# the editable install leaves setuptools' egg-info beside the package, on the path the install puts include/ on:
	@# a second copy of the package's metadata, and Airflow then loads the plugin's entry point twice ("already
	@# registered", a plugin import error on its home page). The installed dist-info is the one that counts.
	rm -rf $(ROOT)/include/*.egg-info
	@touch $@

airflow-db: $(DATA)/airflow/.migrated
$(DATA)/airflow/.migrated: $(VENV)/.installed
	@mkdir -p $(DATA)/airflow
	airflow db migrate >/dev/null
	@touch $@

setup: system-deps venv airflow-db ui-bundle kafka

# The embedded Apache Kafka broker (KRaft): Maven copies the broker's runtime classpath, as jvm/kafka/pom.xml names
# it, from Maven Central into .data/kafka/libs (tidewater_dev/broker.py starts it from there). Maven comes from
# Debian's packages when missing. Redone when the pom changes.
KAFKA_LIBS := $(DATA)/kafka/libs
kafka: $(KAFKA_LIBS)/.installed
$(KAFKA_LIBS)/.installed: jvm/kafka/pom.xml $(DATA)/.system-deps-6
	@command -v mvn >/dev/null || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && $$SUDO apt-get install -y -qq --no-install-recommends maven >/dev/null; }
	@rm -rf $(KAFKA_LIBS)
	mvn -q -B -f jvm/kafka/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(KAFKA_LIBS)
	@touch $@

# The Iceberg REST catalog server of the tests (jvm/rest-catalog: Iceberg's request handlers over a JdbcCatalog on
# SQLite, run from source by tidewater_dev.rest_catalog), its classpath copied from Maven Central into .data.
REST_LIBS := $(DATA)/rest-catalog/libs
rest-catalog: $(REST_LIBS)/.installed
$(REST_LIBS)/.installed: jvm/rest-catalog/pom.xml $(KAFKA_LIBS)/.installed
	@rm -rf $(REST_LIBS)
	mvn -q -B -f jvm/rest-catalog/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(REST_LIBS)
	@touch $@

# The schema registry of the tests: Apicurio Registry (jvm/schema-registry/pom.xml says which version and why), which
# Maven Central serves only as an application jar: Quarkus's Maven plugin builds the runnable server from it into
# .data/schema-registry (tidewater_dev.schema_registry starts it). Redone when the pom changes.
REGISTRY_BUILD := $(DATA)/schema-registry
schema-registry: $(REGISTRY_BUILD)/.installed
$(REGISTRY_BUILD)/.installed: jvm/schema-registry/pom.xml $(KAFKA_LIBS)/.installed
	@rm -rf $(REGISTRY_BUILD)
	mvn -q -B -f jvm/schema-registry/pom.xml package -DskipTests -Dregistry.build=$(REGISTRY_BUILD)
	@touch $@

# The Glue catalog's test environment: the package's dependencies (requirements-executor.txt, great-expectations)
# with boto3, in their own virtualenv, since botocore requires python-dateutil < 3 and constraints.txt (Airflow 3.3's
# environment) pins 4.0.0: the same constraints with dateutil and boto3 taken from constraints-moto.txt.
# tests/integration/test_glue_catalog.py runs the package from the checkout (PYTHONPATH) with it.
glue-env: $(DATA)/glue-venv/.installed
$(DATA)/glue-venv/.installed: requirements-executor.txt requirements-glue.txt constraints.txt constraints-moto.txt
	@rm -rf $(DATA)/glue-venv
	python3 -m venv $(DATA)/glue-venv
	(grep -v '^python-dateutil==' constraints.txt; grep -E '^(python-dateutil|boto3|botocore|s3transfer|jmespath)==' constraints-moto.txt) > $(DATA)/glue-constraints.txt
	$(DATA)/glue-venv/bin/python -m pip install -q -r requirements-executor.txt -r requirements-glue.txt -c $(DATA)/glue-constraints.txt
	@touch $@

# The peers of `make bench-peers` (not part of setup): a Kafka Connect worker with the Apache Iceberg sink
# (jvm/peers/connect) and Spark's Kafka source with Iceberg's Spark runtime for Structured Streaming
# (jvm/peers/spark), copied from Maven Central into .data/peers. Redone when a pom changes.
PEERS := $(DATA)/peers
peers: $(PEERS)/.installed
$(PEERS)/.installed: jvm/peers/connect/pom.xml jvm/peers/spark/pom.xml $(KAFKA_LIBS)/.installed
	@rm -rf $(PEERS)
	mvn -q -B -f jvm/peers/connect/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(PEERS)/connect/libs
	mvn -q -B -f jvm/peers/spark/pom.xml dependency:copy-dependencies -DincludeScope=runtime -DoutputDirectory=$(PEERS)/spark/jars
	@touch $@

# The Tidewater apps inside Airflow's UI (React, TypeScript, sources in ui/): npm installs the locked build tools,
# vite builds one bundle into the package (tidewater/runtime/ui_static/), which the plugin serves and the wheel ships.
UI_APP    := $(ROOT)/ui
UI_BUNDLE := $(ROOT)/include/tidewater/runtime/ui_static/tidewater-ui.js
ui-bundle: system-deps $(UI_BUNDLE)
$(UI_BUNDLE): $(UI_APP)/package-lock.json $(UI_APP)/vite.config.ts $(UI_APP)/tsconfig.json $(wildcard $(UI_APP)/src/*.ts* $(UI_APP)/src/*/*.ts*) $(wildcard $(UI_APP)/public/*)
	@command -v npm >/dev/null || { echo "npm (Node.js 18+) is needed to build the Tidewater UI apps: apt-get install nodejs npm"; exit 1; }
	cd $(UI_APP) && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build

# The local S3 endpoint the tests start (moto's server): its own virtualenv, since its dependencies
# (python-dateutil 2, Flask) conflict with Airflow's; a stand-in for MinIO/S3, never used by the product.
s3-stand-in: $(DATA)/moto/.installed
$(DATA)/moto/.installed: constraints-moto.txt
	@test -x $(DATA)/moto/bin/python || python3 -m venv $(DATA)/moto
	$(DATA)/moto/bin/python -m pip install -q "moto[server]" -c constraints-moto.txt
	@touch $@

# A real Spark Connect server (the write step's warm path): pyspark 4.0.x's source distribution carries the
# server; unpacked in its own folder, never installed into the virtualenv (whose pyspark 3.5 matches the
# Iceberg runtime jar). `make spark-connect` installs and starts it on SPARK_CONNECT_PORT;
# `make spark-connect-stop` stops it. Its log: $(DATA)/spark-connect-<port>.log.
SPARK_CONNECT_PORT ?= 15002
spark-connect-install: $(DATA)/spark-connect/.installed
$(DATA)/spark-connect/.installed: constraints-spark-connect.txt
	@rm -rf $(DATA)/spark-connect $(DATA)/spark-connect-download
	$(PY) -m pip download -q --no-deps --no-binary pyspark -d $(DATA)/spark-connect-download -r constraints-spark-connect.txt
	@mkdir -p $(DATA)/spark-connect
	tar xzf $(DATA)/spark-connect-download/pyspark-*.tar.gz -C $(DATA)/spark-connect --strip-components=1
	@rm -rf $(DATA)/spark-connect-download
	@chmod +x $(DATA)/spark-connect/deps/bin/*
	@touch $@

spark-connect: venv spark-connect-install
	tidewater spark-connect start --port $(SPARK_CONNECT_PORT)

spark-connect-stop: venv
	tidewater spark-connect stop

# A packed virtualenv for Spark executors that lack the project's packages (spark.python_env ships it).
executor-env: $(DATA)/executor-env.tar.gz
# rebuilt when the package changes: executors import tidewater from the pack
$(DATA)/executor-env.tar.gz: requirements-executor.txt constraints.txt pyproject.toml $(VENV)/.installed \
    $(shell find include/tidewater -name '*.py' 2>/dev/null)
	@rm -rf $(DATA)/executor-venv
	python3 -m venv $(DATA)/executor-venv
	$(DATA)/executor-venv/bin/python -m pip install -q -r requirements-executor.txt -c constraints.txt
	$(DATA)/executor-venv/bin/python -m pip install -q --no-deps .
	@# the in-tree build leaves setuptools' egg-info in include/, a second copy of the package's metadata on the
	@# checkout's path: Airflow would load the plugin twice (see the venv target)
	@rm -rf build $(ROOT)/include/*.egg-info
	$(VENV)/bin/venv-pack -q -p $(DATA)/executor-venv -o $@ --force

# --- the two commands ----------------------------------------------------------------------------
demo: setup
	@bash scripts/demo.sh

test: setup test-system-deps s3-stand-in executor-env spark-connect-install rest-catalog schema-registry glue-env lint
	$(PY) -m pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder $(PYTEST_ARGS)

# ruff: pyflakes, pycodestyle, import order, bugbear, complexity, blind excepts with their reason, no inert noqa
# (RUF100), the formatter; mypy over the whole package, no unused type: ignore (all in pyproject.toml)
lint: venv
	$(VENV)/bin/ruff check include dags plugins spark_apps scripts tests
	$(VENV)/bin/ruff format --check include dags plugins spark_apps scripts tests
	$(VENV)/bin/mypy

test-unit: venv
	$(PY) -m pytest tests/unit tests/dags $(PYTEST_ARGS)

# --- more ----------------------------------------------------------------------------------------
ui: setup broker-start
	@echo "Airflow UI on http://127.0.0.1:8080 (user admin, password in $(AIRFLOW_HOME)/simple_auth_manager_passwords.json.generated)"
	AIRFLOW__API__PORT=8080 airflow standalone

broker-start: venv kafka
	tidewater broker start --port $(PORT)

broker-stop: venv
	tidewater broker stop

# The configuration reference (generated from the code), then the documentation site into site/ (strict: a broken
# link fails; tests/unit/test_docs.py runs the same build in make test).
docs: venv
	tidewater docs --output docs/configuration.md --schema docs/pipeline.schema.json --cli docs/reference/cli.md
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict --quiet

clean:
	-tidewater broker stop 2>/dev/null
	rm -rf $(DATA)

# Run any airflow or tidewater command with this project's environment, e.g.
#   make airflow ARGS="dags list"      make tidewater ARGS="status --pipeline include/pipelines/pizzas.yaml"
airflow tidewater: setup
	$@ $(ARGS)

# An hour of production with faults (scripts/soak.py; SOAK_MINUTES, default 60), audited at the end: writes SOAK.md.
# tests/e2e/test_soak.py runs its 3-minute version in make test.
SOAK_MINUTES ?= 60
soak: setup test-system-deps s3-stand-in executor-env spark-connect-install rest-catalog schema-registry
	$(PY) scripts/soak.py --minutes $(SOAK_MINUTES) --markdown SOAK.md

# Benchmarks (several minutes): writes BENCHMARKS.md. BENCH_ARGS="--sizes 1000000 --single 0" for a short run.
bench: setup
	$(PY) scripts/bench.py $(BENCH_ARGS)

# The embedded Apache Kafka broker: start time, memory, and 1M records produced, read and ingested (a section of
# BENCHMARKS.md; a few minutes). BENCH_ARGS="--records 100000" for a short run.
bench-broker: setup
	$(PY) scripts/bench_broker.py $(BENCH_ARGS)

# Tidewater beside the Apache Iceberg Kafka Connect sink and Spark Structured Streaming on the same Kafka, JDBC
# catalog (PostgreSQL), warehouse and 2 cores: a backlog drained (a section of BENCHMARKS.md, docs/img/bench-peers.png
# and docs/explanation/peers.md's figures). BENCH_ARGS="--records 200000" for a short run.
bench-peers: setup test-system-deps peers spark-connect-install
	$(PY) scripts/bench_peers.py $(BENCH_ARGS)

bench-maintenance: setup
	$(PY) scripts/bench_maintenance.py

bench-routing: setup
	$(PY) scripts/bench_routing.py

bench-metadata: setup
	$(PY) scripts/bench_metadata.py

bench-cdc: setup
	$(PY) scripts/bench_cdc.py $(BENCH_ARGS)
	$(PY) scripts/bench_cdc_tables.py

bench-cdc-tables: setup test-system-deps
	$(PY) scripts/bench_cdc_tables.py $(BENCH_ARGS)

bench-data-docs: setup
	$(PY) scripts/bench_data_docs.py $(BENCH_ARGS)

bench-audit: setup
	$(PY) scripts/bench_audit.py $(BENCH_ARGS)

bench-cluster: setup executor-env
	$(PY) scripts/bench_cluster.py $(BENCH_ARGS)

bench-profile: setup
	$(PY) scripts/profile_data_path.py $(PROFILE_ARGS)

bench-dag: setup test-system-deps s3-stand-in executor-env spark-connect-install
	$(PY) scripts/bench_dag_latency.py $(BENCH_ARGS)

# How many pipelines one Airflow carries: Airflow's CPU for 1, 20 and 50 caught-up pipelines on a one-minute
# schedule (LocalExecutor on PostgreSQL), and one routed pipeline over 20 topics (about 25 minutes).
# The package in Airflows it did not choose (scripts/install_range.py): about two minutes of dependency resolution
# a release. make test runs the same check on the oldest and newest release (tests/e2e/test_install.py); this runs
# every release, and make release runs it before anything is versioned. INSTALL_ARGS="--airflow 3.2.2".
install-check: setup
	$(PY) scripts/install_range.py $(INSTALL_ARGS)

# Cut a release: make release VERSION=0.3.0 (scripts/release.py: version, CHANGELOG, dist/, tag; nothing pushed),
# after the install check over every supported Airflow release (make test covers only the range's ends)
release: setup
	@test -n "$(VERSION)" || { echo "usage: make release VERSION=X.Y.Z [NEXT=X.Y.Z.dev0]"; exit 2; }
	$(MAKE) install-check
	$(PY) scripts/release.py $(VERSION) $(if $(NEXT),--next $(NEXT))

# CeleryExecutor across test hosts (network namespaces; needs root): docs/explanation/sizing.md, BENCHMARKS.md
bench-sizing-celery: setup test-system-deps s3-stand-in
	$(PY) scripts/bench_sizing_celery.py $(BENCH_ARGS)

bench-sizing: setup test-system-deps
	$(PY) scripts/bench_sizing.py $(BENCH_ARGS)

# Costs as a platform grows (pipelines in the folder, partitions of a topic), with the fixes' before and after:
# a section of BENCHMARKS.md and docs/img/bench-scale.png (about 25 minutes). BENCH_ARGS="--pipelines 1,50 --partitions 6,100".
bench-scale: setup
	$(PY) scripts/bench_scale.py $(BENCH_ARGS)
