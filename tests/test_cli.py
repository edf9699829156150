"""The ``simpler`` command: ``bench`` on the small paged-attention case (three arms, ratios,
JSON lines with the documented keys and provenance), ``report`` re-reading them and comparing two
runs, the workload registry and driver hook, ``--plot``, and the command-line conventions (usage
errors exit 2 with one line and no traceback, ``--version``, ``python -m simpler``)."""

from __future__ import annotations

import contextlib
import importlib.metadata
import importlib.util
import io
import json
import os
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points

import pytest

import simpler as sp
from simpler.tools import cli, report
from simpler.tools.bench import BenchOptions, bench_records

ARMS = ("Residency_staged", "Residency_bulk", "Residency_all")
RECORD_KEYS = {
    "workload",
    "test",
    "case",
    "case_name",
    "arm",
    "round",
    "rounds",
    "platform",
    "golden",
    "golden_skipped_by",
    "callable",
    "ok",
    "phases",
    "counters",
    "dispatch_ns",
    "bytes_moved",
    "version",
    "commit",
    "host",
    "python",
    "timestamp",
}


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One bench run of paged attention's Small1 case, 2 rounds, with its JSON lines."""
    out = tmp_path_factory.mktemp("bench") / "pa.jsonl"
    stdout, stderr = io.StringIO(), io.StringIO()
    argv = ["bench", "paged_attention", "--rounds", "2", "--case", "Small1", "--json", str(out)]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        status = cli.main(argv)
    return status, stdout.getvalue(), out


def test_bench_prints_three_arms_with_ratios(bench_run):
    status, text, _ = bench_run
    assert status == 0
    assert "PagedAttention::Small1 (sim, 2 round(s), golden checked)" in text
    assert " spread" in text
    for arm in ARMS:
        assert arm in text
    for row in ("bind", "orchestrate", "execute", "copy_back", "cleanup", "dispatch", "bytes/round"):
        assert f" {row} " in text
    assert "Residency_bulk / Residency_staged = " in text
    assert "Residency_all / Residency_bulk = " in text
    assert "1.00x" in text  # the baseline against itself
    assert "Small2" not in text  # --case selects the case by its name without the arm


def test_bench_json_lines_have_the_documented_keys(bench_run):
    _, _, out = bench_run
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 6
    # The arms are interleaved round by round, the order rotating: staged, bulk, all in round 1,
    # then bulk, all, staged in round 2.
    order = [(r["round"], r["arm"]) for r in recs]
    assert order == [(1, a) for a in ARMS] + [(2, a) for a in (*ARMS[1:], ARMS[0])]
    for r in recs:
        assert RECORD_KEYS <= set(r)
        assert r["case"] == "Small1" and r["case_name"] == f"Small1_{r['arm']}"
        assert set(cli.PHASES) <= set(r["phases"])
        assert r["dispatch_ns"] == sum(v for k, v in r["phases"].items() if k != "execute")
        assert r["bytes_moved"] == sum(r["counters"][k] for k in cli.BYTES_KEYS)
        assert r["ok"] and r["golden"] and r["platform"] == "sim" and r["rounds"] == 2
        assert r["version"] == sp.__version__ and r["timestamp"].endswith("+00:00") and r["host"]
    by_arm = {r["arm"]: r for r in recs if r["round"] == 2}
    # Staged moves the caches every round; resident arms move only what stays staged.
    assert by_arm["Residency_staged"]["bytes_moved"] > by_arm["Residency_bulk"]["bytes_moved"]
    assert by_arm["Residency_all"]["counters"]["staged_bytes"] == 0


def test_report_reprints_the_tables(bench_run, capsys):
    _, text, out = bench_run
    assert cli.main(["report", str(out)]) == 0
    printed = capsys.readouterr().out
    assert cli.format_tables(cli.read_jsonl(out)) in printed
    assert cli.format_tables(cli.read_jsonl(out)) in text  # the bench printed the same tables


