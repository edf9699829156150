"""The harness as a scene test ported from the upstream runtime (hw-native-sys/simpler) meets it:
upstream platform names, per-platform ``manual``, upstream's ``compare_outputs`` signature, the
``config`` case key, ``scene_test(level, runtime)``, ``SceneTestCase.run_module``, the pytest
fixtures and markers, the "nothing ran on this platform" note, and no warning repeated per round.

Scene classes are built inside the tests (not at module level), so the plugin does not collect
them as cases of this file.
"""

from __future__ import annotations

import enum
import logging
import subprocess
import sys
import textwrap
import warnings

import numpy as np
import pytest

import simpler as sp
from simpler import _core
from simpler.errors import ArgumentError, ArgumentTypeError
from simpler.testing import PLATFORM_ALIASES, SceneTestWarning, runner, scene_runtime
from simpler.testing.scene import case_platforms, manual_on, platform_name

pytest_plugins = ["pytester"]

N = 16


def _add(a, b, out):
    out[...] = a + b


ADD = sp.Kernel(_add, [sp.IN, sp.IN, sp.OUT])
ADD_CALLABLE = sp.Callable(lambda o, a, b, out: o.submit(ADD, a, b, out), [sp.IN, sp.IN, sp.OUT])


class AddBase(sp.SceneTestCase):
    """``out = a + b``; undecorated, so each test decorates its own subclass."""

    CALLABLE = ADD_CALLABLE
    CASES = [{"name": "one"}]

    def generate_args(self, params):
        return sp.TaskArgsBuilder(
            sp.TensorArg("a", np.arange(N, dtype=np.float32)),
            sp.TensorArg("b", np.ones(N, dtype=np.float32)),
            sp.TensorArg("out", np.zeros(N, dtype=np.float32)),
        )

    def compute_golden(self, args, params):
        args.out[...] = args.a + args.b


def decorate(cases=None, level=2, runtime=None, **attrs):
    """A decorated subclass of :class:`AddBase` with ``cases`` and extra class attributes."""
    body = dict(attrs)
    if cases is not None:
        body["CASES"] = cases
    return sp.scene_test(level=level, runtime=runtime)(type("TestAdd", (AddBase,), body))


# -- 1. upstream platform names ------------------------------------------------------------------


def test_upstream_platform_names_are_mapped_when_the_class_is_decorated():
    cls = decorate(
        [
            {"name": "a2a3", "platforms": ["a2a3sim", "a2a3"]},
            {"name": "a5", "platforms": ("a5sim", "a5")},
            {"name": "both", "platforms": ["a2a3sim", "a5sim", "cuda"]},
            {"name": "ours", "platforms": ["ascend"]},
            {"name": "a_set", "platforms": {"a2a3", "a2a3sim"}},
            {"name": "everywhere"},
        ]
    )
    plats = {c["name"]: c.get("platforms") for c in cls.CASES}
    assert plats == {
        "a2a3": ["sim", "ascend"],
        "a5": ["sim", "ascend"],
        "both": ["sim", "cuda"],  # a2a3sim and a5sim are both sim: listed once
        "ours": ["ascend"],
        "a_set": ["ascend", "sim"],  # a set: sorted by the upstream names
        "everywhere": None,
    }
    assert PLATFORM_ALIASES == {"a2a3sim": "sim", "a2a3": "ascend", "a5sim": "sim", "a5": "ascend"}
    assert all(p in _core.PLATFORMS for p in PLATFORM_ALIASES.values())
    assert platform_name("a5sim") == "sim" and platform_name("cuda") == "cuda"
    assert case_platforms({"name": "x", "platforms": ["a2a3"]}) == ["ascend"]
    # The mapped cases select like ours.
    assert runner.case_skip_reason(cls.CASES[0], "sim") is None
    assert "not cuda" in runner.case_skip_reason(cls.CASES[0], "cuda")


def test_an_unknown_platform_is_rejected_at_decoration_naming_ours_and_the_mapping():
    with pytest.raises(ArgumentError) as e:
        decorate([{"name": "x", "platforms": ["a2a3sim", "a3"]}])
    msg = str(e.value)
    assert "TestAdd.CASES[0] (x)" in msg and "'a3'" in msg
    assert ", ".join(_core.PLATFORMS) in msg and "a2a3sim -> sim" in msg and "a5 -> ascend" in msg
    with pytest.raises(ArgumentError, match="unknown platform 'Sim'"):
        decorate([{"name": "x", "platforms": ["Sim"]}])
    with pytest.raises(ArgumentTypeError, match="platforms"):
        decorate([{"name": "x", "platforms": "a2a3sim"}])  # a list, not a string


