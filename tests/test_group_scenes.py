"""Scene tests and the bench on several devices (sim): a declared device count run through the
harness, ``--simpler-devices`` / ``--devices`` on the examples, paged attention's batch split over
two devices in every residency arm, the golden following resident state over rounds on every
device, cases that cannot split, and ``simpler bench --devices 2``.

``TestAccumulateOnTwoDevices`` is a module-level scene test: the plugin collects its cases here
and runs each on the two devices it declares (the device processes import this module by name).
"""

from __future__ import annotations

import contextlib
import io
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

import simpler as sp
from simpler.errors import ArgumentError
from simpler.group import DeviceGroup
from simpler.testing.scene_group import GroupRound
from simpler.tools import cli
from simpler.workloads import paged_attention as pa

ROOT = Path(__file__).resolve().parents[1]
PA_EXAMPLE = ROOT / "examples" / "paged_attention" / "test_paged_attention.py"
VECTOR_EXAMPLE = ROOT / "examples" / "vector_example" / "test_vector_example.py"


def _axpy(x, acc, scale):
    acc += scale * x


AXPY = sp.Kernel(_axpy, [sp.IN, sp.INOUT], name="axpy")


def _orch(o, x, acc, scale):
    o.submit(AXPY, x, acc, scale)


@sp.scene_test(level=2)
class TestAccumulateOnTwoDevices(sp.SceneTestCase):
    """``acc += scale * x`` with ``x`` and ``acc`` split along axis 0 over two devices: staged
    (``acc`` restored every round), resident (``acc`` carried across rounds on every device, the
    golden evolving with it), and one case on three devices."""

    CALLABLE = sp.Callable(_orch, [sp.IN, sp.INOUT], name="accumulate")
    DEVICES = 2
    SPLIT = {"x": 0, "acc": 0}
    CASES = [
        {"name": "staged", "params": {"resident": ()}},
        {"name": "resident", "params": {"resident": ("x", "acc")}},
        {"name": "state_only_on_three", "params": {"resident": ("acc",)}, "devices": 3},
    ]

    def generate_args(self, params):
        n, res = 10, params["resident"]
        return sp.TaskArgsBuilder(
            sp.TensorArg("x", np.arange(n, dtype=np.float32), child_memory="x" in res),
            sp.TensorArg("acc", np.full(n, 2.0, np.float32), child_memory="acc" in res),
            sp.Scalar("scale", 0.5),
        )

    def compute_golden(self, args, params):
        args.acc[...] += args.scale * args.x


class _WrongGolden(TestAccumulateOnTwoDevices):
    """A golden off by one step per round (not decorated: not collected)."""

    def compute_golden(self, args, params):
        args.acc[...] += 2 * args.scale * args.x


class _Unsplittable(TestAccumulateOnTwoDevices):
    """Says nothing about splitting."""

    SPLIT = None
    DEVICES = 1


class _SharedOutput(TestAccumulateOnTwoDevices):
    """``acc`` goes whole to every device: one array written by two devices."""

    SPLIT = {"x": 0}


class _WrongCount(TestAccumulateOnTwoDevices):
    def split_args(self, args, params, n):
        return super().split_args(args, params, n)[:1]


# -- a declared device count, through the harness ---------------------------------------------


def test_a_declared_device_count_runs_every_round_on_every_device():
    rounds = TestAccumulateOnTwoDevices.run_case("resident", rounds=3)
    assert len(rounds) == 3 and all(isinstance(r, GroupRound) for r in rounds)
    for r in rounds:
        assert r.devices == [0, 1] and r.ok and r.wall_ns > 0
        # Resident on both devices: nothing staged; each device holds its half of x and acc.
        assert [d.counters["resident_tensors"] for d in r.reports] == [2, 2]
        assert [d.counters["staged_bytes"] for d in r.reports] == [0, 0]
        assert r.dispatch_ns == max(sum(v for k, v in d.phases.items() if k != "execute") for d in r.reports)
    three = TestAccumulateOnTwoDevices.run_case("state_only_on_three", rounds=2)
    assert three[0].devices == [0, 1, 2]
    # Staged on two devices: each stages its half of x and acc (5 floats each).
    staged = TestAccumulateOnTwoDevices.run_case("staged", rounds=2)
    assert [d.counters["staged_bytes"] for d in staged[1].reports] == [40, 40]