def test_report_compares_two_runs_side_by_side(bench_run, tmp_path, capsys):
    _, _, out = bench_run
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    for r in recs:  # a second run, twice as slow to dispatch on the bulk arm
        if r["arm"] == "Residency_bulk":
            r["phases"] = {k: 2 * v for k, v in r["phases"].items()}
            r["dispatch_ns"] *= 2
    other = tmp_path / "b.jsonl"
    other.write_text("".join(json.dumps(r) + "\n" for r in recs))
    assert cli.main(["report", str(out), str(other)]) == 0
    text = capsys.readouterr().out
    assert f"a = {out} (simpler {sp.__version__}" in text and f"b = {other}" in text
    assert "PagedAttention::Small1 (warm medians)" in text
    lines = text.splitlines()
    bulk = lines.index(next(line for line in lines if line.startswith("Residency_bulk")))
    assert lines[bulk].split()[-1] == "2.00x"  # bind, b / a
    staged = next(line for line in lines if line.startswith("Residency_staged"))
    assert staged.split()[-1] == "1.00x"


def _run(argv, tmp_path=None):
    """The command in a subprocess: (exit status, stdout, stderr)."""
    p = subprocess.run([sys.executable, "-m", "simpler", *argv], capture_output=True, text=True, cwd=tmp_path)
    return p.returncode, p.stdout, p.stderr


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["report", "missing.jsonl"], "cannot read missing.jsonl"),
        (["report", "{bad}"], "not JSON"),
        (["report", "foreign"], "not a bench record"),
        (["bench", "nope", "--rounds", "1"], "no such workload: nope"),
        (["bench", "paged_attention", "--platform", "tpu"], "invalid choice: 'tpu'"),
        (["bench", "paged_attention", "--case", "Nope"], "no case matches --case Nope; the cases are: "),
        (["bench", "paged_attention", "--json", "missing_dir/x.jsonl"], "missing_dir does not exist"),
        (["bench", "paged_attention", "--rounds", "0"], "must be a positive int"),
        (["frobnicate"], "invalid choice: 'frobnicate'"),
        (["report", "a", "b", "c"], "one file (tables) or two"),
        (["report", "typed"], "'phases' must map names to numbers"),
        (["bench", "paged_attention", "--json", "adir"], "--json adir: is a directory"),
        (
            ["bench", "paged_attention", "--platform", "cuda", "--svm", "never"],
            "sim options; platform 'cuda'",
        ),
        (
            ["bench", "paged_attention", "--platform", "ascend", "--model", "h200"],
            "sim options; platform 'ascend'",
        ),
    ],
)
def test_usage_errors_exit_2_with_one_line_and_no_traceback(tmp_path, argv, message):
    (tmp_path / "{bad}").write_text("{not json}\n")
    (tmp_path / "foreign").write_text('{"some": "json"}\n')
    (tmp_path / "typed").write_text(
        '{"phases": "x", "counters": {}, "arm": "a", "case": "c", "dispatch_ns": 1}\n'
    )
    (tmp_path / "adir").mkdir()
    status, _out, err = _run(argv, tmp_path)
    assert status == 2, err
    assert message in err, err
    assert "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err


def test_an_unknown_case_lists_the_cases(tmp_path):
    _, _, err = _run(["bench", "paged_attention", "--case", "Nope"], tmp_path)
    assert "PagedAttention::Small1_Residency_staged" in err


def test_an_unavailable_platform_is_one_message(tmp_path, monkeypatch):
    monkeypatch.setenv("SIMPLER_CUDA_LIB", "/nonexistent/libcuda.so.1")
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "simpler",
            "bench",
            "paged_attention",
            "--platform",
            "cuda",
            "--case",
            "Small1",
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert p.returncode == 1
    assert p.stderr.count("cannot open vendor library") == 1, p.stderr
    assert "Traceback" not in p.stderr


def test_version_and_python_m(tmp_path):
    status, out, _ = _run(["--version"], tmp_path)
    assert (status, out.strip()) == (0, f"simpler {sp.__version__}")
    status, out, _ = _run(["--help"], tmp_path)
    assert status == 0 and "bench" in out and "report" in out
    assert sp.__version__ == importlib.metadata.version("simpler-residency")


