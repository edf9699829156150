"""The device check before its checks: the package and the workloads import without ``ml_dtypes``
(bfloat16 then fails with one clear error), the preflight (``python -m
simpler.tools.device_check --preflight``) prints what the machine offers and stops with one line
and exit status 2 when something required is missing, and the shipped CUDA kernels never trap:
what they cannot run is refused at submit.

The subprocess tests refuse a module with a ``sys.meta_path`` finder installed by a
``sitecustomize`` module on ``PYTHONPATH``, so the interpreter behaves as one without it."""

from __future__ import annotations

import importlib.metadata
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

import simpler as sp
from simpler import _core
from simpler.testing import (
    fake_cuda,
    fake_kernels,  # noqa: F401  (registers the host implementations dispatched here)
)
from simpler.tools import preflight
from simpler.workloads import paged_attention as pa
from simpler.workloads import paged_attention_cuda as pac

ROOT = Path(__file__).resolve().parents[1]
FAKE_CUDA = ROOT / "target" / "fake-cuda-libs" / "libcuda.so.1"

needs_fake_cuda = pytest.mark.skipif(
    not FAKE_CUDA.exists(), reason=f"fake libcuda not linked at {FAKE_CUDA} (run `make test`)"
)

_REFUSE = '''
import sys


class _Refuse:
    """Refuses to find {names}: this interpreter behaves as one without them."""

    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {names!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (refused by the test)", name=name)
        return None


sys.meta_path.insert(0, _Refuse())
'''


def _env(tmp_path: Path, refuse: tuple[str, ...] = (), **extra: str) -> dict[str, str]:
    """The environment of a subprocess that cannot import ``refuse`` (a sitecustomize module in
    ``tmp_path`` installs the finder), with ``extra`` set and no NVRTC override."""
    env = {k: v for k, v in os.environ.items() if k not in ("SIMPLER_NVRTC_LIB", "SIMPLER_CUDA_LIB")}
    if refuse:
        site = tmp_path / "site_refuse"
        site.mkdir(exist_ok=True)
        (site / "sitecustomize.py").write_text(_REFUSE.format(names=set(refuse)))
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH")]))
    env.update(extra)
    return env


