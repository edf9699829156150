"""The ``simpler`` command: ``bench`` on the small paged-attention case (three arms, ratios,
JSON lines with the documented keys), ``report`` re-reading them, the workload registry and
driver hook, and ``--plot``."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import textwrap
from importlib.metadata import entry_points

import pytest

from simpler import cli

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
    "callable",
    "ok",
    "phases",
    "counters",
    "dispatch_ns",
    "bytes_moved",
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
    assert "TestPagedAttention::Small1 (sim, 2 round(s), golden checked)" in text
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


def test_report_rejects_a_non_json_file(tmp_path):
    bad = tmp_path / "x.jsonl"
    bad.write_text("{not json}\n")
    with pytest.raises(SystemExit, match="not JSON"):
        cli.main(["report", str(bad)])


def test_unknown_workload_is_a_clear_error():
    with pytest.raises(SystemExit, match="no such workload file: nope"):
        cli.main(["bench", "nope", "--rounds", "1"])


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
        with pytest.raises(SystemExit, match="needs matplotlib"):
            cli.main(["report", str(out), "--plot", str(png)])
        assert cli.main(["bench", "paged_attention", "--case", "Small1", "--plot", str(png)]) == 2
        assert "needs matplotlib" in capsys.readouterr().err
    else:
        assert cli.main(["report", str(out), "--plot", str(png)]) == 0
        assert png.stat().st_size > 0


def test_console_script_is_declared():
    (ep,) = entry_points(group="console_scripts", name="simpler")
    assert ep.value == "simpler.cli:main"
