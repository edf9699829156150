# Two commands on a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
export CARGO_TERM_COLOR ?= never

.PHONY: demo test build lint rust-test py-test memcheck bench clean

$(STAMP): requirements/dev.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/dev.txt
	touch $(STAMP)

# The extension, built once in release mode (overflow checks stay on) into target/.
build: $(STAMP)
	$(VENV)/bin/maturin develop --release -q

# Benchmarks run numpy kernels with one BLAS thread: on a small machine, BLAS threads that spin
# between calls take the orchestrating thread's core and show up as jitter in the timed phases.
BENCH_ENV := OPENBLAS_NUM_THREADS=1

# The demo, then the bench on paged attention (B=64, 8K-token contexts; about 20 s on 2 cores).
demo: build
	$(PY) examples/demo.py
	$(BENCH_ENV) $(VENV)/bin/simpler bench paged_attention --rounds 5 --case B64_8K
	$(PY) examples/decode/decode.py --mode both --layers 8 --hidden 512 --heads 8 --kv-heads 2 --ffn 1408 --rounds 32

lint: $(STAMP)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# `cargo build --workspace` first: the driver tests dlopen the fake vendor library it builds.
rust-test:
	cargo build --workspace -q
	cargo test --workspace -q

# The scene tests (examples) run on sim and, through the fake CANN runtime + HAL that
# `cargo build --workspace` produced, on the ascend platform: with small allocations refused
# (mirror) and large ones mapped, as on 64 KiB-page hosts.
FAKE_ASCEND := target/fake-ascend-libs
py-test: build
	cargo build -q -p fake-ascend
	mkdir -p $(FAKE_ASCEND)
	for n in libascendcl.so libascend_hal.so libruntime.so; do ln -sf ../debug/libfake_ascend.so $(FAKE_ASCEND)/$$n; done
	$(PY) -m mypy.stubtest --ignore-disjoint-bases simpler._core
	$(VENV)/bin/pytest -q -p no:cacheprovider
	$(VENV)/bin/pytest -q -p no:cacheprovider examples --platform sim --rounds 3 --svm never
	SIMPLER_ASCEND_LIB_DIR=$(CURDIR)/$(FAKE_ASCEND) FAKE_ASCEND_MAP=min:65536 \
		$(VENV)/bin/pytest -q -p no:cacheprovider examples --platform ascend --rounds 3

test: lint rust-test py-test

# valgrind memcheck over the Rust test binaries of the runtime and the driver: zero errors
# (.ci/memcheck; suppressed false positives, with reasons, in .ci/valgrind.supp).
memcheck:
	.ci/memcheck

bench: build
	$(BENCH_ENV) $(PY) -m simpler.benchmarks

clean:
	cargo clean
	rm -rf $(VENV)