def test_nothing_ran_note_names_the_platform_and_the_count():
    cls = decorate([{"name": "x", "platforms": ["a2a3sim", "a2a3"]}, {"name": "y", "platforms": ["a2a3"]}])
    note = runner.nothing_ran_note(cls.CASES, 0, "cuda")
    assert note is not None
    assert "platform cuda" in note and "2 of the 2 selected" in note and "a2a3sim -> sim" in note
    assert runner.nothing_ran_note(cls.CASES, 1, "cuda") is None  # something ran
    assert runner.nothing_ran_note(cls.CASES, 0, "sim") is not None  # y is ascend only
    assert runner.nothing_ran_note(cls.CASES[:1], 0, "sim") is None  # skipped as manual, say
    assert runner.nothing_ran_note([], 0, "sim") is None


UPSTREAM_FILE = textwrap.dedent(
    """
    import numpy as np
    from simpler import Callable, IN, OUT, Kernel, SceneTestCase, TaskArgsBuilder, TensorArg, scene_test

    def _add(a, b, out):
        out[...] = a + b

    ADD = Kernel(_add, [IN, IN, OUT])

    @scene_test(level=2, runtime="tensormap_and_ringbuffer")
    class TestVectorPort(SceneTestCase):
        CALLABLE = Callable(lambda o, a, b, f: o.submit(ADD, a, b, f), signature=[IN, IN, OUT])
        CASES = [
            {"name": "default", "platforms": ["a2a3sim", "a2a3"], "manual": ["a2a3sim"], "params": {}},
            {"name": "regular", "platforms": ["a2a3sim", "a2a3"], "params": {}},
        ]

        def generate_args(self, params):
            return TaskArgsBuilder(
                TensorArg("a", np.full(64, 2.0, dtype=np.float32)),
                TensorArg("b", np.full(64, 3.0, dtype=np.float32)),
                TensorArg("f", np.zeros(64, dtype=np.float32)),
            )

        def compute_golden(self, args, params):
            args.f[:] = args.a + args.b

        def compare_outputs(self, test_args, golden_args, output_names, params):
            assert output_names == ["f"]
            super().compare_outputs(test_args, golden_args, output_names, params)

    if __name__ == "__main__":
        SceneTestCase.run_module(__name__)
    """
)


@pytest.fixture
def upstream_file(pytester):
    return pytester.makepyfile(test_port=UPSTREAM_FILE)


def _standalone(path, *argv):
    return subprocess.run(
        [sys.executable, str(path), *argv], capture_output=True, text=True, timeout=120, cwd=path.parent
    )


def test_standalone_run_where_every_case_skips_for_its_platform_says_so(upstream_file):
    r = _standalone(upstream_file, "-p", "cuda")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "0 passed, 0 failed, 2 skipped" in r.stdout
    assert "WARNING: no scene case ran on platform cuda: 2 of the 2 selected case(s)" in r.stderr
    r = _standalone(upstream_file, "-p", "sim")
    assert r.returncode == 0 and "PASS TestVectorPort::regular" in r.stdout, r.stdout + r.stderr
    assert "WARNING" not in r.stderr


def test_pytest_run_where_every_case_skips_for_its_platform_says_so_in_the_summary(pytester, upstream_file):
    r = pytester.runpytest("--simpler-platform", "cuda", "-W", "error")
    r.assert_outcomes(skipped=2)
    r.stdout.fnmatch_lines(
        ["*= simpler =*", "WARNING: no scene case ran on platform cuda: 2 of the 2 selected*"]
    )
    r = pytester.runpytest("--simpler-platform", "sim", "-W", "error")
    r.assert_outcomes(passed=1, skipped=1)
    assert "no scene case ran" not in r.stdout.str()
    r = pytester.runpytest("--simpler-platform", "cuda", "--collect-only")
    assert "no scene case ran" not in r.stdout.str()  # collecting only: nothing was to run


# -- 2. manual per platform ----------------------------------------------------------------------


