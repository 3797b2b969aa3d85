# Two commands do everything on a fresh machine (Python >= 3.11, Java 17, Maven, Go):
#   make demo   local Kafka up, example specs validated, planned, applied, re-applied (no changes),
#               then each example queue loaded and run on Spark
#   make test   lint, mypy and the whole test suite against real parts
# the fast loop while working:
#   make check  lint, mypy, the unit tests and the light integration tests against the real broker
# and, as root on Linux, the Kubernetes half:
#   make demo-kubernetes   the local cluster up, a queue deployed with Helm, processing in pods
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
QP := $(BIN)/queueplane

.PHONY: setup setup-demo setup-kubernetes setup-check setup-test demo demo-kubernetes check test lint typecheck \
  crd bench clean local-down test-host kubernetes-host

# One venv, installed as far as the targets run so far need: the demo needs the worker extra
# (Spark, Arrow), the Kubernetes demo also the deploy extra (the Kubernetes API client), the
# tests and the lint the dev extra (all of those, Airflow, pytest, ruff, mypy). A later
# `make test` adds to the demo's venv. Each stamp is newer than pyproject.toml and
# constraints.txt while its install is current; an install touches the stamps of the extras it
# includes too.
WORKER_STAMP := $(VENV)/.installed-worker
DEPLOY_STAMP := $(VENV)/.installed-deploy
DEV_STAMP := $(VENV)/.installed-dev
comma := ,
define install
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "queueplane needs Python >= 3.11")'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --progress-bar on -c constraints.txt -e '.[$(1)]'
endef
$(WORKER_STAMP): pyproject.toml constraints.txt
	$(call install,worker)
	touch $@
$(DEPLOY_STAMP): pyproject.toml constraints.txt
	$(call install,worker$(comma)deploy)
	touch $@ $(WORKER_STAMP)
$(DEV_STAMP): pyproject.toml constraints.txt
	$(call install,dev)
	touch $@ $(WORKER_STAMP) $(DEPLOY_STAMP)

# What the project downloads or builds (Kafka and connector jars, helm, the local Kubernetes) is
# fetched by `queueplane local fetch --for TIER`, with progress, into ~/.cache/queueplane, so no
# demo step or timed test waits on it. Each target fetches its tier only (queueplane/prefetch.py):
#   setup-demo        the worker extra; Kafka's jars and Spark's Kafka connector
#   setup-kubernetes  also the deploy extra, the cluster's Debian packages (root), its binaries,
#                     helm, the worker image
#   setup-check       the dev extra; also helm, Prometheus and the class-data archive of Spark's JVM
#   setup-test        everything (`make setup`)
# The Go builds (the cluster's binaries, helm, toxiproxy, Prometheus) are most of a fresh
# machine's set-up and need only Go and Python's standard library: they start before pip and
# run beside it, and `local fetch` waits for any still building. The demo's tier has none.
# The editable install's bytecode is compiled here too: every Spark Python worker imports the
# runtime after its fork, and where Python writes no bytecode (PYTHONDONTWRITEBYTECODE, which
# some CI machines set) each one compiled queueplane from source, 0.7 s of CPU a worker.
GO_BUILDS_LOG := .queueplane/go-builds.log
# $(1): the tier, $(2): the venv stamp it installs
define fetch_tier
	@mkdir -p .queueplane
	$(if $(filter-out demo,$(1)),@echo "== the Go builds start beside pip (log: $(GO_BUILDS_LOG)); 'local fetch' waits for them")
	@builds=; $(if $(filter-out demo,$(1)),PYTHONPATH=$(CURDIR) $(PYTHON) -m queueplane.prefetch --go --for $(1) \
	  >$(GO_BUILDS_LOG) 2>&1 & builds=$$!;) \
	  if $(MAKE) --no-print-directory $(2) && $(QP) local fetch --for $(1) && $(BIN)/python -m compileall -q queueplane; \
	  then status=0; else status=$$?; fi; \
	  [ -z "$$builds" ] || { kill $$builds 2>/dev/null || true; wait $$builds 2>/dev/null || true; }; exit $$status
endef
setup: setup-test
setup-demo:
	$(call fetch_tier,demo,$(WORKER_STAMP))
setup-kubernetes: kubernetes-host
	$(call fetch_tier,kubernetes,$(DEPLOY_STAMP))