def _into_a_closed_pipe(argv, cwd, buffered):
    """The command with a stdout pipe whose read end is closed before it starts, so every write
    fails with EPIPE (``simpler report pa.jsonl | head`` where the reader went first)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
    if not buffered:
        env["PYTHONUNBUFFERED"] = "1"
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        return subprocess.run(
            [sys.executable, "-m", "simpler", *argv],
            stdout=write_end,
            stderr=subprocess.PIPE,
            text=True,
            cwd=cwd,
            env=env,
        )
    finally:
        os.close(write_end)


@pytest.mark.parametrize("buffered", [True, False], ids=["buffered", "unbuffered"])
@pytest.mark.parametrize(
    "argv", [["report", "pa.jsonl"], ["report", "pa.jsonl", "pa.jsonl"], ["--help"], ["--version"]]
)
def test_a_closed_output_pipe_ends_quietly(bench_run, tmp_path, argv, buffered):
    """The command stops with 141, as a command ended by SIGPIPE does, and prints no traceback,
    whether Python buffers its standard output or not."""
    (tmp_path / "pa.jsonl").write_bytes(bench_run[2].read_bytes())
    p = _into_a_closed_pipe(argv, tmp_path, buffered)
    assert (p.returncode, p.stderr) == (141, "")


def test_a_closed_output_pipe_does_not_lose_the_json_file(tmp_path):
    argv = ["bench", "paged_attention", "--rounds", "1", "--case", "Small1", "--json", "out.jsonl"]
    p = _into_a_closed_pipe(argv, tmp_path, buffered=False)  # fails at the first table line
    assert p.returncode == 141 and "Traceback" not in p.stderr, p.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 3


def test_the_json_message_follows_the_tables(tmp_path, capsys):
    out = tmp_path / "r.jsonl"
    assert (
        cli.main(["bench", "paged_attention", "--rounds", "1", "--case", "Small1", "--json", str(out)]) == 0
    )
    printed = capsys.readouterr().out
    assert printed.index("== paged_attention ::") < printed.index("written to")
    assert len(out.read_text().splitlines()) == 3


def test_case_and_arm_from_names_and_params():
    assert cli.split_arm({"name": "B64_8K_Residency_bulk"}) == ("B64_8K", "Residency_bulk")
    assert cli.split_arm({"name": "Residency_staged"}) == ("Residency_staged", "Residency_staged")
    assert cli.split_arm({"name": "x", "params": {"case": "c", "arm": "a"}}) == ("c", "a")
    assert cli.split_arm({"name": "plain"}) == ("plain", "plain")


def test_driver_workload_hook(tmp_path, capsys):
    drv = tmp_path / "drv.py"
    drv.write_text(
        textwrap.dedent(
            """
            import numpy as np
            import simpler as sp

            K = sp.Kernel(lambda x, y: np.copyto(y, x), [sp.IN, sp.OUT])
            C = sp.Callable(lambda o, x, y: o.submit(K, x, y), [sp.IN, sp.OUT], name="copy")

            def bench(opts):
                for arm in ("Residency_staged", "Residency_bulk"):
                    with sp.Worker(opts.platform) as w:
                        for _ in range(opts.rounds):
                            yield "toy", arm, w.run(C, [np.ones(8, np.float32), np.zeros(8, np.float32)])
            """
        )
    )
    assert cli.main(["bench", f"{drv}:bench", "--rounds", "2"]) == 0
    text = capsys.readouterr().out
    assert ":: drv::toy (sim, 2 round(s)" in text
    assert "Residency_bulk / Residency_staged = " in text


def test_plot_needs_matplotlib_or_draws(bench_run, tmp_path, capsys):
    _, _, out = bench_run
    png = tmp_path / "p.png"
    if importlib.util.find_spec("matplotlib") is None:
        assert cli.main(["report", str(out), "--plot", str(png)]) == 2
        assert cli.main(["bench", "paged_attention", "--case", "Small1", "--plot", str(png)]) == 2
        assert capsys.readouterr().err.count("needs matplotlib") == 2
    else:
        assert cli.main(["report", str(out), "--plot", str(png)]) == 0
        assert png.stat().st_size > 0


def test_console_script_is_declared():
    (ep,) = entry_points(group="console_scripts", name="simpler")
    assert ep.value == "simpler.tools.cli:main"


def test_bench_help_shows_plain_metavars():
    status, out, _ = _run(["bench", "--help"])
    assert status == 0
    assert "--rounds N" in out and "--case CASE" in out and "SIMPLER_" not in out


def test_bench_prices_one_run_under_several_models_beside_the_measured_phases(tmp_path):
    """``--model ascend-a3 --model h200``: one measured run, a modeled column per model, every
    phase (and the dispatch path and the round) with the ratio measured / modeled."""
    out = tmp_path / "m.jsonl"
    stdout = io.StringIO()
    argv = ["bench", "paged_attention", "--rounds", "2", "--case", "Small1", "--skip-golden"]
    argv += ["--model", "ascend-a3", "--model", "h200", "--json", str(out)]
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(argv) == 0
    text = stdout.getvalue()
    assert "measured (sim) beside modeled" in text
    assert "ascend-a3" in text and "h200" in text
    assert "modeled dispatch ratios (ascend-a3)" in text and "modeled dispatch ratios (h200)" in text
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(recs) == 6
    for r in recs:
        assert list(r["modeled_by"]) == ["ascend-a3", "h200"]
        assert r["modeled"] == r["modeled_by"]["ascend-a3"]
        assert r["modeled_round_ns"] == sum(r["modeled"].values())
        assert {k["kernel"] for k in r["kernels"]} == {
            "qk",
            "block_softmax",
            "pv",
            "online_update",
            "normalize",
        }
        assert all(k["declared"] for k in r["kernels"])
    rows = report.model_comparison(recs)
    assert {(x["arm"], x["row"]) for x in rows} == {(a, p) for a in ARMS for p in report.MODEL_ROWS}
    # Every arm's round has a ratio under both models (the ratio's arithmetic is checked on
    # exact records below).
    for x in rows:
        if x["row"] == "round":
            assert all(x["ratio"][m] > 0 for m in ("ascend-a3", "h200"))


def test_the_device_check_compares_the_device_with_its_platforms_model_only(tmp_path):
    """The device check prices the case under the model of the device's platform (h200 on cuda,
    ascend-a3 on ascend) in 2 rounds; a cuda measurement is never compared with ascend-a3."""
    from simpler.tools import device_check as dc

    opts = BenchOptions(workload="paged_attention", rounds=2, cases=["Small1"], skip_golden=True)
    measured, failures = bench_records(opts, progress=False)
    assert not failures
    assert dc.MODEL_ROUNDS == 2
    with contextlib.redirect_stdout(io.StringIO()):
        for platform, model in (("cuda", "h200"), ("ascend", "ascend-a3")):
            figures = dc._model_error(dc.Context(platform, True, False, tmp_path), "Small1", measured)
            assert figures and {k.rsplit(".", 1)[1] for k in figures} == {model}
        assert dc._model_error(dc.Context("sim", True, False, tmp_path), "Small1", measured) == {}


def test_the_model_error_compares_one_run_measured_with_another_priced():
    """The device check's comparison: the measured side from one set of records (the device),
    the modeled side from another (the same case priced on sim), matched by case and arm."""

    def rec(rnd, phases, modeled_by=None):
        r = {"workload": "w", "test": "T", "case": "C", "arm": "Residency_bulk", "round": rnd}
        r["phases"] = phases
        if modeled_by is not None:
            r["modeled_by"] = modeled_by
        return r

    ph = dict.fromkeys(cli.PHASES, 0)
    measured = [rec(1, {**ph, "execute": 9_000}), rec(2, {**ph, "execute": 3_000, "bind": 100})]
    modeled = [rec(i, ph, {"h200": {**ph, "execute": 1_000, "bind": 50}}) for i in (1, 2)]
    rows = {x["row"]: x for x in report.model_comparison(measured, modeled)}
    assert rows["execute"]["measured_ns"] == 3_000  # the warm round
    assert rows["execute"]["ratio"] == {"h200": 3.0}
    assert rows["bind"]["ratio"] == {"h200": 2.0}
    assert rows["round"]["measured_ns"] == 3_100 and rows["round"]["modeled_ns"] == {"h200": 1_050}
    assert rows["cleanup"]["ratio"] == {"h200": None}
    text = report.format_model_comparison(measured, modeled, measured_on="cuda")
    assert "measured (cuda) beside modeled" in text and "3x" in text
    assert report.model_comparison(measured) == []  # nothing modeled: no rows


_GOLDEN_FILE = """
import numpy as np
import simpler as sp


