"""Scene tests: the residency table of docs/scene_tests.md (setup, between rounds, validation)
counted exactly, golden evolution, cleanup on every failure path, and the pytest plugin / standalone runner.

Scene classes here are built by factories (not module-level names), so the plugin does not
collect them as cases of this file.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

import simpler as sp
from simpler.errors import ArgumentError, ArgumentTypeError, DeviceError
from simpler.testing import runner

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
N = 64
COUNTED = ("allocs", "frees", "h2d_calls", "d2h_calls")


def _delta(before, after):
    return {k: after[k] - before[k] for k in COUNTED}


@pytest.fixture
def w():
    """A worker without the staging arena, so every allocation is the case's own."""
    with sp.Worker("sim", staging="fresh") as worker:
        yield worker
        assert worker.stats()["live_allocations"] == 0


def _noop(*_):
    pass


def make_single(direction, resident):
    """A case over one tensor of ``direction``: IN is read, OUT is set to 7, INOUT gets +1."""

    def body(t):
        if direction is sp.OUT:
            t[...] = 7
        elif direction is sp.INOUT:
            t += 1

    k = sp.Kernel(body, [direction])

    @sp.scene_test(level=2)
    class Single(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, t: o.submit(k, t), [direction])
        CASES = [{"name": "one"}]

        def generate_args(self, params):
            return sp.TaskArgsBuilder(sp.TensorArg("t", np.zeros(N, dtype=np.float32), child_memory=resident))

        def compute_golden(self, args, params):
            if direction is sp.OUT:
                args.t[...] = 7
            elif direction is sp.INOUT:
                args.t += 1

    return Single


# -- the residency table, counted exactly over 3 rounds ----------------------------------------


@pytest.mark.parametrize(
    ("direction", "expected"),
    [
        # resident IN: allocate + upload once, no readback
        (sp.IN, {"allocs": 1, "frees": 1, "h2d_calls": 1, "d2h_calls": 0}),
        # resident OUT: allocate, no upload, one final readback
        (sp.OUT, {"allocs": 1, "frees": 1, "h2d_calls": 0, "d2h_calls": 1}),
        # resident INOUT: allocate + upload once, one final readback
        (sp.INOUT, {"allocs": 1, "frees": 1, "h2d_calls": 1, "d2h_calls": 1}),
    ],
    ids=["IN", "OUT", "INOUT"],
)
def test_resident_traffic_is_per_case(w, direction, expected):
    cls = make_single(direction, resident=True)
    s0 = w.stats()
    reports = cls.run_case("one", rounds=3, worker=w)
    assert len(reports) == 3
    assert _delta(s0, w.stats()) == expected
    for r in reports:
        c = r.counters
        assert (c["resident_tensors"], c["staged_tensors"], c["device_mallocs"], c["device_frees"]) == (
            1,
            0,
            0,
            0,
        )
        assert c["staged_bytes"] == 0 and c["copied_back_bytes"] == 0


@pytest.mark.parametrize(
    ("direction", "per_round"),
    [
        (sp.IN, {"allocs": 1, "frees": 1, "h2d_calls": 1, "d2h_calls": 0}),
        (sp.OUT, {"allocs": 1, "frees": 1, "h2d_calls": 0, "d2h_calls": 1}),
        (sp.INOUT, {"allocs": 1, "frees": 1, "h2d_calls": 1, "d2h_calls": 1}),
    ],
    ids=["IN", "OUT", "INOUT"],
)
def test_staged_traffic_is_per_round(w, direction, per_round):
    cls = make_single(direction, resident=False)
    s0 = w.stats()
    reports = cls.run_case("one", rounds=3, worker=w)
    assert _delta(s0, w.stats()) == {k: 3 * v for k, v in per_round.items()}
    for r in reports:
        assert r.counters["staged_tensors"] == 1 and r.counters["resident_tensors"] == 0
        assert r.counters["device_mallocs"] == 1 and r.counters["device_frees"] == 1