setup-check:
	@$(MAKE) --no-print-directory test-host TEST_HOST_TOOLS=zsh
	$(call fetch_tier,check,$(DEV_STAMP))
setup-test: kubernetes-host test-host
	$(call fetch_tier,test,$(DEV_STAMP))

demo: setup-demo
	@echo "== 1. start the local Kafka broker (jars from Maven Central, cached)"
	$(QP) local up
	@echo "== 2. validate every spec"
	$(QP) validate specs
	@echo "== 3. plan: what apply would change"
	$(QP) plan specs/examples
	@echo "== 4. apply"
	$(QP) apply specs/examples --yes
	@echo "== 5. apply again: nothing to change"
	$(QP) apply specs/examples --yes
	@echo "== 6. look with Kafka's own tools"
	$(QP) local kafka topics --describe --topic cafe.coffee-orders.v1
	$(QP) local kafka configs --describe --entity-type groups --entity-name cafe-baristas
	@echo "== 7. load the coffee-orders share queue: 2000 orders, some poison (not JSON), some slow"
	$(QP) load specs/examples/cafe/coffee-orders.yaml --count 2000 --poison-rate 0.01 --slow-rate 0.02
	@echo "== 8. run its worker on Spark (local mode) until the queue is caught up"
	$(QP) run specs/examples/cafe/coffee-orders.yaml --until-idle 5s
	@echo "== 9. the dead-letter queue, with Kafka's own console consumer"
	$(QP) local kafka console-consumer --topic cafe.coffee-orders.v1.dlq --from-beginning --max-messages 3 \
	  --timeout-ms 5000 --property print.headers=true || true
	@echo "== 10. a consumer-group queue (ordered per key, exactly once) and a kmq queue, briefly"
	$(QP) load specs/examples/payments/payment-events.yaml --count 500 --poison-rate 0.01
	$(QP) run specs/examples/payments/payment-events.yaml --until-idle 5s
	$(QP) load specs/examples/messaging/email-jobs.yaml --count 500 --poison-rate 0.01 --slow-rate 0.02
	$(QP) run specs/examples/messaging/email-jobs.yaml --until-idle 5s
	@echo "== done. The broker keeps running: 'queueplane local status', stop it with 'make local-down'."

# The Kubernetes half: the same coffee-orders queue deployed to the local cluster with Helm.
KUBECTL := $(QP) local kubernetes kubectl
# The spec's deployment.namespace.
DEMO_NS := cafe
demo-kubernetes: setup-kubernetes
	@echo "== 1. the local Kubernetes (and Kafka, listening for pods too); the worker image built and imported"
	$(QP) local kubernetes up
	$(QP) local kubernetes status
	@echo "== 2. the queue's topics on Kafka"
	$(QP) apply specs/examples/cafe/coffee-orders.yaml --yes
	@echo "== 3. a namespace that admits only pods meeting Pod Security 'restricted'"
	$(KUBECTL) create namespace $(DEMO_NS) --dry-run=client -o yaml | $(KUBECTL) apply -f -
	$(KUBECTL) label --overwrite namespace $(DEMO_NS) pod-security.kubernetes.io/enforce=restricted
	@echo "== 4. deploy with Helm: the spec's values and the local cluster's (image, Kafka for pods)"
	$(QP) deploy specs/examples/cafe/coffee-orders.yaml --kubeconfig .queueplane/local/kubeconfig \
	  --values .queueplane/local/cluster-values.yaml --timeout 5m
	$(KUBECTL) get pods -n $(DEMO_NS) -L app.kubernetes.io/component
	@echo "== 5. 1000 orders, some poison; the pods handle them"
	$(QP) load specs/examples/cafe/coffee-orders.yaml --count 1000 --poison-rate 0.01
	@for _ in $$(seq 60); do sleep 5; \
	  total=$$($(QP) lag specs/examples/cafe/coffee-orders.yaml -o json | $(BIN)/python -c 'import json, sys; print(json.load(sys.stdin)["total"])'); \
	  echo "backlog: $$total"; [ "$$total" != 0 ] || break; done
	$(QP) lag specs/examples/cafe/coffee-orders.yaml
	@echo "== 6. the worker's own lines (a batch's line comes when it ends)"
	@for _ in $$(seq 30); do $(KUBECTL) logs deployment/coffee-orders -n $(DEMO_NS) | grep -q ' queueplane.worker: ' && break; sleep 2; done
	$(KUBECTL) logs deployment/coffee-orders -n $(DEMO_NS) | grep ' queueplane.worker: ' | tail -n 5
	@echo "== done. 'queueplane local kubernetes kubectl get pods -n $(DEMO_NS)'; stop it with 'make local-down'."

