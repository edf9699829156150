# Two commands on a fresh machine: `make demo` and `make test` (see README).
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.deps-installed
RAY_STAMP := $(VENV)/.ray-installed
export CARGO_TERM_COLOR ?= never

.PHONY: demo test build lint rust-test py-test memcheck bench bench-replay device-check device-wheels wheel wheel-check test-min clean

$(STAMP): requirements/dev.txt
	python3 -m venv $(VENV)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/dev.txt
	touch $(STAMP)

# Ray, for the device groups' ray backend: its tests and the group benchmark (not the demo).
$(RAY_STAMP): $(STAMP) requirements/ray.txt
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/ray.txt
	touch $(RAY_STAMP)

# The extension, built once in release mode (overflow checks stay on) into target/.
build: $(STAMP)
	$(VENV)/bin/maturin develop --release -q

# Benchmarks run numpy kernels with one BLAS thread: on a small machine, BLAS threads that spin
# between calls take the orchestrating thread's core and show up as jitter in the timed phases.
BENCH_ENV := OPENBLAS_NUM_THREADS=1

# The demo, then the bench on the unrolled paged attention (upstream's Case2: 64 sequences of
# 8K tokens, 512 tasks a round; three residency arms, golden checked, priced on ascend-a3 and
# h200; about 15 s on 2 cores; `simpler bench` alone runs Case1 and Case2).
demo: build
	$(PY) examples/demo.py
	$(BENCH_ENV) $(VENV)/bin/simpler bench paged_attention_unroll --rounds 3 --case Case2
	$(PY) examples/decode/decode.py --mode both --layers 8 --hidden 512 --heads 8 --kv-heads 2 --ffn 1408 --rounds 32

lint: $(STAMP)
	cargo fmt --all -- --check
	cargo clippy --workspace --all-targets -q -- -D warnings
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy

# `cargo build --workspace` first: the driver tests dlopen the fake vendor libraries it builds
# (they would build them themselves otherwise, into a target directory of their own).
rust-test:
	cargo build --workspace -q
	cargo test --workspace -q

# The scene tests (examples) run on sim, on the ascend platform through the fake CANN runtime +
# HAL (small allocations refused and mirrored, large ones mapped, as on 64 KiB-page hosts), and
# on the cuda platform through the fake libcuda (every view a page-locked mirror); then the
# device checks of `make device-check`, from the in-tree build against the fake libcuda.
# The ported upstream scene tests (examples/upstream) run every case on sim, manual ones included
# (the unrolled port's Case1-Case3 too, about a minute); on the fake ascend, their upstream-sized
# cases (Case1: 256 sequences of 8K tokens, hours of host-path kernels over a fake) are left to a
# real card, and on the fake libcuda they are not listed (upstream's platforms); the small cases
# run on all three.
UPSTREAM_PA := examples/upstream/paged_attention/test_upstream_paged_attention
UPSTREAM_PAU := examples/upstream/paged_attention_unroll/test_upstream_paged_attention_unroll
# The unrolled port's Case1 (not manual upstream) runs once, in the upstream run on sim below.
UPSTREAM_PAU_CASE1 := --deselect $(UPSTREAM_PAU)_numpy.py::TestPagedAttentionUnrollManualScopeNumpy::Case1 \
	--deselect $(UPSTREAM_PAU).py::TestPagedAttentionUnrollManualScope::Case1
UPSTREAM_BIG := --deselect $(UPSTREAM_PA)_numpy.py::TestPagedAttentionNumpy::Case1 \
	--deselect $(UPSTREAM_PA).py::TestPagedAttention::Case1 $(UPSTREAM_PAU_CASE1)
FAKE_ASCEND := target/fake-ascend-libs
FAKE_CUDA := target/fake-cuda-libs
py-test: build $(RAY_STAMP)
	cargo build -q -p fake-ascend -p fake-cuda
	mkdir -p $(FAKE_ASCEND) $(FAKE_CUDA)
	for n in libascendcl.so libascend_hal.so libruntime.so; do ln -sf ../debug/libfake_ascend.so $(FAKE_ASCEND)/$$n; done
	ln -sf $(CURDIR)/$$(ls -t target/debug/build/fake-ascend-*/out/libc_sec.so | head -1) $(FAKE_ASCEND)/libc_sec.so
	ln -sf ../debug/libfake_cuda.so $(FAKE_CUDA)/libcuda.so.1
	$(PY) -m mypy.stubtest --ignore-disjoint-bases simpler._core
	$(VENV)/bin/pytest -q -p no:cacheprovider
	$(VENV)/bin/pytest -q -p no:cacheprovider examples --simpler-platform sim --simpler-rounds 3 --simpler-svm never \
		$(UPSTREAM_PAU_CASE1)
	SIMPLER_ASCEND_LIB_DIR=$(CURDIR)/$(FAKE_ASCEND) FAKE_ASCEND_MAP=min:65536 \
		$(VENV)/bin/pytest -q -p no:cacheprovider examples --simpler-platform ascend --simpler-rounds 3 $(UPSTREAM_BIG)
	SIMPLER_CUDA_LIB=$(CURDIR)/$(FAKE_CUDA)/libcuda.so.1 \
		$(VENV)/bin/pytest -q -p no:cacheprovider examples --simpler-platform cuda --simpler-rounds 3
	$(VENV)/bin/pytest -q -p no:cacheprovider examples/upstream --simpler-platform sim --simpler-rounds 3 \
		--simpler-manual include
	.ci/device-check --dry-run

