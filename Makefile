# hpbroker: every target sets up what it needs first, so `make run` and `make test` work on a
# fresh Debian machine (root, or a user with sudo).  The virtualenv lives in .venv.

SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed
# Stamp of the compiled extensions (setup.py lists them), rebuilt when any of their sources changes.
EXT := $(VENV)/.extensions-built
EXT_SOURCES := setup.py $(wildcard hpbroker/*.pyx hpbroker/*.pxd hpbroker/*/*.pyx hpbroker/*/*.pxd) \
	$(wildcard hpbroker/_csrc/*.c hpbroker/_csrc/*.h)
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
# Debian packages the project needs at run time: ZooKeeper (its jars) and a Java runtime for it and
# for Spark (hpbroker.spark needs Java 17 or later: Debian 12's default-jre-headless is 17); faketime
# (libfaketime) for the chaos suite's clock jumps; nftables for its network splits.
DEBIAN_PACKAGES := zookeeper default-jre-headless faketime nftables
PYTEST_ARGS ?=

.PHONY: setup system-deps build test bench bench-long bench-replication bench-security bench-scaling bench-audit chaos run demo lint clean install

setup: system-deps $(INSTALLED) $(EXT)

system-deps:
	@if ! command -v java >/dev/null 2>&1 || [ ! -f /usr/share/java/zookeeper.jar ] || \
	    ! ls /usr/lib/*/faketime/libfaketime.so.1 >/dev/null 2>&1 || \
	    [ ! -x /usr/sbin/nft ]; then \
	  echo "Installing Debian packages: $(DEBIAN_PACKAGES)"; \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(DEBIAN_PACKAGES); \
	fi

$(INSTALLED): pyproject.toml setup.py
	[ -x $(PY) ] || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip setuptools wheel cython
	$(PY) -m pip install -q --no-build-isolation -e '.[test,spark]'
	touch $@

$(EXT): $(INSTALLED) $(EXT_SOURCES)
	$(PY) setup.py -q build_ext --inplace
	touch $@

build: setup

test: setup
	$(PY) -m pytest -q --durations=20 $(PYTEST_ARGS)

# bench: the pytest-benchmark suite, then loadgen's standard scenarios 1-4 against a real broker
# (bench/scenarios.py; bench/results/scenarios.{json,md}); SCENARIO_ARGS adds flags, e.g. "--repeat 1".
# bench-long: scenario 5, 10 GB written twice and a raw 10 GB write (about 2 minutes; topics deleted).
# bench-replication (also the last step of bench): three brokers and a ZooKeeper of their own on this
# machine (bench/replication.py): replicated acks=all produce against unreplicated acks=1, and failover
# times (SIGTERM, kill -9 at two ZooKeeper session timeouts); bench/results/replication.{json,md}.
# REPLICATION_ARGS adds flags, e.g. "--rounds 1 --repeat 1".
# bench-security (also a step of bench): scenarios 1 and 3 against a broker with security = "curve"
# beside one without, interleaved (bench/security.py; bench/results/security.{json,md}).
# SECURITY_ARGS adds flags, e.g. "--rounds 5".
# bench-scaling: produce and consume against brokers of 1, 2, 4 and 8 workers (bench/scaling.py;
# bench/results/scaling.{json,md}); meant for machines with many cores. SCALING_ARGS adds flags.
SCENARIO_ARGS ?=
REPLICATION_ARGS ?=
SECURITY_ARGS ?=
SCALING_ARGS ?=
bench: setup
	mkdir -p bench/results
	$(PY) -m pytest bench --benchmark-only --benchmark-columns=min,median,mean,ops,rounds \
	  --benchmark-json=bench/results/storage.json -p no:cacheprovider -q $(PYTEST_ARGS)
	$(PY) -m bench.scenarios $(SCENARIO_ARGS)
	$(PY) -m bench.security $(SECURITY_ARGS)
	$(PY) -m bench.replication $(REPLICATION_ARGS)

bench-security: setup
	mkdir -p bench/results
	$(PY) -m bench.security $(SECURITY_ARGS)

bench-scaling: setup
	mkdir -p bench/results
	$(PY) -m bench.scaling $(SCALING_ARGS)

bench-replication: setup
	mkdir -p bench/results
	$(PY) -m bench.replication $(REPLICATION_ARGS)

bench-long: setup
	mkdir -p bench/results
	$(PY) -m bench.scenarios --only 5 $(SCENARIO_ARGS)

# bench-audit: the audit of 10 million records on Spark in local mode, beside a plain Python count
# (bench/audit.py; a broker of its own in a temporary directory, removed with its data afterwards;
# bench/results/audit.json).  AUDIT_ARGS adds flags, e.g. "--records 2M --repeat 1".
AUDIT_ARGS ?=
bench-audit: setup
	mkdir -p bench/results
	$(PY) -m bench.audit $(AUDIT_ARGS)

# chaos: the chaos campaign (chaos/, docs/CHAOS.md), as root: a ZooKeeper ensemble of three and three
# brokers, each in a network namespace of its own, producers (acks=all and acks=1) and a consumer group,
# 30 minutes of faults on a seeded schedule (kill -9, SIGSTOP, partitions, ZooKeeper kills, worker
# kills, clock jumps, a full disk), then every acknowledged record checked; results in
# chaos-results/<UTC time>/ (report.md, report.json, throughput.svg).  The seed and the command that
# replays it are printed first.  CHAOS_ARGS adds flags, e.g. CHAOS_ARGS="--seed 7 --brokers 5" or
# "--short" (about 3 minutes, as in make test).
CHAOS_ARGS ?=
chaos: setup
	$(PY) -m chaos $(CHAOS_ARGS)

# The main job: the local stack (a ZooKeeper of its own and a broker registered in it, data under
# ./data) until Ctrl-C.  RUN_ARGS adds flags of `hpbroker up`, e.g. RUN_ARGS="--workers 4".
RUN_ARGS ?=
run: setup
	$(PY) -m hpbroker.cli up --data-dir data $(RUN_ARGS)

# demo: the tour in about a minute (examples/demo.py): a local stack on ports of its own, a topic,
# loadgen end to end with live progress, the Spark audit's table, a few metrics; outputs in
# demo-output/.  DEMO_ARGS adds flags, e.g. DEMO_ARGS="--rate 500000 --duration 20".
DEMO_ARGS ?=
demo: setup
	$(PY) examples/demo.py $(DEMO_ARGS)

# install: hpbroker as a systemd service on this machine (deploy/install.sh says what it does:
# a user, /var/lib/hpbroker, /etc/hpbroker/hpbroker.toml if absent, a virtualenv in /opt/hpbroker,
# the unit); then `systemctl enable --now hpbroker`.
# The layout variables given to make (command line or environment) reach install.sh through sudo.
INSTALL_VARIABLES := PREFIX CONFIG_DIR DATA_DIR UNIT_DIR SERVICE_USER PYTHON INSTALL_PACKAGE
INSTALL_ENV = $(foreach v,$(INSTALL_VARIABLES),$(if $(filter environment% command,$(origin $(v))),\
	$(v)='$(subst ','\'',$($(v)))'))

install:
	$(SUDO) env $(INSTALL_ENV) deploy/install.sh

lint: setup
	$(PY) -m ruff check hpbroker loadgen chaos tests bench spark examples

clean:
	rm -rf build $(VENV) .pytest_cache .benchmarks bench/results demo-output
	find hpbroker -name '*.so' -delete
	find hpbroker -name '*.pyx' | sed 's/\.pyx$$/.c/' | xargs rm -f
