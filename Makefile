# The two commands a newcomer needs: `make run` and `make test`.
# Both create .venv on first use; everything else is optional.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD_INPUTS := pyproject.toml setup.py $(wildcard ext/*.pyx ext/*.pxd) $(shell find protos -name '*.proto' 2>/dev/null)

# Addresses for `make run`: istiod's ports, on loopback.
RUN_FLAGS ?= --config-dir examples/config --mesh-config examples/mesh.yaml \
	--grpc-addr 127.0.0.1:15010 --http-addr 127.0.0.1:8080 --monitoring-addr 127.0.0.1:15014 \
	--webhook-addr 127.0.0.1:15017

.PHONY: run test install install-test lint typecheck unit bench bench-quick clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

$(VENV)/.installed: $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install --quiet -e .
	touch $@

$(VENV)/.installed-test: $(BIN)/python $(BUILD_INPUTS)
	$(BIN)/pip install --quiet -e '.[test]'
	touch $(VENV)/.installed $@

install: $(VENV)/.installed

install-test: $(VENV)/.installed-test

run: install
	@echo "meshpilot serves examples/config: xDS on 127.0.0.1:15010, /ready and /debug on 127.0.0.1:8080,"
	@echo "/metrics on 127.0.0.1:15014. To attach an Envoy, run it with examples/envoy/productpage.yaml"
	@echo "(README.md, 'Attaching an Envoy'). Ctrl-C stops it."
	$(BIN)/meshpilot discovery $(RUN_FLAGS)

lint: install-test
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/cython-lint --max-line-length 110 ext

typecheck: install-test
	$(BIN)/mypy

# Programs the tests drive that pip cannot install: iptables, ip, setpriv and curl for the
# real capture tests (tests/iptables). Installed once, only when one is missing.
SYSTEM_TOOLS := iptables-restore ip setpriv curl
$(VENV)/.system-deps: $(BIN)/python
	for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	if [ -n "$$missing" ]; then apt-get update && apt-get install -y iptables iproute2 util-linux curl; fi
	touch $@

# The whole suite: lint, types, then tests with the compiled hot paths (a test
# fails if they did not load), then the twins' own run of the unit tests.
test: $(VENV)/.system-deps lint typecheck
	MESHPILOT_EXPECT_EXTENSIONS=1 $(BIN)/pytest -q
	MESHPILOT_NO_EXTENSIONS=1 $(BIN)/pytest -q -m "not envoy and not integration" tests

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $@

# The benchmark suites write bench/results/<suite>.json and docs/benchmarks.md.
bench: $(VENV)/.installed-bench
	$(BIN)/python -m bench.run --suite full

bench-quick: $(VENV)/.installed-bench
	$(BIN)/python -m bench.run --suite quick

clean:
	rm -rf build $(VENV) src/meshpilot/_proto src/*.egg-info
	find src ext -name '*.so' -o -name '*.c' | xargs rm -f