def test_the_golden_follows_resident_state_over_rounds_on_every_device():
    # acc evolves on each device; the golden's whole acc evolves with it, compared after round 3.
    TestAccumulateOnTwoDevices.run_case("resident", rounds=3)
    with pytest.raises(AssertionError, match="output 'acc'") as ei:
        sp.run_case(_WrongGolden, "resident", rounds=3)
    assert any("on 2 devices, after 3 round(s) (resident outputs)" in n for n in ei.value.__notes__)
    with pytest.raises(AssertionError) as ei:
        sp.run_case(_WrongGolden, "staged", rounds=2)
    assert any("on 2 devices, round 1/2" in n for n in ei.value.__notes__)


def test_the_device_count_is_overridden_and_one_device_stays_single():
    reports = sp.run_case(TestAccumulateOnTwoDevices, "resident", rounds=2, devices=1)
    assert all(isinstance(r, sp.RunReport) for r in reports)
    with sp.Worker("sim") as w, pytest.raises(ArgumentError, match="runs on 2 devices"):
        sp.run_case(TestAccumulateOnTwoDevices, "resident", worker=w)
    with DeviceGroup("sim", devices=[4, 7], staging="fresh") as g:  # no arena: every buffer the case's
        r = sp.run_case(TestAccumulateOnTwoDevices, "state_only_on_three", rounds=2, group=g)
        assert r[0].devices == [4, 7] and not g.closed  # the group's devices win; left open
        # The case's buffers (its resident acc, each round's staged x) were all released.
        assert [(s["allocs"], s["live_allocations"]) for s in g.stats()] == [(3, 0), (3, 0)]


def test_a_case_that_cannot_split_says_so():
    with pytest.raises(ArgumentError, match=r"_Unsplittable cannot run on 2 devices: .*SPLIT"):
        sp.run_case(_Unsplittable, "resident", devices=2)
    with pytest.raises(ArgumentError, match=r"case\(s\) staged.* run on several devices, but"):
        sp.scene_test()(type("TestBad", (_Unsplittable,), {"DEVICES": 2, "__module__": __name__}))
    with pytest.raises(ArgumentError, match="output 'acc' shares memory between devices"):
        sp.run_case(_SharedOutput, "staged")
    with pytest.raises(ArgumentError, match="must return 2 TaskArgsBuilders"):
        sp.run_case(_WrongCount, "staged")
    with pytest.raises(
        ArgumentError, match=r"CASES\[0\] \(x\): 'devices': a device count is a positive int, not 0"
    ):
        sp.scene_test()(
            type("TestBad", (TestAccumulateOnTwoDevices,), {"CASES": [{"name": "x", "devices": 0}]})
        )

    def local():
        @sp.scene_test()
        class Local(TestAccumulateOnTwoDevices):
            pass

        return Local

    with pytest.raises(ArgumentError, match="define the class at the top level of a module"):
        sp.run_case(local(), "staged")


def test_split_by_axes_cuts_uneven_batches_and_merges_them_back():
    args = TestAccumulateOnTwoDevices().generate_args({"resident": ("acc",)})
    parts = TestAccumulateOnTwoDevices().split_args(args, {}, 3)
    assert [p.x.tolist() for p in parts] == [[0, 1, 2, 3], [4, 5, 6], [7, 8, 9]]
    assert all(p.spec("acc").child_memory and not p.spec("x").child_memory for p in parts)
    for i, p in enumerate(parts):
        p.acc[...] = i
    TestAccumulateOnTwoDevices().merge_outputs(parts, args, {})
    assert args.acc.tolist() == [0] * 4 + [1] * 3 + [2] * 3