def test_manual_per_platform():
    cls = decorate(
        [
            {"name": "list", "platforms": ["a2a3sim", "a2a3"], "manual": ["a2a3sim"]},
            {"name": "str", "manual": "a5"},
            {"name": "set", "manual": {"a2a3sim", "cuda"}},
            {"name": "tuple", "manual": ("sim",)},
            {"name": "everywhere", "manual": True},
            {"name": "nowhere", "manual": False},
        ]
    )
    by = {c["name"]: c for c in cls.CASES}
    assert by["list"]["manual"] == ("sim",) and by["str"]["manual"] == ("ascend",)
    assert set(by["set"]["manual"]) == {"sim", "cuda"}
    expected = {
        "list": {"sim"},
        "str": {"ascend"},
        "set": {"sim", "cuda"},
        "tuple": {"sim"},
        "everywhere": {"sim", "ascend", "cuda"},
        "nowhere": set(),
    }
    for name, on in expected.items():
        assert {p for p in _core.PLATFORMS if manual_on(by[name], p)} == on, name
    # Selection: manual on sim means skipped there under exclude, a regular case on ascend.
    assert "manual case on sim" in runner.case_skip_reason(by["list"], "sim")
    assert runner.case_skip_reason(by["list"], "ascend") is None
    assert runner.case_skip_reason(by["list"], "sim", "include") is None
    assert "not a manual case" in runner.case_skip_reason(by["list"], "ascend", "only")
    assert runner.case_skip_reason(by["list"], "sim", "exclude", named=True) is None
    # Undecorated dicts are read the same way (the runner maps names itself).
    assert manual_on({"name": "x", "manual": ["a2a3sim"]}, "sim")


SINGLE_MANUAL_FILE = textwrap.dedent(
    """
    import pytest

    @pytest.mark.manual("a2a3sim")
    def test_positional(st_platform):
        pass

    @pytest.mark.manual(platforms="a2a3sim")
    def test_keyword(st_platform):
        pass
    """
)


def test_manual_as_one_upstream_platform_name_applies_on_that_platform_only(pytester):
    """``"manual": "a2a3sim"`` (one upstream name, not a list) makes a case manual on sim and a
    regular case on ascend and cuda (``"a2a3"``: the other way round), read at decoration, from an
    undecorated dict, by the case planner and by a plain test's ``manual`` marker alike."""
    cls = decorate([{"name": "on_sim", "manual": "a2a3sim"}, {"name": "on_ascend", "manual": "a2a3"}])
    by = {c["name"]: c for c in cls.CASES}
    assert by["on_sim"]["manual"] == ("sim",) and by["on_ascend"]["manual"] == ("ascend",)
    for case, where in ((by["on_sim"], "sim"), (by["on_ascend"], "ascend")):
        assert {p for p in _core.PLATFORMS if manual_on(case, p)} == {where}, case
    for name, where in (("a2a3sim", "sim"), ("a5sim", "sim"), ("a2a3", "ascend"), ("a5", "ascend")):
        raw = {"name": "x", "manual": name}  # undecorated: mapped where it is read
        assert {p for p in _core.PLATFORMS if manual_on(raw, p)} == {where}, name
    for platform in _core.PLATFORMS:
        opts = runner.RunnerOptions(platform, 1, None, False, "exclude")
        skips = {p.case["name"]: p.skip for p in runner.plan_cases([cls], opts) if p.skip is not None}
        want = {n for n, on in (("on_sim", "sim"), ("on_ascend", "ascend")) if on == platform}
        assert set(skips) == want, (platform, skips)
        assert all(f"manual case on {platform}" in why for why in skips.values()), skips
    pytester.makepyfile(test_single=SINGLE_MANUAL_FILE)
    r = pytester.runpytest("--strict-markers", "-rs", "--simpler-platform", "sim")
    r.assert_outcomes(skipped=2)
    r.stdout.fnmatch_lines(["*manual test (run with --simpler-manual include)*"])
    for platform in ("ascend", "cuda"):
        pytester.runpytest("--strict-markers", "--simpler-platform", platform).assert_outcomes(passed=2)


@pytest.mark.parametrize("bad", [1, None, 0.5, {"a2a3sim": True}, [1]])
def test_manual_of_another_type_is_rejected_at_decoration(bad):
    with pytest.raises(ArgumentTypeError, match="'manual'"):
        decorate([{"name": "x", "manual": bad}])