def _run(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def _device_check(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return _run(["-m", "simpler.tools.device_check", *args], env, cwd)


def _preflight_lines(stdout: str) -> dict[str, str]:
    """``preflight: <what>: <found>`` lines as {what: found}, in order."""
    out = {}
    for line in stdout.splitlines():
        if line.startswith("preflight: "):
            what, _, found = line.removeprefix("preflight: ").partition(": ")
            out[what] = found
    return out


# -- 1. ml_dtypes is optional at import ---------------------------------------------------------------


def test_the_package_the_device_check_and_the_workloads_import_without_ml_dtypes(tmp_path):
    """Without ml_dtypes: ``import simpler``, the device check and both paged-attention modules
    import (and do not import ml_dtypes); asking for bfloat16 (``np_dtype``, the workload's
    ``BF16``, its fixtures) is one ``ModuleNotFoundError`` naming the dtype and the fix."""
    script = textwrap.dedent(
        """
        import sys
        import simpler
        import simpler.tools.device_check
        import simpler.workloads.paged_attention as pa
        import simpler.workloads.paged_attention_cuda as pac
        assert "ml_dtypes" not in sys.modules
        assert simpler.np_dtype("float32").name == "float32"
        for what, fn in [
            ("np_dtype", lambda: simpler.np_dtype("bfloat16")),
            ("pa.BF16", lambda: pa.BF16),
            ("pac.BF16", lambda: pac.BF16),
            ("make_inputs", lambda: pa.make_inputs(pa._BASES[0][1])),
            ("float8", lambda: simpler.np_dtype("float8_e4m3fn")),
        ]:
            try:
                fn()
            except ModuleNotFoundError as e:
                print(what, "|", e.name, "|", e)
            else:
                raise AssertionError(f"{what}: no error without ml_dtypes")
        """
    )
    out = _run(["-c", script], _env(tmp_path, ("ml_dtypes",)), tmp_path)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert [line.split(" | ")[0] for line in lines] == [
        "np_dtype",
        "pa.BF16",
        "pac.BF16",
        "make_inputs",
        "float8",
    ]
    for line in lines:
        what, name, message = line.split(" | ")
        dtype = "float8_e4m3fn" if what == "float8" else "bfloat16"
        assert name == "ml_dtypes"
        assert message.startswith(
            f"the dtype {dtype} needs the ml_dtypes package: install it with pip install ml-dtypes"
        )


def test_with_ml_dtypes_the_lazy_constants_are_its_types():
    import ml_dtypes

    assert pa.BF16 is ml_dtypes.bfloat16 and pac.BF16 is ml_dtypes.bfloat16
    assert sp.np_dtype("bfloat16") == np.dtype(ml_dtypes.bfloat16)
    with pytest.raises(AttributeError, match="has no attribute 'NOPE'"):
        _ = pa.NOPE


# -- 3. the preflight ----------------------------------------------------------------------------------


@needs_fake_cuda
def test_the_preflight_on_the_fake_libcuda_prints_the_lines_a_card_would(tmp_path):
    out = _device_check(["--preflight"], _env(tmp_path, SIMPLER_CUDA_LIB=str(FAKE_CUDA)), tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Traceback" not in out.stderr, out.stderr
    lines = _preflight_lines(out.stdout)
    expected = [
        "python",
        "simpler",
        *preflight.PACKAGES,
        *preflight.NVRTC_WHEELS,
        "driver",
        "device 0",
        "nvrtc",
    ]
    assert list(lines)[: len(expected)] == expected, out.stdout
    assert set(list(lines)[len(expected) :]) <= {"nvrtc candidate"}
    assert lines["python"].startswith(f"{sys.executable} (CPython {sys.version.split()[0]}")
    assert lines["numpy"] == np.__version__
    assert str(FAKE_CUDA.resolve()) in lines["driver"] and "(the fake libcuda)" in lines["driver"]
    assert "cuDriverGetVersion 13000 (CUDA 13.0)" in lines["driver"]
    device = lines["device 0"]
    for part in (
        "name Fake CUDA device (H200-like)",
        "compute capability 9.0",
        "SMs 132",
        "memory 140.4 GiB (150754820096 bytes)",
        "clock 1980 MHz",
        "memory clock 2619 MHz",
    ):
        assert part in device, device
    if not hasattr(_core, "nvrtc_info"):
        assert lines["nvrtc"] == "not available (this build of simpler._core has no nvrtc_info)"
    else:  # the fake's own NVRTC: the preflight sets the fake up first, as the checks get it
        assert lines["nvrtc"].split(" (version ")[0] in (str(FAKE_CUDA), str(FAKE_CUDA.resolve())), lines[
            "nvrtc"
        ]
        assert "target sm_90" in lines["nvrtc"]


@needs_fake_cuda
def test_a_run_records_the_preflight_in_its_run_line(tmp_path):
    env = _env(tmp_path, SIMPLER_CUDA_LIB=str(FAKE_CUDA), OPENBLAS_NUM_THREADS="1")
    out = _device_check(["--quick", "--only", "driver.open", "--out", str(tmp_path / "o")], env, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    # The preflight comes first, before any check.
    assert out.stdout.index("preflight: python: ") < out.stdout.index("== device-check: driver.open ==")
    recs = [json.loads(line) for line in (tmp_path / "o" / "device_check.jsonl").read_text().splitlines()]
    run = recs[0]
    assert run["kind"] == "run"
    facts = run["preflight"]
    assert facts["python"]["executable"] == sys.executable
    assert facts["packages"]["numpy"] == {"found": True, "version": np.__version__, "dist": "numpy"}
    assert facts["driver"]["version"] == 13000 and facts["driver"]["fake"] is True
    assert facts["driver"]["library"] == str(FAKE_CUDA.resolve())
    dev = facts["device"]
    assert (dev["name"], dev["capability"], dev["sm_count"]) == ("Fake CUDA device (H200-like)", [9, 0], 132)
    assert (dev["memory_bytes"], dev["clock_khz"], dev["memory_clock_khz"]) == (
        150754820096,
        1980000,
        2619000,
    )
    assert not dev["unreadable"]
    assert facts["missing"] == {}
    assert next(r["name"] for r in recs if r["kind"] == "check") == "driver.open"


@needs_fake_cuda
def test_without_ml_dtypes_the_bfloat16_checks_skip_and_the_others_run(tmp_path):
    env = _env(tmp_path, ("ml_dtypes",), SIMPLER_CUDA_LIB=str(FAKE_CUDA), OPENBLAS_NUM_THREADS="1")
    args = ["--quick", "--only", "paged_attention.Small1", "--only", "bench", "--out", str(tmp_path / "o")]
    out = _device_check(args, env, tmp_path)
    assert out.returncode == 0, out.stdout + out.stderr
    assert _preflight_lines(out.stdout)["ml_dtypes"].startswith("missing (not fatal")
    recs = [json.loads(line) for line in (tmp_path / "o" / "device_check.jsonl").read_text().splitlines()]
    assert "ml_dtypes" in recs[0]["preflight"]["missing"]
    checks = {r["name"]: r for r in recs if r["kind"] == "check"}
    assert checks["driver.open"]["status"] == "passed"
    skipped = [n for n in checks if n.startswith(("paged_attention.", "bench."))]
    assert len(skipped) == 8, list(checks)  # Small1 in three arms, four benches and the replay
    for name in skipped:
        assert checks[name]["status"] == "skipped", checks[name]
        assert "pip install ml-dtypes" in checks[name]["skip_reason"]
        assert "make device-wheels" in checks[name]["skip_reason"]


def test_a_missing_driver_library_is_one_line_and_exit_status_2(tmp_path):
    missing = tmp_path / "nowhere" / "libcuda.so.1"
    out = _device_check(["--preflight"], _env(tmp_path, SIMPLER_CUDA_LIB=str(missing)), tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    err = out.stderr.strip().splitlines()
    assert len(err) == 1, out.stderr
    assert err[0].startswith("device-check: preflight: no CUDA driver library: SIMPLER_CUDA_LIB=")
    assert str(missing) in err[0] and "point SIMPLER_CUDA_LIB at" in err[0]
    assert "driver" not in _preflight_lines(out.stdout)  # it stopped there
    # A normal run stops the same way, before any check or output file.
    out = _device_check(
        ["--out", str(tmp_path / "o")], _env(tmp_path, SIMPLER_CUDA_LIB=str(missing)), tmp_path
    )
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert not (tmp_path / "o").exists()


def test_pytest_missing_stops_the_device_check_with_one_line(tmp_path):
    """The checks are pytest tests: without pytest the preflight says so (and how to carry it)
    in one line, exit status 2, before any check or output file."""
    out = _device_check(["--out", str(tmp_path / "o")], _env(tmp_path, ("pytest",)), tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert _preflight_lines(out.stdout)["pytest"].startswith("missing; pip install pytest")
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("device-check: preflight: pytest is missing for ")
    assert "make device-wheels" in line
    assert not (tmp_path / "o").exists()


def test_numpy_missing_stops_the_device_check_with_one_line(tmp_path):
    env = _env(tmp_path, ("numpy",))
    out = _device_check(["--preflight"], env, tmp_path)
    assert out.returncode == 2, out.stdout + out.stderr
    assert out.stdout == ""
    [line] = out.stderr.strip().splitlines()
    assert line.startswith("device-check: preflight: simpler needs numpy (>= 1.26)")
    assert "pip install 'numpy>=1.26'" in line
    # Elsewhere it is an ImportError that says the same (never an exit from a library import).
    out = _run(["-c", "import simpler"], env, tmp_path)
    assert out.returncode == 1 and "ImportError: simpler needs numpy (>= 1.26)" in out.stderr


def test_the_device_check_imports_nothing_that_could_fail_before_its_preflight(tmp_path):
    """Importing the device check loads neither the workloads nor the bench, the benchmarks or
    the reports (the checks import them when they run, after the preflight)."""
    script = textwrap.dedent(
        """
        import sys
        import simpler.tools.device_check
        late = ("simpler.workloads.paged_attention", "simpler.tools.bench", "simpler.tools.benchmarks",
                "simpler.tools.report", "ml_dtypes", "torch")
        print(sorted(m for m in late if m in sys.modules))
        """
    )
    out = _run(["-c", script], _env(tmp_path), tmp_path)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def _nvrtc_lines(monkeypatch, info) -> dict[str, list[str]]:
    if info is None:
        monkeypatch.delattr(_core, "nvrtc_info", raising=False)
    else:
        monkeypatch.setattr(_core, "nvrtc_info", info, raising=False)
    got: dict[str, list[str]] = {}
    preflight._nvrtc_lines(
        preflight.nvrtc_choice((12, 8), (9, 0)), lambda k, v: got.setdefault(k, []).append(v)
    )
    return got


def test_the_nvrtc_choice_is_printed_with_its_candidates(monkeypatch):
    seen = []

    def info(driver=None, capability=None):
        seen.append((driver, capability))
        return {
            "path": "/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
            "version": (12, 8),
            "target": "sm_90",
            "target_kind": "cubin",
            "candidates": [
                {
                    "path": "/x/nvidia/cu13/lib/libnvrtc.so.13",
                    "version": (13, 0),
                    "usable": False,
                    "why": "makes code for CUDA 13 drivers, and this driver is CUDA 12.8",
                },
                {
                    "path": "/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12",
                    "version": (12, 8),
                    "usable": True,
                    "why": None,
                },
            ],
        }

    got = _nvrtc_lines(monkeypatch, info)
    assert seen == [((12, 8), (9, 0))]
    assert got["nvrtc"] == ["/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (version 12.8), target sm_90 (cubin)"]
    assert got["nvrtc candidate"] == [
        "/x/nvidia/cu13/lib/libnvrtc.so.13 (version 13.0), not usable: makes code for CUDA 13 drivers, "
        "and this driver is CUDA 12.8",
        "/x/nvidia/cuda_nvrtc/lib/libnvrtc.so.12 (version 12.8), usable",
    ]

    def none_fits(driver=None, capability=None):
        raise sp.CompileError("no NVRTC fits this driver\ntried: /a, /b")

    assert _nvrtc_lines(monkeypatch, none_fits) == {
        "nvrtc": ["none usable: CompileError: no NVRTC fits this driver"]
    }
    assert _nvrtc_lines(monkeypatch, None) == {
        "nvrtc": ["not available (this build of simpler._core has no nvrtc_info)"]
    }


def test_the_driver_version_reads_as_major_minor():
    assert preflight.driver_version_tuple(12080) == (12, 8)
    assert preflight.driver_version_tuple(13000) == (13, 0)
    assert preflight.driver_version_tuple(None) is None


# -- 4. kernels that never trap ------------------------------------------------------------------------


def test_the_shipped_cuda_source_never_traps():
    """A trap is a sticky fault that breaks every library sharing the CUDA context."""
    assert "__trap" not in pac.SOURCE
    assert "asm" not in pac.SOURCE  # no hand-written trap or brkpt either


def test_a_geometry_the_kernel_cannot_run_is_refused_at_submit_and_the_worker_stays_usable(fake_vendor):
    failures = len(fake_cuda.FAILURES)
    with fake_vendor.worker("cuda", poison=False) as w:
        bf16 = sp.np_dtype("bfloat16")
        heads, dim, bs = 2, pac.MAX_HEAD_DIM * 2, 8
        q = np.zeros((1, heads, dim), bf16)
        k = np.zeros((1, bs, 1, dim), bf16)
        scores = np.full((1, heads, bs), 7.0, np.float32)
        call = sp.Callable(lambda o, q, k, s: o.submit(pa.QK, q, k, s, 1.0, bs), [sp.IN, sp.IN, sp.OUT])
        with pytest.raises(
            sp.ArgumentError,
            match=r"pa_qk: head dimension D = 512 is past the kernel's "
            r"limit MAX_HEAD_DIM = 256",
        ):
            w.run(call, [q, k, scores])
        # The worker (and its context) works: paged attention, every task on the device.
        params = dict(pa._BASES[0][1], arm="Residency_all")
        x = pa.make_inputs(params)
        names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
        golden = pa.golden_paged_attention(*(x[n] for n in names), x["scale"])
        out = np.zeros_like(x["out"])
        r = w.run(pa.CALLABLE, [*(x[n] for n in names), out, x["scale"]])
        np.testing.assert_allclose(out, golden, rtol=1e-3, atol=1e-3)
        assert r.counters["host_path_tasks"] == 0 and r.counters["device_tasks"] == r.counters["tasks"]
    assert len(fake_cuda.FAILURES) == failures


def test_the_launch_functions_refuse_grids_past_the_device_limits():
    dim = (pac.MAX_GRID_Y + 1) * pac.DIM_THREADS
    with pytest.raises(sp.ArgumentError, match=r"pa_pv: grid \(1, 65536, 1\) is past the device's limits"):
        pac.pv_launch((1, 4, 16), (1, 16, 1, dim), (1, 4, dim))
    assert pac.pv_launch((1, 4, 16), (1, 16, 1, 128), (1, 4, 128))["grid"] == (1, 1, 1)


def _f64(x: float) -> int:
    return int(np.array([x], np.float64).view(np.uint64)[0])


@pytest.mark.parametrize(
    ("dim", "block"),
    [(pac.MAX_HEAD_DIM * 2, (pac.WARP, pac.WARPS, 1)), (16, (64, 2, 1))],
    ids=["D_past_max", "not_a_warp"],
)
def test_the_fakes_qk_returns_where_the_device_code_returns(dim, block):
    """The fake mimics the device code's early return: nothing written, no failure."""
    mem = fake_cuda.HostMemory()
    bf16 = sp.np_dtype("bfloat16")
    heads, bs = 2, 8
    q = np.ones((heads, dim), bf16)
    k = np.ones((bs, dim), bf16)
    scores = np.full((heads, bs), 7.0, np.float32)
    row = np.array([[mem.add(q), mem.add(k), mem.add(scores), _f64(1.0), bs, heads, dim, bs]], np.uint64)
    launch = mem.launch("pa_qk", [mem.add(row)], (2, 1, 1), block)
    assert fake_cuda.dispatch(launch) == fake_cuda.CUDA_SUCCESS
    assert np.all(scores == 7.0)
    # The geometry the launch function makes writes every score.
    ok = np.array(
        [
            [
                mem.add(q[:, :16].copy()),
                mem.add(k[:, :16].copy()),
                mem.add(scores),
                _f64(1.0),
                bs,
                heads,
                16,
                bs,
            ]
        ],
        np.uint64,
    )
    assert fake_cuda.dispatch(mem.launch("pa_qk", [mem.add(ok)], (2, 1, 1), (32, 4, 1))) == 0
    assert np.all(scores == 16.0)


def test_the_fakes_softmax_and_online_update_return_where_the_device_code_returns():
    mem = fake_cuda.HostMemory()
    heads, bs, dim = 2, 8, 16
    scores = np.zeros((heads, bs), np.float32)
    probs = np.zeros((heads, bs), sp.np_dtype("bfloat16"))
    stats = np.full((2, heads), 5.0, np.float32)
    row = np.array([[mem.add(scores), mem.add(probs), mem.add(stats), bs, heads, bs]], np.uint64)
    launch = mem.launch("pa_block_softmax", [mem.add(row)], (1, 1, 1), (16, 4, 1))
    assert fake_cuda.dispatch(launch) == fake_cuda.CUDA_SUCCESS
    assert np.all(stats == 5.0)
    block_out = np.ones((heads, dim), np.float32)
    m, s = np.full(heads, 3.0, np.float32), np.full(heads, 3.0, np.float32)
    acc = np.full((heads, dim), 3.0, np.float32)
    row = np.array(
        [[mem.add(stats), mem.add(block_out), mem.add(m), mem.add(s), mem.add(acc), 1, heads, dim]], np.uint64
    )
    launch = mem.launch("pa_online_update", [mem.add(row)], (heads, 2, 1), (32, 1, 1))
    assert fake_cuda.dispatch(launch) == fake_cuda.CUDA_SUCCESS
    assert np.all(m == 3.0) and np.all(s == 3.0) and np.all(acc == 3.0)


# -- 2. the carried dependencies ---------------------------------------------------------------------


def _wheel(path: Path, files: dict[str, bytes], tag: str) -> Path:
    """A wheel at ``path`` holding ``files`` and a dist-info with a valid RECORD."""
    import base64
    import hashlib
    import zipfile

    name, version = path.name.split("-")[:2]
    info = f"{name}-{version}.dist-info"
    files = dict(files)
    files[f"{info}/METADATA"] = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode()
    files[f"{info}/WHEEL"] = (
        f"Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: false\nTag: {tag}\n".encode()
    )
    record = [
        f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v).digest()).rstrip(b'=').decode()},{len(v)}"
        for k, v in files.items()
    ]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    with zipfile.ZipFile(path, "w") as z:
        for k, v in files.items():
            z.writestr(k, v)
    return path


def _pins(path: Path) -> dict[str, str]:
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    pins = {}
    for line in path.read_text().splitlines():
        line = line.split("#")[0].strip()
        if line:
            req = Requirement(line)
            pins[canonicalize_name(req.name)] = str(req.specifier).removeprefix("==")
    return pins


def test_the_carried_wheels_hold_the_dev_pytest_and_what_it_needs():
    """``make device-wheels`` downloads requirements/device.txt without dependencies: it pins the
    pytest of requirements/dev.txt and every distribution that pytest needs on the device
    machine's CPython versions on Linux, each at a version pytest accepts."""
    from packaging.requirements import Requirement
    from packaging.utils import canonicalize_name

    device = _pins(ROOT / "requirements" / "device.txt")
    assert device["pytest"] == _pins(ROOT / "requirements" / "dev.txt")["pytest"]
    if importlib.metadata.version("pytest") != device["pytest"]:
        pytest.skip("this interpreter's pytest is not the pinned one: its requirements may differ")
    for text in importlib.metadata.requires("pytest") or []:
        req = Requirement(text)
        envs = [{"python_version": v, "sys_platform": "linux", "extra": ""} for v in ("3.11", "3.12", "3.13")]
        if req.marker is not None and not any(req.marker.evaluate(env) for env in envs):
            continue
        name = canonicalize_name(req.name)
        assert name in device, f"pytest needs {req} and requirements/device.txt does not carry it"
        assert req.specifier.contains(device[name]), f"{name}=={device[name]} does not satisfy {req}"


@needs_fake_cuda
def test_the_device_check_script_installs_the_carried_wheels_it_can_take_and_lacks(tmp_path):
    """``.ci/device-check`` installs our wheel, then every wheel of ``deps/`` beside it that the
    interpreter takes and cannot import (here a probe module), says in one line what it installed
    and what was present (ml_dtypes, in this venv), skips a wheel for another CPython quietly,
    and runs the device check from there."""
    src = ROOT / "python" / "simpler"
    ours = {
        f"simpler/{p.relative_to(src)}": p.read_bytes()
        for p in src.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }
    wheels = tmp_path / "wheels"
    (wheels / "deps").mkdir(parents=True)
    wheel = _wheel(
        wheels / "simpler_residency-0.1.0-cp311-abi3-manylinux2014_x86_64.whl",
        ours,
        "cp311-abi3-manylinux2014_x86_64",
    )
    probe = {"simpler_devcheck_probe.py": b"WHERE = __file__\n"}
    _wheel(wheels / "deps" / "simpler_devcheck_probe-1.0-py3-none-any.whl", probe, "py3-none-any")
    _wheel(
        wheels / "deps" / "other_cpython-1.0-cp399-cp399-manylinux_2_17_x86_64.whl",
        probe,
        "cp399-cp399-manylinux_2_17_x86_64",
    )
    _wheel(wheels / "deps" / "ml_dtypes-0.6.0-py3-none-any.whl", {}, "py3-none-any")  # imports already
    env = _env(tmp_path, SIMPLER_CUDA_LIB=str(FAKE_CUDA), OPENBLAS_NUM_THREADS="1")
    out = subprocess.run(
        [
            str(ROOT / ".ci" / "device-check"),
            "--python",
            sys.executable,
            "--wheel",
            str(wheel),
            "--quick",
            "--only",
            "driver.open",  # installing is what this test checks, not the checks
            "--out",
            str(tmp_path / "o"),
        ],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    [line] = [x for x in out.stdout.splitlines() if x.startswith("device-check: dependencies")]
    assert line == (
        f"device-check: dependencies from {wheels / 'deps'}: installed simpler_devcheck_probe 1.0; "
        f"already present ml_dtypes {importlib.metadata.version('ml-dtypes')}"
    )
    assert "other_cpython" not in out.stdout + out.stderr
    recs = [json.loads(x) for x in (tmp_path / "o" / "device_check.jsonl").read_text().splitlines()]
    assert recs[0]["preflight"]["simpler"]["path"].startswith("/tmp/simpler-device-check.")
    assert recs[-1]["kind"] == "summary" and recs[-1]["failed"] == 0