def test_staged_traffic_with_the_arena_is_per_round_copies_only():
    cls = make_single(sp.INOUT, resident=False)
    with sp.Worker("sim") as w:
        s0 = w.stats()
        cls.run_case("one", rounds=3, worker=w)
        d = _delta(s0, w.stats())
    assert d["h2d_calls"] == 3 and d["d2h_calls"] == 3 and d["allocs"] <= 1 and d["frees"] == 0


def test_rounds_never_change_the_memory_policy(w):
    for direction in (sp.IN, sp.OUT, sp.INOUT):
        for resident in (False, True):
            cls = make_single(direction, resident)
            one = cls.run_case("one", rounds=1, worker=w)[0].counters
            three = cls.run_case("one", rounds=3, worker=w)
            for r in three:
                for key in ("resident_tensors", "staged_tensors", "staged_bytes", "copied_back_bytes"):
                    assert r.counters[key] == one[key], (direction, resident, key)


def test_skip_golden_means_no_readback_and_no_golden(w):
    cls = make_single(sp.INOUT, resident=True)

    class NoGolden(cls):
        def compute_golden(self, args, params):
            raise AssertionError("compute_golden must not run with skip_golden")

    s0 = w.stats()
    NoGolden.run_case("one", rounds=3, skip_golden=True, worker=w)
    assert _delta(s0, w.stats()) == {"allocs": 1, "frees": 1, "h2d_calls": 1, "d2h_calls": 0}


# -- golden evolution ------------------------------------------------------------------------


def make_accumulator(resident, factor=1.0, staged_out=False, golden_once=False):
    """``acc += x`` (INOUT) and optionally ``out = 2 * acc`` (staged OUT)."""

    def axpy(x, acc, out, s):
        acc += factor * s * x
        out[...] = 2 * acc

    k = sp.Kernel(axpy, [sp.IN, sp.INOUT, sp.OUT])

    @sp.scene_test(level=2)
    class Acc(sp.SceneTestCase):
        CALLABLE = sp.Callable(
            lambda o, x, acc, out, s: o.submit(k, x, acc, out, s), [sp.IN, sp.INOUT, sp.OUT]
        )
        CASES = [{"name": "acc", "params": {"s": 0.5}}]
        calls = 0

        def generate_args(self, params):
            return sp.TaskArgsBuilder(
                sp.TensorArg("x", np.arange(N, dtype=np.float32), child_memory=resident),
                sp.TensorArg("acc", np.ones(N, dtype=np.float32), child_memory=resident),
                sp.TensorArg("out", np.zeros(N, dtype=np.float32), child_memory=resident and not staged_out),
                sp.Scalar("s", params["s"]),
            )

        def compute_golden(self, args, params):
            type(self).calls += 1
            args.acc[...] += args.s * args.x
            args.out[...] = 2 * args.acc

    return Acc


@pytest.mark.parametrize("rounds", [1, 3])
def test_resident_accumulator_passes_at_any_rounds(w, rounds):
    cls = make_accumulator(resident=True)
    cls.run_case("acc", rounds=rounds, worker=w)
    assert cls.calls == rounds, "compute_golden runs once per round when outputs are resident"


@pytest.mark.parametrize("rounds", [1, 3])
def test_resident_accumulator_with_a_wrong_kernel_fails(w, rounds):
    cls = make_accumulator(resident=True, factor=2.0)
    with pytest.raises(AssertionError, match="output 'acc'") as ei:
        cls.run_case("acc", rounds=rounds, worker=w)
    assert any("Acc::acc" in n and f"after {rounds} round" in n for n in ei.value.__notes__)


def test_resident_state_mixed_with_staged_output_compares_the_last_round(w):
    cls = make_accumulator(resident=True, staged_out=True)
    s0 = w.stats()
    cls.run_case("acc", rounds=3, worker=w)
    d = _delta(s0, w.stats())
    # x and acc: 2 allocs + 2 uploads once; out: staged OUT, 1 alloc + 1 readback per round;
    # final readback of acc
    assert d == {"allocs": 2 + 3, "frees": 2 + 3, "h2d_calls": 2, "d2h_calls": 3 + 1}
    assert cls.calls == 3