# -- paged attention's batch over two devices ---------------------------------------------------


@pytest.fixture(scope="module")
def two_devices():
    with DeviceGroup("sim", devices=[0, 1]) as g:
        yield g


@pytest.mark.parametrize("base", ["Small1", "Small2"])
@pytest.mark.parametrize("arm", pa.ARMS)
def test_paged_attention_splits_its_batch_over_two_devices_golden_in_every_arm(two_devices, base, arm):
    rounds = sp.run_case(pa.PagedAttention, f"{base}_{arm}", rounds=2, group=two_devices)
    resident = len(pa.RESIDENT[arm])
    for r in rounds:
        assert r.ok and r.devices == [0, 1]
        assert [d.counters["resident_tensors"] for d in r.reports] == [resident, resident]
        if arm == "Residency_all":  # control tensors resident too: nothing staged on any device
            assert [d.counters["staged_bytes"] for d in r.reports] == [0, 0]


def test_split_batch_gives_each_device_its_sequences_blocks_reindexed():
    params = dict(pa._BASES[1][1], arm="Residency_bulk")  # Small2: contexts 0, 1 and 50
    x = pa.PagedAttention().generate_args(params)
    parts = pa.split_batch(x, 2)
    assert [p.context_lens.tolist() for p in parts] == [[0, 1], [50]]
    assert [p.key_cache.shape[0] for p in parts] == [1, 7]  # the blocks their sequences use
    outs = []
    for p in parts:
        assert p.spec("query").child_memory and not p.spec("block_table").child_memory
        outs.append(
            pa.golden_paged_attention(
                p.query, p.key_cache, p.value_cache, p.block_table, p.context_lens, p.scale
            )
        )
    whole = pa.golden_paged_attention(
        x.query, x.key_cache, x.value_cache, x.block_table, x.context_lens, x.scale
    )
    np.testing.assert_array_equal(np.concatenate(outs), whole)
    with pytest.raises(ArgumentError, match="cannot split a batch of 3 over 4 devices"):
        pa.split_batch(x, 4)


# -- the front ends: pytest, the standalone runner, the bench ----------------------------------