lint: $(DEV_STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check queueplane tests bench spark_apps specs dags

# mypy over the library; pyproject.toml's [tool.mypy] lists the modules not yet clean.
typecheck: $(DEV_STAMP)
	$(BIN)/mypy queueplane

# The Queue CRD's spec schema is generated from specs/queue-v1.schema.json
# (queueplane/deploy/crd_schema.py): run this after changing the spec schema and commit the CRD;
# tests/unit/test_queue_crd.py fails while the committed one is stale.
crd: $(DEV_STAMP)
	$(BIN)/python -m queueplane.deploy.crd_schema

# The local Kubernetes runs containerd, runc and the CNI plugins from Debian, and builds images with
# mmdebstrap and buildah (queueplane/local/kubernetes). Root only: elsewhere the cluster is not built.
KUBE_HOST_PACKAGES := containerd runc containernetworking-plugins mmdebstrap buildah iptables openssl
kubernetes-host:
	@[ "$$(id -u)" != 0 ] || [ "$$(dpkg-query -W -f='$${Status}\n' $(KUBE_HOST_PACKAGES) 2>/dev/null | \
	  grep -c 'install ok installed')" = "$(words $(KUBE_HOST_PACKAGES))" ] || { \
	  echo "== installing the local Kubernetes' host packages (apt): $(KUBE_HOST_PACKAGES)"; \
	  apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q $(KUBE_HOST_PACKAGES); }

# Host tools the tests drive, from apt: Debian's chromium for the Airflow UI test (Playwright, no
# browser download from a CDN) and zsh for the shell completion test.
TEST_HOST_TOOLS := chromium zsh
test-host:
	@missing="$$(for tool in $(TEST_HOST_TOOLS); do command -v $$tool >/dev/null || echo $$tool; done)"; \
	  [ -z "$$missing" ] || { echo "== installing" $$missing "(apt) for the tests"; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -q && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -q $$missing; }

# The suite runs in TEST_PROCESSES pytest processes, split by file; tests/parallel.py keeps the
# folders that share a session resource (the local Kubernetes, Airflow's DB) in one process and
# runs the tests marked heavy alone, after the light ones. Four processes on two cores: most
# light tests wait (locks running out, idle windows, outages), and with three the cores were a
# fifth idle while they ran. Each run's timeline (tests/timeline.py) is kept in
# TEST_TIMELINE; `bench/test_timeline.py` says where its time went and draws it.
TEST_PROCESSES ?= 4
TEST_TIMELINE := .queueplane/test-timeline.jsonl
test: setup-test lint typecheck
	@mkdir -p .queueplane && rm -f $(TEST_TIMELINE)
	QUEUEPLANE_TEST_TIMELINE=$(CURDIR)/$(TEST_TIMELINE) $(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder

# The fast loop: lint, mypy, then the unit tests and the light integration tests against the
# real broker (those that start no Spark worker: tests/parallel.py lists them and conftest marks
# them `check`), in the same processes and split as `make test`. Left out: the tests of Spark
# workers, the heavy ones (broker restarts, network faults, timed autoscaling), and the
# folders of the local Kubernetes, Airflow and the packaging builds. `make test` runs them all;
# CI runs `make test`.
CHECK_TESTS := tests/unit tests/integration -m 'check and not heavy'
check: setup-check lint typecheck
	$(BIN)/pytest -n $(TEST_PROCESSES) --dist loadfile --no-loadscope-reorder $(CHECK_TESTS)

bench: setup
	$(BIN)/python bench/provision.py
	$(BIN)/python bench/share.py
	$(BIN)/python bench/consumer.py
	$(BIN)/python bench/autoscale.py
	$(BIN)/python bench/kmq.py
	$(BIN)/python bench/footprint.py
	$(BIN)/python bench/soak.py
	$(BIN)/python bench/goals.py

local-down: $(WORKER_STAMP)
	[ "$$(id -u)" != 0 ] || $(QP) local kubernetes down
	$(QP) local down

clean:
	-$(QP) local down --purge
	rm -rf $(VENV) .queueplane bench/results