def test_staged_accumulator_passes_at_rounds_3_because_outputs_are_restored(w):
    cls = make_accumulator(resident=False)
    cls.run_case("acc", rounds=3, worker=w)
    assert cls.calls == 1, "without resident outputs the golden is computed once"
    with pytest.raises(AssertionError, match="round 1/3"):
        make_accumulator(resident=False, factor=3.0).run_case("acc", rounds=3, worker=w)


def test_staged_outputs_are_restored_before_every_round_after_the_first(w):
    seen = []

    def body(acc):
        seen.append(acc.copy())
        acc += 1

    k = sp.Kernel(body, [sp.INOUT])

    @sp.scene_test(level=2)
    class Restore(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, acc: o.submit(k, acc), [sp.INOUT])
        CASES = [{"name": "r"}]

        def generate_args(self, params):
            return sp.TaskArgsBuilder(sp.TensorArg("acc", np.full(4, 5, dtype=np.int32)))

        def compute_golden(self, args, params):
            args.acc += 1

    Restore.run_case("r", rounds=3, worker=w)
    assert [int(a[0]) for a in seen] == [5, 5, 5]


def test_default_compare_checks_outputs_only_and_bfloat16_as_float32(w):
    def add(a, out):
        out[...] = a + a

    k = sp.Kernel(add, [sp.IN, sp.OUT])

    @sp.scene_test(level=2)
    class Bf16(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, a, out: o.submit(k, a, out), [sp.IN, sp.OUT])
        CASES = [{"name": "b", "params": {"resident": False}}, {"name": "r", "params": {"resident": True}}]
        RTOL = 1e-2
        ATOL = 1e-2

        def generate_args(self, params):
            a = np.linspace(-1, 1, N).astype(ml_dtypes.bfloat16)
            r = params["resident"]
            return sp.TaskArgsBuilder(
                sp.TensorArg("a", a, child_memory=r),
                sp.TensorArg("out", np.zeros(N, dtype=ml_dtypes.bfloat16), child_memory=r),
            )

        def compute_golden(self, args, params):
            args.out[...] = (args.a.astype(np.float32) * 2).astype(ml_dtypes.bfloat16)
            if not params["resident"]:  # (an evolving golden must keep its inputs)
                args.a[...] = 42  # an IN tensor of the golden is never compared

    assert Bf16().output_names(Bf16().generate_args({"resident": False})) == ["out"]
    Bf16.run_case("b", rounds=2, worker=w)
    Bf16.run_case("r", rounds=2, worker=w)


# -- cleanup on every failure path -----------------------------------------------------------


def make_three_resident(**overrides):
    """Three resident tensors (IN, IN, OUT) with hooks to fail at each step."""

    def add(a, b, out):
        add.calls += 1
        if overrides.get("fail_round") == add.calls:
            raise RuntimeError(f"kernel failed in round {add.calls}")
        out[...] = a + b

    add.calls = 0
    k = sp.Kernel(add, [sp.IN, sp.IN, sp.OUT])

    @sp.scene_test(level=2)
    class Three(sp.SceneTestCase):
        CALLABLE = sp.Callable(lambda o, a, b, out: o.submit(k, a, b, out), [sp.IN, sp.IN, sp.OUT])
        CASES = [{"name": "three"}]

        def generate_args(self, params):
            if overrides.get("fail_generate"):
                raise ValueError("generate_args failed")
            return sp.TaskArgsBuilder(
                sp.TensorArg("a", np.ones(N, dtype=np.float32), child_memory=True),
                sp.TensorArg("b", np.ones(N, dtype=np.float32), child_memory=True),
                sp.TensorArg("out", np.zeros(N, dtype=np.float32), child_memory=True),
            )

        def compute_golden(self, args, params):
            if overrides.get("fail_golden"):
                raise ZeroDivisionError("compute_golden failed")
            args.out[...] = args.a + args.b

        def compare_outputs(self, actual, golden, params):
            if overrides.get("fail_compare"):
                raise AssertionError("compare_outputs failed")
            super().compare_outputs(actual, golden, params)

    return Three