def _add(a, b, out):
    out[...] = a + b


ADD = sp.Kernel(_add, [sp.IN, sp.IN, sp.OUT])
CALL = sp.Callable(lambda o, a, b, out: o.submit(ADD, a, b, out), signature=[sp.IN, sp.IN, sp.OUT])


def _args(params):
    return sp.TaskArgsBuilder(
        sp.TensorArg("a", np.ones(8, np.float32)),
        sp.TensorArg("b", np.ones(8, np.float32)),
        sp.TensorArg("out", np.zeros(8, np.float32)),
    )


def _golden(args):
    args.out[...] = args.a + args.b


@sp.scene_test(level=2)
class TestByCase(sp.SceneTestCase):
    CALLABLE = CALL
    SPLIT = {"a": 0, "b": 0, "out": 0}
    CASES = [
        {"name": "C_Residency_staged", "params": {}},
        {"name": "C_Residency_bulk", "params": {}, "skip_golden": True},
    ]

    def generate_args(self, params):
        return _args(params)

    def compute_golden(self, args, params):
        _golden(args)


@sp.scene_test(level=2)
class TestByClass(sp.SceneTestCase):
    CALLABLE = CALL
    SKIP_GOLDEN = True
    CASES = [{"name": "D_Residency_staged", "params": {}}]

    def generate_args(self, params):
        return _args(params)

    def compute_golden(self, args, params):
        _golden(args)
