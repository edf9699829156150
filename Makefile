# Two commands on a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
export CARGO_TERM_COLOR ?= never

.PHONY: demo test build lint rust-test py-test bench memcheck clean

$(STAMP): requirements/dev.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/dev.txt
	touch $(STAMP)

# The extension, built once in release mode (overflow checks stay on) into target/.
build: $(STAMP)
	$(VENV)/bin/maturin develop --release -q

demo: build
	$(PY) examples/demo.py

lint: $(STAMP)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# `cargo build --workspace` first: the driver tests dlopen the fake vendor library it builds.
rust-test:
	cargo build --workspace -q
	cargo test --workspace -q

py-test: build
	$(VENV)/bin/pytest -q -p no:cacheprovider

test: lint rust-test py-test

bench: build
	$(PY) -m simpler.benchmarks

memcheck:
	cargo build --workspace -q
	./scripts/memcheck.sh

clean:
	cargo clean
	rm -rf $(VENV)