def test_pytest_simpler_devices_runs_an_example_on_two_devices(tmp_path):
    xml = tmp_path / "junit.xml"
    r = subprocess.run(
        [
            *(sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs"),
            *(str(PA_EXAMPLE), str(VECTOR_EXAMPLE)),
            *("--simpler-devices", "2", "--simpler-rounds", "2", "-k", "Small1 or TestVectorAdd"),
            f"--junitxml={xml}",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 passed" in r.stdout
    # The vector example does not say how to split: skipped, with the reason.
    assert "cannot run on 2 devices (--simpler-devices): TestVectorAdd does not say" in r.stdout
    props = [
        json.loads(p.get("value"))
        for p in ET.parse(xml).getroot().iter("property")
        if p.get("name") == "simpler_reports"
    ]
    assert len(props) == 3
    for rounds in props:
        assert [x["round"] for x in rounds] == [1, 2]
        assert all(x["devices"] == [0, 1] and len(x["per_device"]) == 2 for x in rounds)


def test_the_standalone_runner_takes_devices():
    r = subprocess.run(
        [
            sys.executable,
            str(PA_EXAMPLE),
            "--devices",
            "2",
            "--rounds",
            "2",
            "--case",
            "Small2_Residency_all",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "PASS TestPagedAttention::Small2_Residency_all (2 round(s), 2 devices," in r.stdout
    assert "(platform sim, rounds 2, devices 2)" in r.stdout


@pytest.fixture(scope="module")
def bench_two_devices(tmp_path_factory):
    """``simpler bench paged_attention --devices 2 --case Small1 --rounds 2`` and its JSON lines."""
    out = tmp_path_factory.mktemp("bench") / "pa2.jsonl"
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = [
        "bench",
        "paged_attention",
        "--devices",
        "2",
        "--rounds",
        "2",
        "--case",
        "Small1",
        "--json",
        str(out),
    ]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(argv)
    return status, stdout.getvalue(), stderr.getvalue(), out


def test_bench_devices_prints_per_device_and_whole_round_figures_beside_one_device(bench_two_devices):
    status, text, err, _ = bench_two_devices
    assert status == 0, err
    one, _, two = text.partition("PagedAttention::Small1 on 2 devices (sim, 2 round(s), golden checked)")
    assert "PagedAttention::Small1 (sim, 2 round(s), golden checked)" in one and two
    assert "dispatch ratios: Residency_bulk / Residency_staged = " in one
    # The unit (us or ms) follows the figures: never asserted.
    assert re.search(r"^per device \((us|ms); warm median, rounds 2\.\.2\):$", two, re.M)
    assert re.search(r"^whole round: wall time of the group round \((us|ms)\)$", two, re.M)
    lines = two.splitlines()
    for arm in pa.ARMS:
        at = [i for i, line in enumerate(lines) if line.split()[:1] == [arm]]
        assert len(at) == 3  # per device, whole round, summary
        # per device: device 0 on the arm's row, device 1 on the next, each phase and dispatch
        assert lines[at[0]].split()[1] == "0" and lines[at[0] + 1].split()[0] == "1"
        assert len(lines[at[0] + 1].split()) == 1 + len(cli.PHASES) + 1 + 2  # ... bytes/round
    for label in (
        "dispatch ratios, 1 device:",
        "dispatch ratios, 2 devices:",
        "whole-round ratios, 2 devices:",
    ):
        line = next(x for x in two.splitlines() if label in x)
        assert "Residency_bulk / Residency_staged = " in line and "Residency_all / Residency_bulk = " in line
    assert re.search(r"1 device (us|ms) +vs staged +2 devices (us|ms) +vs staged +whole round (us|ms)", two)


def test_bench_devices_records_one_per_device_and_round(bench_two_devices, capsys):
    _, text, _, out = bench_two_devices
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    single = [r for r in recs if r["devices"] == 1]
    multi = [r for r in recs if r["devices"] == 2]
    assert len(single) == 3 * 2 and len(multi) == 3 * 2 * 2
    assert all("device" not in r for r in single)
    for arm in pa.ARMS:
        rs = [r for r in multi if r["arm"] == arm]
        assert sorted((r["round"], r["device"], r["device_index"]) for r in rs) == [
            (1, 0, 0),
            (1, 1, 1),
            (2, 0, 0),
            (2, 1, 1),
        ]
        for k in (1, 2):
            walls = {r["round_wall_ns"] for r in rs if r["round"] == k}
            assert len(walls) == 1 and walls.pop() > 0  # the group round's, on both devices
    for r in recs:
        assert (
            r["ok"]
            and r["golden"]
            and r["dispatch_ns"] == sum(v for k, v in r["phases"].items() if k != "execute")
        )
    # `simpler report` re-prints the same tables; a comparison has the case on two devices too.
    assert cli.main(["report", str(out)]) == 0
    tables = text.rsplit(f"{len(recs)} round report(s) written", 1)[0]
    assert capsys.readouterr().out.strip() == tables.strip()
    assert cli.main(["report", str(out), str(out)]) == 0
    compare = capsys.readouterr().out
    assert "PagedAttention::Small1 on 2 devices (warm medians)" in compare


def test_bench_devices_on_a_workload_that_cannot_split_is_a_usage_error(capsys):
    status = cli.main(["bench", str(VECTOR_EXAMPLE), "--devices", "2", "--case", "staged", "--rounds", "1"])
    err = capsys.readouterr().err
    assert status == 2
    assert "cannot run on 2 devices" in err and "every selected case" in err