"""


def test_bench_says_which_arms_were_compared_with_the_golden(tmp_path, capsys):
    """A case that skips its golden (``"skip_golden": True``) or a class that does
    (``SKIP_GOLDEN``) is not "golden checked": the records say whether each round was compared
    and who skipped it, and the tables (one device and several) say which arms were compared."""
    f = tmp_path / "test_golden_skips.py"
    f.write_text(_GOLDEN_FILE)
    out = tmp_path / "g.jsonl"
    argv = ["bench", str(f), "--rounds", "2", "--devices", "2", "--json", str(out), "--case", "C"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    text = capsys.readouterr().out
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    assert {(r["arm"], r["devices"], r["golden"], r["golden_skipped_by"]) for r in recs} == {
        ("Residency_staged", 1, True, None),
        ("Residency_bulk", 1, False, "case"),
        ("Residency_staged", 2, True, None),
        ("Residency_bulk", 2, False, "case"),
    }
    mixed = "golden checked for Residency_staged; skipped (by the case) for Residency_bulk"
    assert f"TestByCase::C (sim, 2 round(s), {mixed}) ==" in text, text
    assert f"TestByCase::C on 2 devices (sim, 2 round(s), {mixed}) ==" in text, text
    assert "golden checked)" not in text

    assert cli.main(["bench", str(f), "--rounds", "1", "--json", str(out), "--case", "D"]) == 0
    text = capsys.readouterr().out
    assert "TestByClass::D (sim, 1 round(s), golden skipped (by the class)) ==" in text, text
    assert [(r["golden"], r["golden_skipped_by"]) for r in map(json.loads, out.read_text().splitlines())] == [
        (False, "class")
    ]

    assert cli.main(["bench", str(f), "--rounds", "1", "--case", "C", "--skip-golden"]) == 0
    text = capsys.readouterr().out
    assert "TestByCase::C (sim, 1 round(s), golden skipped (by --skip-golden)) ==" in text, text


def test_bench_devices_far_beyond_the_split_fails_at_once(tmp_path):
    """``--devices N`` with N far beyond what the case's SPLIT cuts into is refused before any
    per-device argument builder is made: a clear error at once, not N builders until the
    machine runs out of memory (the bench runs under a 2 GiB address-space limit here)."""
    import resource

    f = tmp_path / "test_golden_skips.py"
    f.write_text(_GOLDEN_FILE)

    def limit():
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    argv = ["bench", str(f), "--rounds", "1", "--case", "C_Residency_staged", "--devices", str(10**9)]
    p = subprocess.run(
        [sys.executable, "-m", "simpler", *argv],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        preexec_fn=limit,
        env={**os.environ, "OPENBLAS_NUM_THREADS": "1"},
        timeout=300,
    )
    assert p.returncode == 1, p.stderr
    assert "MemoryError" not in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert (
        "FAILED TestByCase::C_Residency_staged on 1000000000 devices: ArgumentError: TestByCase: cannot "
        "split 'a' of shape (8,) along axis 0 over 1000000000 devices (8 along it" in p.stderr
    ), p.stderr


_GROUP_RECORD = {
    "workload": "w",
    "test": "T",
    "case": "C",
    "arm": "Residency_staged",
    "round": 1,
    "rounds": 1,
    "platform": "sim",
    "phases": {"bind": 10, "orchestrate": 10, "execute": 10, "copy_back": 10, "cleanup": 10},
    "counters": {"staged_bytes": 8},
    "dispatch_ns": 40,
    "bytes_moved": 8,
    "devices": 2,
    "device": 0,
    "device_index": 0,
    "round_wall_ns": 100,
}


@pytest.mark.parametrize(
    ("field", "text", "message"),
    [
        ("dispatch_ns", "NaN", "NaN: a bench record holds finite numbers"),
        ("round_wall_ns", "Infinity", "Infinity: a bench record holds finite numbers"),
        ("bytes_moved", "-Infinity", "-Infinity: a bench record holds finite numbers"),
        ("round", "NaN", "NaN: a bench record holds finite numbers"),
        ("round_wall_ns", "1e999", "1e999: a bench record holds finite numbers"),
        ("round_wall_ns", "1" * 5000, "is past 2**64"),
        ("device", "[0, 1]", "'device' must be a device id (an int), not list [0, 1]"),
        ("device", '{"id": 0}', "'device' must be a device id (an int), not dict"),
        ("device", "1.5", "'device' must be a device id (an int), not float"),
        ("modeled_by", '{"h200": {"bind": "x"}}', "'modeled_by' must map models to phases and numbers"),
    ],
)
def test_report_on_group_records_with_bad_numbers_or_ids_is_a_usage_error(
    tmp_path, capsys, field, text, message
):
    """Group records (one per device) whose numbers are NaN or infinite, or whose device id is not
    an int, are a one-line usage error naming the file, the line and the problem: never a
    traceback (as a good record of the same shape prints its tables)."""
    good = dict(_GROUP_RECORD)
    second = {**good, "device": 1, "device_index": 1}
    path = tmp_path / "g.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps(second) + "\n")
    assert cli.main(["report", str(path)]) == 0
    assert "T::C on 2 devices" in capsys.readouterr().out
    bad = json.dumps({**second, field: "@@"}).replace('"@@"', text)
    path.write_text(json.dumps(good) + "\n" + bad + "\n")
    assert cli.main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"simpler: error: {path}:2: not a bench record (") and message in err, err
    assert len(err.strip().splitlines()) == 1, err


def test_bench_without_a_workload_runs_the_unrolled_graphs_bench_cases_priced(monkeypatch):
    """``simpler bench`` alone runs the unrolled paged attention's ``BENCH_CASES`` (Case1 and Case2;
    here one small case stands in for them) under its ``BENCH_MODELS``, and its tables set the
    chip.run ratios upstream published beside the modeled round's, with why they differ."""
    from simpler.workloads import DEFAULT_WORKLOAD
    from simpler.workloads import paged_attention_unroll as pu

    assert DEFAULT_WORKLOAD == "paged_attention_unroll" and pu.BENCH_CASES == ("Case1", "Case2")
    monkeypatch.setattr(pu, "BENCH_CASES", ("CaseSmall1",))
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        assert cli.main(["bench", "--rounds", "2"]) == 0
    text = stdout.getvalue()
    assert (
        "== paged_attention_unroll :: PagedAttentionUnroll::CaseSmall1 (sim, 2 round(s), golden checked)"
        in text
    )
    assert "CaseVarSeq4" not in text  # the bench cases only
    assert "its ratios: Residency_bulk / Residency_staged = 0.589-0.691" in text
    assert "Residency_all / Residency_bulk = 0.814-1.000" in text
    for model in pu.BENCH_MODELS:
        assert f"modeled round ratios ({model}; round = dispatch + execute)" in text
    assert text.count("    why: our staged arm uploads") == 2
    assert "tasks per round: 4 in 4 submit(s), every arm" in text  # one group of 3 blocks
    assert "one allocation task per sequence (Case1: 1,024 + 256, Case2: 512 + 64)" in text


def test_published_arms_without_a_model_say_how_to_get_the_modeled_ratios():
    recs = [
        {
            "workload": "w",
            "test": "T",
            "case": "C",
            "arm": arm,
            "round": i + 1,
            "callable": "paged_attention_unroll",
            "phases": {p: 1000 for p in ("bind", "orchestrate", "execute", "copy_back", "cleanup")},
            "counters": {},
        }
        for arm in ARMS
        for i in range(2)
    ]
    lines = report.published_lines(report._group(recs)[("w", "T", "C")])
    assert len(lines) == 3 and "--model ascend-a3" in lines[-1]
    recs = [dict(r, callable="other") for r in recs]
    assert report.published_lines(report._group(recs)[("w", "T", "C")]) == []
