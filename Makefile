# The two commands a newcomer needs: `make run` and `make test`.
# Both create .venv on first use; everything else is optional.

PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
BUILD_INPUTS := pyproject.toml setup.py $(wildcard ext/*.pyx ext/*.pxd) $(shell find protos -name '*.proto' 2>/dev/null)

# Addresses for `make run`: istiod's ports, on loopback.
RUN_FLAGS ?= --config-dir examples/config --mesh-config examples/mesh.yaml \
	--grpc-addr 127.0.0.1:15010 --http-addr 127.0.0.1:8080 --monitoring-addr 127.0.0.1:15014 \
	--webhook-addr 127.0.0.1:15017 --secure-grpc-addr 127.0.0.1:15012 --self-signed-ca-dir build/example-ca

.PHONY: run test test-processes test-processes-beside test-checks install install-test lint typecheck bench bench-quick clean reference

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
	@echo "/metrics on 127.0.0.1:15014, the CA and TLS xDS on 127.0.0.1:15012. To attach an Envoy, run it with examples/envoy/productpage.yaml"
	@echo "(README.md, 'Attaching an Envoy'). Ctrl-C stops it."
	$(BIN)/meshpilot discovery $(RUN_FLAGS)

lint: install-test
	$(BIN)/ruff check src tests bench
	$(BIN)/ruff format --check src tests bench
	PATH="$(CURDIR)/$(BIN):$$PATH" $(BIN)/cython-lint --max-line-length 110 ext

typecheck: install-test
	$(BIN)/mypy

# Programs the tests drive that pip cannot install: iptables, ip, setpriv and curl for the
# real capture tests (tests/iptables), and a headless Chromium for /debug/ui
# (tests/integration/test_debug_ui.py); and jemalloc, which `meshpilot discovery` preloads
# (src/meshpilot/server/allocator.py). Installed once, only when one is missing.
SYSTEM_TOOLS := iptables-restore ip setpriv curl chromium
JEMALLOC_LIB := libjemalloc.so.2
JEMALLOC_PACKAGE := libjemalloc2
SYSTEM_LIBS := $(JEMALLOC_LIB)
$(VENV)/.system-deps: $(BIN)/python
	for tool in $(SYSTEM_TOOLS); do command -v $$tool >/dev/null || missing=1; done; \
	for lib in $(SYSTEM_LIBS); do ldconfig -p | grep -q "$$lib" || missing=1; done; \
	if [ -n "$$missing" ]; then apt-get update && apt-get install -y iptables iproute2 util-linux curl chromium $(JEMALLOC_PACKAGE); fi
	touch $@

# Istio and Kubernetes as the referee (tests/reference, the real-API-server and agent tests):
# istiod, pilot-agent, istioctl, kube-apiserver and etcd built from the module versions pinned in
# reference/*/go.mod, with Istio's own build tags (Makefile.core.mk). Go's module and build caches make
# a rebuild a relink. Binaries go to build/reference/bin, which git ignores; nothing is committed.
GO ?= go
REFERENCE_BIN := build/reference/bin
# The version istiod reads from the agent's ISTIO_VERSION: the module's VERSION file with "-dev", as
# Istio's Makefile stamps a development build.
ISTIO_BUILD_VERSION := 1.31-dev
ISTIO_LDFLAGS := -X istio.io/istio/pkg/version.buildVersion=$(ISTIO_BUILD_VERSION)
REFERENCE_BINARIES := $(addprefix $(REFERENCE_BIN)/,pilot-discovery pilot-agent istioctl xdsdump kube-apiserver etcd)
# The Makefile too: it holds the version stamp (ISTIO_BUILD_VERSION), which tests/support/golden.py
# repeats and test_istio_agent.py checks against the built agent.
ISTIO_MOD := reference/istio/go.mod reference/istio/go.sum Makefile

reference: $(REFERENCE_BINARIES)

$(REFERENCE_BIN)/pilot-discovery $(REFERENCE_BIN)/istioctl: $(ISTIO_MOD)
	cd reference/istio && $(GO) build -trimpath -tags vtprotobuf,disable_pgv -ldflags '$(ISTIO_LDFLAGS)' \
		-o $(CURDIR)/$@ istio.io/istio/$(if $(filter %istioctl,$@),istioctl/cmd/istioctl,pilot/cmd/pilot-discovery)

$(REFERENCE_BIN)/pilot-agent: $(ISTIO_MOD)
	cd reference/istio && $(GO) build -trimpath -tags agent,disable_pgv,grpcnotrace,retrynotrace \
		-ldflags '$(ISTIO_LDFLAGS)' -o $(CURDIR)/$@ istio.io/istio/pilot/cmd/pilot-agent

# Istio's test helpers call protoc-gen-validate's Validate, which disable_pgv leaves out.
$(REFERENCE_BIN)/xdsdump: $(ISTIO_MOD) $(wildcard reference/istio/xdsdump/*.go)
	cd reference/istio && $(GO) build -trimpath -tags vtprotobuf -o $(CURDIR)/$@ ./xdsdump

$(REFERENCE_BIN)/kube-apiserver: reference/kube/go.mod reference/kube/go.sum
	cd reference/kube && $(GO) build -trimpath -o $(CURDIR)/$@ k8s.io/kubernetes/cmd/kube-apiserver

$(REFERENCE_BIN)/etcd: reference/etcd/go.mod reference/etcd/go.sum
	cd reference/etcd && $(GO) build -trimpath -o $(CURDIR)/$@ go.etcd.io/etcd/server/v3

# Where Go is present, `make test` builds the reference binaries first and requires every test that
# uses them to run (MESHPILOT_REQUIRE_REFERENCE turns their skip into a failure); without Go they skip
# with a line naming `make reference`.
HAVE_GO := $(shell command -v $(GO) 2>/dev/null)
TEST_REFERENCE := $(if $(HAVE_GO),reference)
TEST_ENV := $(if $(HAVE_GO),MESHPILOT_REQUIRE_REFERENCE=1)

# The whole suite: lint, types, the tests with the compiled hot paths (a test fails if they did not
# load), and the twins' own run of the unit tests. It runs as two lines side by side, each printed
# when it ends: the tests that drive real processes (Envoy, servers, the reference binaries) mostly
# wait on them, using 81% of one core in a run alone, so the checks and both unit runs fill the
# other core. The process tests stay one at a time within a line: many bind fixed loopback
# addresses. The checks' line ends about seven minutes before the process line, so it then runs the
# process tests that compare outputs and objects without timing anything and use only ports of
# their own (PROCESS_TESTS_BESIDE: istiod's answers, istioctl's injection, manifests and the CA's
# objects on a real API server), about three minutes of them. Between the markers' selections and
# the two process runs every test runs once. Each line picks its servers' ports from its own range
# (bench/server.py, free_port) and each process run keeps its own pytest cache, so the two never
# pick the same port or overwrite each other's record of failures.
PROCESS_TESTS := envoy or integration or reference
PROCESS_TESTS_BESIDE := tests/reference/test_istiod_fidelity.py tests/deploy/test_manifests.py \
	tests/ca/test_kube_store.py tests/kube/test_root_cert.py tests/kube/test_webhook_ca.py \
	tests/webhooks/inject/test_istioctl_referee.py tests/webhooks/inject/test_custom_sidecar.py
CHECKS_ENV := $(TEST_ENV) MESHPILOT_TEST_PORT_RANGE=26384-32767
test: $(VENV)/.system-deps $(TEST_REFERENCE)
	@echo "make test: the process tests and (lint, types, unit tests compiled, then as twins, then the process tests beside) run side by side"
	$(MAKE) --no-print-directory -j2 --output-sync=target test-processes test-checks

test-processes: $(VENV)/.installed-test
	$(TEST_ENV) MESHPILOT_TEST_PORT_RANGE=20000-26383 MESHPILOT_EXPECT_EXTENSIONS=1 \
		$(BIN)/pytest -q -o cache_dir=.pytest_cache/processes -m "$(PROCESS_TESTS)" \
		$(addprefix --ignore=,$(PROCESS_TESTS_BESIDE)) tests

test-processes-beside: $(VENV)/.installed-test
	$(CHECKS_ENV) MESHPILOT_EXPECT_EXTENSIONS=1 \
		$(BIN)/pytest -q -o cache_dir=.pytest_cache/processes-beside -m "$(PROCESS_TESTS)" $(PROCESS_TESTS_BESIDE)

test-checks: lint typecheck
	$(CHECKS_ENV) MESHPILOT_EXPECT_EXTENSIONS=1 $(BIN)/pytest -q -m "not ($(PROCESS_TESTS))" tests
	$(CHECKS_ENV) MESHPILOT_NO_EXTENSIONS=1 $(BIN)/pytest -q -m "not ($(PROCESS_TESTS))" tests
	$(MAKE) --no-print-directory test-processes-beside

$(VENV)/.installed-bench: $(VENV)/.installed-test
	$(BIN)/pip install --quiet -e '.[test,bench]'
	touch $@

# The benchmark suites write bench/results/<suite>.json and docs/benchmarks.md. They need jemalloc,
# which the server preloads: without it the large pushes cost twice the CPU (bench/notes.md).
$(VENV)/.bench-deps: $(BIN)/python
	ldconfig -p | grep -q $(JEMALLOC_LIB) || (apt-get update && apt-get install -y $(JEMALLOC_PACKAGE))
	touch $@

bench: $(VENV)/.bench-deps $(VENV)/.installed-bench
	$(BIN)/python -m bench.run --suite full

bench-quick: $(VENV)/.bench-deps $(VENV)/.installed-bench
	$(BIN)/python -m bench.run --suite quick

clean:
	rm -rf build $(VENV) src/meshpilot/_proto src/*.egg-info
	find src ext -name '*.so' -o -name '*.c' | xargs rm -f