@pytest.mark.parametrize(
    ("overrides", "fault", "exc", "match"),
    [
        ({"fail_generate": True}, None, ValueError, "generate_args failed"),
        ({}, ("alloc", 2), DeviceError, "alloc|malloc"),
        ({}, ("h2d", 2), DeviceError, "h2d"),
        ({"fail_round": 2}, None, RuntimeError, "round 2"),
        ({"fail_golden": True}, None, ZeroDivisionError, "compute_golden failed"),
        ({"fail_compare": True}, None, AssertionError, "compare_outputs failed"),
        ({}, ("d2h", 1), DeviceError, "d2h"),
    ],
    ids=["generate_args", "setup-alloc-2", "setup-h2d-2", "round", "golden", "compare", "final-readback"],
)
def test_every_failure_leaves_no_live_allocation(w, overrides, fault, exc, match):
    cls = make_three_resident(**overrides)
    s0 = w.stats()
    if fault:
        w.inject_fault(*fault)
    with pytest.raises(exc, match=match) as ei:
        cls.run_case("three", rounds=3, worker=w)
    assert any("Three::three" in n for n in getattr(ei.value, "__notes__", [])), "the error names the case"
    s1 = w.stats()
    assert s1["live_allocations"] == 0
    assert s1["allocs"] - s0["allocs"] == s1["frees"] - s0["frees"]


def test_a_failure_in_release_surfaces_when_the_case_passed():
    cls = make_three_resident()
    w = sp.Worker("sim", staging="fresh")
    orig = sp.ResidentTaskArgs.release

    def failing_release(self):
        w.inject_fault("free", 1)
        orig(self)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sp.ResidentTaskArgs, "release", failing_release)
        with pytest.raises(DeviceError, match="free"):
            cls.run_case("three", worker=w)
    # the buffer whose free failed stays with the driver; close() reclaims it
    assert w.stats()["live_allocations"] == 1
    w.close()


def test_own_worker_is_closed_and_options_are_passed():
    cls = make_single(sp.IN, resident=True)
    reports = cls.run_case(
        "one", platform="sim", rounds=2, worker_options={"staging": "fresh", "svm": "never"}
    )
    assert len(reports) == 2


# -- declarations and validation -------------------------------------------------------------


def test_level_3_rejects_residency_before_device_work(w):
    base = make_single(sp.IN, resident=True)
    cls = sp.scene_test(level=3)(type("L3", (base,), {}))
    s0 = w.stats()
    with pytest.raises(ArgumentError, match="level 3"):
        cls.run_case("one", worker=w)
    assert w.stats()["allocs"] == s0["allocs"]
    staged = sp.scene_test(level=3)(type("L3staged", (make_single(sp.IN, resident=False),), {}))
    staged.run_case("one", rounds=2, worker=w)


def test_decorator_validates_the_class():
    base = make_single(sp.IN, resident=False)
    with pytest.raises(ArgumentError, match="level"):
        sp.scene_test(level=4)
    with pytest.raises(ArgumentError, match="unknown keys"):
        sp.scene_test()(type("Bad", (base,), {"CASES": [{"name": "x", "param": {}}]}))
    with pytest.raises(ArgumentError, match="duplicate case name"):
        sp.scene_test()(type("Bad", (base,), {"CASES": [{"name": "x"}, {"name": "x"}]}))
    with pytest.raises(ArgumentTypeError, match="CALLABLE"):
        sp.scene_test()(type("Bad", (base,), {"CALLABLE": None}))
    with pytest.raises(ArgumentTypeError, match="platforms"):
        sp.scene_test()(type("Bad", (base,), {"CASES": [{"name": "x", "platforms": "sim"}]}))
    with pytest.raises(ArgumentTypeError, match="SceneTestCase"):
        sp.scene_test()(object)


