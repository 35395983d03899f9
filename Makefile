# Every target creates the virtual environment it needs, so `make demo` and
# `make test` work on a fresh machine with nothing but python3.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
comma  := ,
EXTRAS ?= test,dev,bench,hiredis
STAMP  := $(VENV)/.installed-$(subst $(comma),-,$(EXTRAS))

.PHONY: venv demo test test-fast lint fmt bench manifests clean

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q -c constraints.txt -e '.[$(EXTRAS)]'
	touch $@

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/python examples/demo.py

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

fmt: $(STAMP)
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

# The whole suite. CI=true turns any skipped test into a failure (tests/conftest.py).
test: lint
	$(BIN)/pytest -m "not scale and not image" $(PYTEST_ARGS)

test-fast: $(STAMP)
	$(BIN)/pytest -m "not scale and not image" -x -q $(PYTEST_ARGS)

# Seed 001 §9 at full size: 50,000 jobs, 4 workers, 2 kill -9ed, and RQ on the same
# workload as the anchor (tests/queue/test_scale.py, bench/queue_scale.py). A few minutes.
.PHONY: test-scale
test-scale: $(STAMP)
	$(BIN)/pytest -m scale -s -p no:cacheprovider $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/lease_cycle.py

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache

# The container image, built and run with Debian's podman/buildah/runc and no registry.
# All their state lives in .work/podman (scripts/image.sh); test-image removes it after,
# keeping only the cached base tarball.
.PHONY: image test-image image-clean e2e-kind
image:
	scripts/image.sh build

test-image: $(STAMP)
	PYTEST=$(BIN)/pytest scripts/image.sh test $(PYTEST_ARGS)

image-clean:
	scripts/image.sh clean

# The user's real path, for machines with Docker, kind, helm and kubectl (not CI's).
e2e-kind:
	scripts/e2e-kind.sh

# Files generated from charts/cron-runner; tests/chart fails when they drift.
.PHONY: chart-docs
manifests: $(STAMP)
	$(BIN)/python scripts/render_manifests.py

chart-docs: $(STAMP)
	$(BIN)/python scripts/chart_readme.py