def test_manual_with_an_unknown_platform_is_rejected_at_decoration():
    with pytest.raises(ArgumentError, match="'manual': unknown platform 'a3sim'"):
        decorate([{"name": "x", "manual": ["a3sim"]}])


def test_pytest_manual_per_platform(pytester, upstream_file):
    r = pytester.runpytest("--simpler-platform", "sim", "-rs")
    r.assert_outcomes(passed=1, skipped=1)
    r.stdout.fnmatch_lines(["*manual case on sim*"])
    r = pytester.runpytest("--simpler-platform", "sim", "--simpler-manual", "include")
    r.assert_outcomes(passed=2)


# -- 3. compare_outputs with upstream's signature ------------------------------------------------


def test_upstream_compare_outputs_is_called_with_the_output_names():
    calls = []

    class Upstream(AddBase):
        def compare_outputs(self, test_args, golden_args, output_names, params):
            calls.append((list(output_names), params))
            super().compare_outputs(test_args, golden_args, output_names, params)

    cls = sp.scene_test(level=2)(
        type("TestUp", (Upstream,), {"CASES": [{"name": "one", "params": {"k": 1}}]})
    )
    assert cls.run_case("one", rounds=3) and calls == [(["out"], {"k": 1})] * 3


def test_upstream_compare_outputs_subset_through_super():
    def wrong(a, b, out, junk):
        out[...] = a + b
        junk[...] = -1

    k = sp.Kernel(wrong, [sp.IN, sp.IN, sp.OUT, sp.OUT])

    class Subset(AddBase):
        CALLABLE = sp.Callable(
            lambda o, a, b, out, junk: o.submit(k, a, b, out, junk), [sp.IN, sp.IN, sp.OUT, sp.OUT]
        )

        def generate_args(self, params):
            args = super().generate_args(params)
            return sp.TaskArgsBuilder(*args.tensors(), sp.TensorArg("junk", np.zeros(N, np.float32)))

        def compare_outputs(self, test_args, golden_args, output_names, params):
            assert output_names == ["out", "junk"]
            super().compare_outputs(test_args, golden_args, ["out"], params)  # junk is not compared

    cls = sp.scene_test()(type("TestSubset", (Subset,), {}))
    cls.run_case("one", rounds=2)
    # Ours, for contrast: the default comparison covers junk and fails on it.
    plain = sp.scene_test()(type("TestAll", (Subset,), {"compare_outputs": sp.SceneTestCase.compare_outputs}))
    with pytest.raises(AssertionError, match="output 'junk'"):
        plain.run_case("one")


def test_our_compare_outputs_override_keeps_working():
    seen = []

    class Ours(AddBase):
        def compare_outputs(self, actual, golden, params):
            seen.append(params)
            super().compare_outputs(actual, golden, params)

    cls = sp.scene_test()(type("TestOurs", (Ours,), {}))
    cls.run_case("one", rounds=2)
    assert seen == [{}, {}]


def test_upstream_compare_outputs_at_level_3_gets_every_tensor():
    names = []

    class L3(AddBase):
        def compare_outputs(self, test_args, golden_args, output_names, params):
            names.append(list(output_names))

    sp.scene_test(level=3)(type("TestL3", (L3,), {})).run_case("one")
    assert names == [["a", "b", "out"]]


@pytest.mark.parametrize(
    "src",
    [
        "def compare_outputs(self, actual, golden): pass",
        "def compare_outputs(self, a, b, c, d, e): pass",
        "def compare_outputs(self, a, b, c, *, strict): pass",
        "compare_outputs = 3",
    ],
)
def test_a_compare_outputs_of_another_signature_is_refused_at_decoration(src):
    ns: dict = {}
    exec(src, ns)
    body = {"compare_outputs": ns["compare_outputs"]}
    with pytest.raises(ArgumentTypeError, match="compare_outputs"):
        decorate(**body)


def test_compare_outputs_signatures_that_are_accepted():
    def up_default(self, test_args, golden_args, output_names, params=None):
        pass

    def ours_variadic(self, *args):
        pass

    up_cls = decorate(compare_outputs=up_default)
    assert up_cls._scene_test_compare == "upstream"  # named output_names: upstream's, called with 4
    assert decorate(compare_outputs=ours_variadic)._scene_test_compare == "ours"
    assert (
        decorate(compare_outputs=staticmethod(lambda a, g, names, p: None))._scene_test_compare == "upstream"
    )
    # The base accepts both forms and refuses others.
    inst = AddBase()
    args = inst.generate_args({})
    golden = args.clone()
    golden.out[...] = 1.0
    with pytest.raises(AssertionError):
        inst.compare_outputs(args, golden, {})
    inst.compare_outputs(args, golden, [], {})  # nothing named: nothing compared
    with pytest.raises(ArgumentTypeError, match="not 5 arguments"):
        inst.compare_outputs(args, golden, [], {}, None)