def test_run_case_validates_its_inputs(w):
    cls = make_single(sp.IN, resident=False)
    with pytest.raises(ArgumentError, match="no case named"):
        cls.run_case("missing", worker=w)
    with pytest.raises(ArgumentError, match="rounds"):
        cls.run_case("one", rounds=0, worker=w)

    class WrongCount(cls):
        def generate_args(self, params):
            return sp.TaskArgsBuilder()

    with pytest.raises(ArgumentError, match="generate_args: signature has 1 tensor arguments, got 0"):
        WrongCount.run_case("one", worker=w)

    class NotABuilder(cls):
        def generate_args(self, params):
            return [np.zeros(4)]

    with pytest.raises(ArgumentTypeError, match="TaskArgsBuilder"):
        NotABuilder.run_case("one", worker=w)


def test_case_selectors_and_skip_reasons():
    assert runner.case_selected("A", "foo", None)
    assert runner.case_selected("A", "foo", ["foo"])
    assert runner.case_selected("A", "foo", ["A::foo"])
    assert runner.case_selected("A", "foo", ["A::"])
    assert runner.case_selected("A", "foo", ["bar,A::foo"])
    assert not runner.case_selected("A", "foo", ["B::foo"])
    assert not runner.case_selected("A", "foo", ["B::"])
    assert not runner.case_selected("A", "foo", ["foox"])
    assert runner.case_skip_reason({"name": "c"}, "sim") is None
    assert runner.case_skip_reason({"name": "c"}, "cuda") is None  # no platforms: every platform
    assert "not sim" in runner.case_skip_reason({"name": "c", "platforms": ["ascend"]}, "sim")
    assert "manual" in runner.case_skip_reason({"name": "c", "manual": True}, "sim")
    assert runner.case_skip_reason({"name": "c", "manual": True}, "sim", "include") is None
    assert runner.case_skip_reason({"name": "c"}, "sim", "only") is not None


# -- the pytest plugin and the standalone runner ---------------------------------------------

SCENE_FILE = textwrap.dedent(
    """
    import numpy as np
    import simpler as sp

    ROUNDS = []

    def acc_body(x, acc):
        ROUNDS.append(1)
        acc += x

    def bad_body(x, acc):
        acc += 2 * x

    ACC = sp.Kernel(acc_body, [sp.IN, sp.INOUT])
    BAD = sp.Kernel(bad_body, [sp.IN, sp.INOUT])

    class Base(sp.SceneTestCase):
        def generate_args(self, params):
            r = params.get("resident", False)
            return sp.TaskArgsBuilder(
                sp.TensorArg("x", np.arange(8, dtype=np.float32), child_memory=r),
                sp.TensorArg("acc", np.ones(8, dtype=np.float32), child_memory=r),
            )

        def compute_golden(self, args, params):
            args.acc[...] += args.x

    @sp.scene_test(level=2)
    class TestGood(Base):
        CALLABLE = sp.Callable(lambda o, x, acc: o.submit(ACC, x, acc), [sp.IN, sp.INOUT])
        CASES = [
            {"name": "staged"},
            {"name": "resident", "params": {"resident": True}},
            {"name": "big_manual", "params": {"resident": True}, "manual": True},
            {"name": "ascend_only", "platforms": ["ascend"]},
        ]

    @sp.scene_test(level=2)
    class TestBad(Base):
        CALLABLE = sp.Callable(lambda o, x, acc: o.submit(BAD, x, acc), [sp.IN, sp.INOUT])
        CASES = [{"name": "wrong_kernel", "params": {"resident": True}}]

    def test_rounds_seen(request):
        n_cases = sum(1 for i in request.session.items if "TestGood" in i.nodeid and not
                      i.get_closest_marker("skip"))
        assert len(ROUNDS) == n_cases * request.config.getoption("simpler_rounds")

    if __name__ == "__main__":
        sp.main()
    """
)


@pytest.fixture
def scene_file(pytester):
    return pytester.makepyfile(test_scenes=SCENE_FILE)