test: lint rust-test py-test

# valgrind memcheck over the Rust test binaries of the runtime and the driver: zero errors
# (.ci/memcheck; suppressed false positives, with reasons, in .ci/valgrind.supp).
memcheck:
	.ci/memcheck

# A portable wheel: manylinux2014 (linked against glibc 2.17 symbols through zig), abi3, stripped.
WHEEL_DIR := target/wheels
wheel: $(STAMP)
	$(VENV)/bin/pip install -q --disable-pip-version-check -r requirements/wheel.txt
	rm -f $(WHEEL_DIR)/*.whl
	PATH=$(CURDIR)/$(VENV)/bin:$$PATH $(VENV)/bin/maturin build --release --zig --compatibility manylinux2014 --strip -o $(WHEEL_DIR)

# The pinned runtime dependencies a device machine may lack (requirements/device.txt: ml-dtypes,
# and pytest with its dependencies, which runs the device checks), as binary wheels for the
# CPython versions and platforms such a machine may run, downloaded with the venv's pip into
# target/wheels/deps; .ci/device-check installs from there (no registry there).
# Copy target/wheels/ along with the wheel of `make wheel`.
DEVICE_REQS := requirements/device.txt
DEVICE_PYTHONS := 3.11 3.12 3.13
# ml-dtypes 0.6.0's x86_64 Linux wheels are tagged manylinux_2_27 and manylinux_2_28.
DEVICE_PLATFORMS := manylinux_2_28_x86_64 manylinux_2_27_x86_64
device-wheels: $(STAMP) $(DEVICE_REQS)
	rm -rf $(WHEEL_DIR)/deps
	for v in $(DEVICE_PYTHONS); do \
		$(VENV)/bin/pip download -q --disable-pip-version-check --only-binary=:all: --no-deps \
			--implementation cp --python-version $$v $(foreach p,$(DEVICE_PLATFORMS),--platform $(p)) \
			-d $(WHEEL_DIR)/deps -r $(DEVICE_REQS) || exit 1; \
	done
	ls $(WHEEL_DIR)/deps

# The wheel installed into a fresh venv outside the repository: tour, plugin, bench, command.
wheel-check: wheel
	.ci/wheel-check

# The Python suite against the oldest supported numpy / ml-dtypes (requirements/min.txt), with
# the wheel installed; needs the fake vendor libraries `make test` builds.
test-min: wheel
	rm -rf target/venv-min
	python3 -m venv target/venv-min
	target/venv-min/bin/pip install -q --disable-pip-version-check -r requirements/min.txt
	target/venv-min/bin/pip install -q --disable-pip-version-check --no-deps $(WHEEL_DIR)/*.whl
	target/venv-min/bin/python -m pytest -q -p no:cacheprovider tests

# On a machine with a GPU (or an Ascend card), without Rust or a package registry: installs the
# wheel built elsewhere (target/wheels/*.whl, or --wheel) with pip --no-deps --target, with the
# dependencies it lacks from target/wheels/deps (make device-wheels), and runs
# `python -m simpler.tools.device_check` from it (its preflight first): named, timed checks
# (pytest tests shipped in the package) of the driver, the shipped paged-attention cases on the
# device (golden checked), the bench's arms, exports read from a torch side stream and the
# launches benchmark, into target/device-check/device_check.jsonl.
# Skips cleanly without a device. `make test` runs it as `.ci/device-check --dry-run`.
device-check:
	.ci/device-check

bench: build $(RAY_STAMP)
	$(BENCH_ENV) $(PY) -m simpler.tools.benchmarks

# Planned against replayed warm rounds on cuda, against the fake libcuda built in release mode
# (`make test` builds it for debugging: its per-call cost would hide the runtime's), unless
# SIMPLER_CUDA_LIB names a driver already.
FAKE_CUDA_RELEASE := target/fake-cuda-release
bench-replay: build
	cargo build -q --release -p fake-cuda
	mkdir -p $(FAKE_CUDA_RELEASE)
	ln -sf ../release/libfake_cuda.so $(FAKE_CUDA_RELEASE)/libcuda.so.1
	SIMPLER_CUDA_LIB=$${SIMPLER_CUDA_LIB:-$(CURDIR)/$(FAKE_CUDA_RELEASE)/libcuda.so.1} \
		$(BENCH_ENV) $(PY) -m simpler.tools.benchmarks replay

clean:
	cargo clean
	rm -rf $(VENV)