# -- 4. the config case key ----------------------------------------------------------------------


def test_config_is_accepted_with_one_warning_per_class():
    cases = [
        {"name": "x", "config": {"aicpu_thread_num": 4}},
        {"name": "y", "config": {"runtime_env": {"ring_task_window": 32768}}},
        {"name": "z"},
    ]
    with warnings.catch_warnings(record=True) as got:
        warnings.simplefilter("always")
        cls = decorate(cases)
    assert len(got) == 1 and got[0].category is SceneTestWarning
    msg = str(got[0].message)
    assert "TestAdd" in msg and "x, y" in msg and "no equivalent here" in msg
    assert got[0].filename == __file__  # points at the decoration, not the harness
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SceneTestWarning)
        cls.run_case("x")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        decorate([{"name": "z"}])  # no config: no warning


def test_config_must_be_a_dict_and_other_unknown_keys_stay_errors():
    with pytest.raises(ArgumentTypeError, match="'config' must be a dict"):
        decorate([{"name": "x", "config": [1]}])
    with pytest.raises(ArgumentError, match=r"unknown keys \['extra'\]"):
        decorate([{"name": "x", "config": {}, "extra": 1}])


# -- 5. scene_test(level, runtime) ---------------------------------------------------------------


def test_runtime_is_recorded_and_level_stays_validated():
    class SceneTestLevel(enum.IntEnum):  # upstream's level enum
        CHIP = 2
        NODE = 3
        NETWORK1 = 4

    cls = decorate(level=SceneTestLevel.CHIP, runtime="tensormap_and_ringbuffer")
    assert scene_runtime(cls) == "tensormap_and_ringbuffer" and sp.testing.scene_level(cls) == 2
    assert scene_runtime(decorate()) is None
    with pytest.raises(ArgumentTypeError, match="not a class decorated with scene_test"):
        scene_runtime(AddBase)
    assert (
        scene_runtime(sp.scene_test(2, "host_build_graph")(type("P", (AddBase,), {}))) == "host_build_graph"
    )
    for bad in (4, SceneTestLevel.NETWORK1, True, "2"):
        with pytest.raises(ArgumentError, match="level"):
            sp.scene_test(level=bad, runtime="x")
    with pytest.raises(ArgumentTypeError, match="runtime"):
        sp.scene_test(level=2, runtime=3)


# -- 6. SceneTestCase.run_module -----------------------------------------------------------------