def test_plugin_collects_each_case_as_an_item(pytester, scene_file):
    r = pytester.runpytest("--collect-only", "-q")
    out = r.stdout.str()
    for case in ("TestGood::staged", "TestGood::resident", "TestGood::big_manual", "TestBad::wrong_kernel"):
        assert f"test_scenes.py::{case}" in out


def test_plugin_default_run_names_the_failing_case(pytester, scene_file):
    r = pytester.runpytest("--simpler-platform", "sim", "-rfs")
    r.assert_outcomes(passed=3, failed=1, skipped=2)
    r.stdout.fnmatch_lines(["*FAILED test_scenes.py::TestBad::wrong_kernel*"])
    r.stdout.fnmatch_lines(["*manual case*", "*case runs on ascend, not sim*"])


def test_plugin_rounds_and_skip_golden(pytester, scene_file):
    r = pytester.runpytest("--simpler-rounds", "3", "-k", "TestGood or rounds_seen")
    r.assert_outcomes(passed=3, skipped=2)
    r = pytester.runpytest("--simpler-rounds", "3", "--simpler-skip-golden")
    r.assert_outcomes(passed=4, skipped=2)


def test_plugin_k_selects_cases(pytester, scene_file):
    r = pytester.runpytest("-k", "resident and not manual")
    r.assert_outcomes(passed=1)


@pytest.mark.parametrize(
    ("selector", "outcomes"),
    [
        ("resident", {"passed": 1}),
        ("TestGood::resident", {"passed": 1}),
        ("TestGood::", {"passed": 2, "skipped": 2}),
        ("TestBad::wrong_kernel", {"failed": 1}),
        ("TestBad::resident", {}),
    ],
)
def test_plugin_case_option(pytester, scene_file, selector, outcomes):
    r = pytester.runpytest("--simpler-case", selector, "--deselect", "test_scenes.py::test_rounds_seen")
    r.assert_outcomes(**outcomes)


@pytest.mark.parametrize(
    ("manual", "outcomes"),
    [("include", {"passed": 3, "failed": 1, "skipped": 1}), ("only", {"passed": 1, "skipped": 4})],
)
def test_plugin_manual_option(pytester, scene_file, manual, outcomes):
    r = pytester.runpytest("--simpler-manual", manual, "--deselect", "test_scenes.py::test_rounds_seen")
    r.assert_outcomes(**outcomes)


def test_plugin_sim_options_reach_the_worker(pytester, scene_file):
    r = pytester.runpytest("--simpler-svm", "never", "--simpler-staging", "fresh", "-k", "TestGood")
    r.assert_outcomes(passed=2, skipped=2)
    r = pytester.runpytest("--simpler-svm", "sometimes")
    assert r.ret != 0
    r.stderr.fnmatch_lines(["*--simpler-svm*"])


def test_plugin_loaded_twice_is_harmless(pytester, scene_file):
    pytester.makeconftest('pytest_plugins = ["simpler.testing.pytest_plugin"]')
    r = pytester.runpytest("-k", "TestGood", "--simpler-rounds", "2")
    r.assert_outcomes(passed=2, skipped=2)
    r = pytester.runpytest("-p", "simpler.testing.pytest_plugin", "-k", "TestGood")
    r.assert_outcomes(passed=2, skipped=2)


def _standalone(path, *argv):
    return subprocess.run(
        [sys.executable, str(path), *argv], capture_output=True, text=True, timeout=120, cwd=path.parent
    )


def test_standalone_runner(pytester, scene_file):
    r = _standalone(scene_file, "-p", "sim", "--rounds", "3")
    assert r.returncode == 1, r.stdout + r.stderr
    assert "PASS TestGood::resident" in r.stdout and "FAIL TestBad::wrong_kernel" in r.stdout
    assert "SKIP TestGood::big_manual" in r.stdout and "SKIP TestGood::ascend_only" in r.stdout
    r = _standalone(scene_file, "-p", "sim", "--rounds", "3", "--case", "TestGood::")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "FAIL" not in r.stdout and "TestBad" not in r.stdout
    r = _standalone(
        scene_file, "--case", "wrong_kernel", "--skip-golden", "--svm", "never", "--staging", "fresh"
    )
    assert r.returncode == 0, r.stdout + r.stderr
    r = _standalone(scene_file, "--case", "big_manual", "--manual", "only")
    assert r.returncode == 0 and "PASS TestGood::big_manual" in r.stdout
    r = _standalone(scene_file, "--case", "NoSuch::")
    assert r.returncode == 2 and "no case matches --case NoSuch::" in r.stderr
    assert "TestGood::staged" in r.stderr  # the cases there are
    # Naming a manual case runs it, as in the plugin and the bench.
    r = _standalone(scene_file, "--case", "big_manual")
    assert r.returncode == 0 and "PASS TestGood::big_manual" in r.stdout


def test_vector_example_standalone_and_under_pytest(pytester):
    example = ROOT / "examples" / "vector_example" / "test_vector_example.py"
    r = _standalone(example, "-p", "sim", "--rounds", "3")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 failed" in r.stdout
    r = pytester.runpytest(
        str(example), "--simpler-platform", "sim", "--simpler-rounds", "3", "-p", "no:cacheprovider"
    )
    r.assert_outcomes(passed=6, skipped=2)


def test_the_plugin_coexists_with_a_conftest_that_declares_its_own_platform(pytester, scene_file):
    pytester.makeconftest(
        """
        def pytest_addoption(parser):
            parser.addoption("--platform", default="x86", help="this project's own option")
            parser.addoption("--rounds", default="1")
            parser.addoption("--case", default=None)

        def pytest_report_header(config):
            return f"own platform: {config.getoption('--platform')}"
        """
    )
    r = pytester.runpytest("--platform", "arm", "--simpler-platform", "sim", "-k", "TestGood")
    r.assert_outcomes(passed=2, skipped=2)
    r.stdout.fnmatch_lines(["own platform: arm"])


def test_the_plugin_is_disabled_by_its_short_name(pytester, scene_file):
    r = pytester.runpytest("-p", "no:simpler", "--collect-only", "-q")
    out = r.stdout.str()
    assert "TestGood::staged" not in out and "test_scenes.py::test_rounds_seen" in out
    r = pytester.runpytest("-p", "no:simpler", "--simpler-platform", "sim")
    assert r.ret == 4  # pytest's usage error: the option does not exist without the plugin


def test_an_unknown_platform_is_one_usage_error(pytester, scene_file):
    r = pytester.runpytest("--simpler-platform", "bogus")
    assert r.ret == 4  # a usage error, not a failure per case
    r.stderr.fnmatch_lines(["*--simpler-platform*invalid choice*bogus*"])
    assert "FAILED" not in r.stdout.str()


def test_run_reports_reach_junit_user_properties(pytester, scene_file, tmp_path):
    xml = tmp_path / "junit.xml"
    pytester.runpytest("--simpler-rounds", "2", "-k", "TestGood and staged", f"--junitxml={xml}")
    import xml.etree.ElementTree as ET

    (case,) = [t for t in ET.parse(xml).iter("testcase") if t.get("name") == "staged"]
    props = {p.get("name"): p.get("value") for p in case.iter("property")}
    rounds = json.loads(props["simpler_reports"])
    assert [r["round"] for r in rounds] == [1, 2]
    assert all(r["ok"] and "bind" in r["phases"] and "staged_bytes" in r["counters"] for r in rounds)


def test_the_plugin_refuses_a_sim_option_on_a_vendor_platform_once(pytester, scene_file):
    """A sim-only option on a vendor platform is one usage error, before any case runs."""
    r = pytester.runpytest("--simpler-platform", "cuda", "--simpler-svm", "never")
    assert r.ret == pytest.ExitCode.USAGE_ERROR
    r.stderr.fnmatch_lines(["*simpler: svm / capacity / reuse_addresses / model are sim options*"])
    assert "passed" not in r.stdout.str() and "failed" not in r.stdout.str()