def test_run_module_is_the_standalone_runner(upstream_file):
    r = _standalone(upstream_file, "-p", "sim", "--rounds", "2", "--manual", "include")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS TestVectorPort::default (2 round(s)" in r.stdout and "2 passed, 0 failed" in r.stdout
    r = _standalone(upstream_file, "--case", "nope")
    assert r.returncode == 2 and "no case matches --case nope" in r.stderr


def test_run_module_in_process(monkeypatch, capsys):
    module = type(sys)("upstream_port_in_process")
    cls = decorate()
    cls.__module__ = module.__name__
    module.TestAdd = cls
    monkeypatch.setitem(sys.modules, module.__name__, module)
    with pytest.raises(SystemExit) as e:
        sp.SceneTestCase.run_module(module.__name__, ["-p", "sim", "--rounds", "2"])
    assert e.value.code == 0 and "PASS TestAdd::one (2 round(s)" in capsys.readouterr().out
    with pytest.raises(ArgumentError, match="no imported module"):
        sp.SceneTestCase.run_module("no.such.module", [])


# -- 7. pytest fixtures and markers ---------------------------------------------------------------

MARKED_FILE = textwrap.dedent(
    """
    import pytest

    def test_platform(st_platform):
        assert st_platform == "sim"

    def test_one_device(st_device_ids):
        assert st_device_ids == [0]

    @pytest.mark.device_count(2)
    @pytest.mark.runtime("tensormap_and_ringbuffer")
    def test_two_devices(st_device_ids):
        assert st_device_ids == [0, 1]

    @pytest.mark.platforms(["a2a3sim", "a2a3"])
    def test_on_sim(st_platform):
        pass

    @pytest.mark.platforms(["a2a3"])
    def test_ascend_only(st_platform):
        pass

    @pytest.mark.platforms(["a2a3sim", "a2a3"])
    @pytest.mark.manual(platforms=["a2a3sim"])
    def test_manual_on_sim(st_platform):
        pass

    @pytest.mark.manual
    def test_manual_everywhere(st_platform):
        pass

    @pytest.mark.platforms(["a3"])
    def test_unknown_platform(st_platform):
        pass
    """
)


def test_fixtures_and_markers(pytester):
    pytester.makepyfile(test_marked=MARKED_FILE)
    r = pytester.runpytest("--strict-markers", "-W", "error", "-rs", "--simpler-platform", "sim")
    r.assert_outcomes(passed=4, skipped=3, errors=1)
    r.stdout.fnmatch_lines_random(
        [
            "*test runs on ascend, not sim*",
            "*manual test (run with --simpler-manual include)*",
            "*ERROR*test_unknown_platform*",
        ]
    )
    assert "unknown platform 'a3'" in r.stdout.str()
    r = pytester.runpytest("--strict-markers", "--simpler-manual", "include", "-k", "manual")
    r.assert_outcomes(passed=2)
    r = pytester.runpytest(
        "--strict-markers", "--simpler-platform", "ascend", "-k", "ascend_only or manual_on"
    )
    r.assert_outcomes(passed=2)
    r = pytester.runpytest("--markers")
    r.stdout.fnmatch_lines(["*@pytest.mark.platforms(names)*", "*@pytest.mark.device_count(n)*"])


def test_nothing_ran_note_counts_platforms_marked_tests(pytester):
    pytester.makepyfile(
        test_marked="""
        import pytest

        @pytest.mark.platforms(["a2a3"])
        def test_ascend_only(st_platform):
            pass
        """
    )
    r = pytester.runpytest("--simpler-platform", "sim")
    r.assert_outcomes(skipped=1)
    r.stdout.fnmatch_lines(["WARNING: no scene case ran on platform sim: 1 of the 1 selected*"])


def test_other_projects_markers_are_left_alone(pytester):
    """The plugin loads wherever simpler is installed: a test that is not a scene-test module's
    (no scene test in its module, no ``st_*`` fixture) keeps its ``manual`` / ``platforms``
    markers to itself."""
    pytester.makepyfile(
        test_other="""
        import pytest

        @pytest.mark.manual
        def test_needs_a_human():
            pass

        @pytest.mark.platforms("linux")
        def test_linux_only():
            pass
        """
    )
    r = pytester.runpytest("-p", "no:cacheprovider")
    r.assert_outcomes(passed=2)


# -- 8. no warning repeats every round -----------------------------------------------------------


def _warnings_of(caplog, cls, case, rounds, platform="sim"):
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="simpler"):
        cls.run_case(case, platform=platform, rounds=rounds)
    return [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]


def test_scene_runs_warn_once_per_case_not_per_round(caplog):
    from simpler.workloads import paged_attention as pa

    for case in pa.PagedAttention.CASES:
        if case.get("manual"):
            continue
        assert _warnings_of(caplog, pa.PagedAttention, case["name"], 3) == [], case["name"]

    # A case whose orchestration reads a large resident tensor: one warning (the host view of a
    # large tensor) per case, whatever the round count.
    big = 1 << 20

    def orch(o, a, b, out):
        o.read_tensor(a)
        o.submit(ADD, a, b, out)

    class Big(AddBase):
        CALLABLE = sp.Callable(orch, [sp.IN, sp.IN, sp.OUT])

        def generate_args(self, params):
            return sp.TaskArgsBuilder(
                sp.TensorArg("a", np.ones(big, np.float32), child_memory=True),
                sp.TensorArg("b", np.ones(big, np.float32)),
                sp.TensorArg("out", np.zeros(big, np.float32)),
            )

    cls = sp.scene_test()(type("TestBig", (Big,), {}))
    once = _warnings_of(caplog, cls, "one", 1)
    assert len(once) == 1 and "host views of large tensors" in once[0]
    assert len(_warnings_of(caplog, cls, "one", 4)) == 1
