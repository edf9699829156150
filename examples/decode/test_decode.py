"""Tests of the decode driver (``decode.py``): golden, exact counters, streaming host memory.

They run on the platform the simpler pytest plugin was given (``pytest examples --simpler-platform sim``
or ``--simpler-platform ascend`` against the fake vendor library), with its ``--svm`` option on sim.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from decode import DecodeConfig, fixtures, golden_decode, main, run_decode

import simpler as sp
from simpler.testing import runner

SMALL = DecodeConfig(layers=2, hidden=32, heads=4, kv_heads=2, ffn=64)


@pytest.fixture
def platform(request: pytest.FixtureRequest) -> str:
    return request.config.getoption("simpler_platform", "sim")


@pytest.fixture
def worker_options(request: pytest.FixtureRequest) -> dict:
    return runner.worker_options(
        request.config.getoption("simpler_svm", None), request.config.getoption("simpler_staging", None)
    )


@pytest.mark.parametrize("rounds", [1, 3])
@pytest.mark.parametrize("mode", ["resident", "staged"])
def test_decode_passes_golden_with_exact_counters(mode, rounds, platform, worker_options):
    r = run_decode(SMALL, mode, rounds, platform, worker_options=worker_options, progress=rounds > 1)
    assert r.golden_ok, r.golden_errors
    assert r.final_pos == rounds  # the orchestration advanced the control tensor once per step
    assert len(r.reports) == rounds
    fxs = fixtures(SMALL, SMALL.seq(rounds))
    total = sum(f.nbytes for f in fxs)
    token = SMALL.hidden * 4  # the staged input embedding (IN) and output hidden state (OUT)
    inout = sum(f.nbytes for f in fxs if f.direction is sp.INOUT)
    for rep in r.reports:
        c = rep.counters
        assert c["tasks"] == 7 * SMALL.layers + 1  # 7 per layer and the final norm
        assert c["scratch_tensors"] == 8 * SMALL.layers
        if mode == "resident":
            # weights, KV caches and pos are passed through; only the token moves
            assert (c["staged_tensors"], c["staged_bytes"], c["copied_back_bytes"]) == (2, token, token)
            assert c["resident_tensors"] == len(fxs)
        else:
            assert (c["staged_tensors"], c["staged_bytes"]) == (len(fxs) + 2, total + token)
            assert c["copied_back_bytes"] == inout + token
    # warm steps allocate nothing (staging arena and scratch pool retained); with
    # `--staging fresh` every staged tensor is allocated and freed per step instead
    staged_per_step = r.reports[-1].counters["staged_tensors"]
    fresh = worker_options.get("staging") == "fresh"
    for rep in r.reports[1:]:
        expect = staged_per_step if fresh else 0
        assert (rep.counters["device_mallocs"], rep.counters["device_frees"]) == (expect, expect)
    if mode == "resident":
        # every fixture (weights, caches, pos) uploaded exactly once, at set-up
        assert r.h2d_setup_bytes == total
        assert r.weight_h2d_during_steps == 0
        if platform == "sim":  # elsewhere kernels run over host copies (outputs go back H2D)
            pos_pushes = 4 * rounds if r.pos_view == "mirror" else 0  # set_tensor_data through a mirror
            assert r.h2d_step_bytes == rounds * token + pos_pushes
            assert r.h2d_step_bytes < r.weight_bytes
    else:
        assert r.h2d_setup_bytes == 0
        assert r.h2d_step_bytes >= rounds * (total + token)


@pytest.mark.parametrize("wait", [True, False], ids=["wait", "pending"])
def test_device_mode_stages_nothing_and_a_pending_step_gives_the_same_bits(wait, platform, worker_options):
    """Every argument resident (the token embeddings and outputs as tables): no staged byte, no
    copy back, no device malloc on a warm step but a launch plan's rows; on cuda each step is 15
    native launches (and, with ``wait=False``, each step left pending until the next one's
    execute); the same bits either way, and the golden holds."""
    rounds = 3
    r = run_decode(SMALL, "device", rounds, platform, worker_options=worker_options, wait=wait)
    assert r.golden_ok, r.golden_errors
    assert r.final_pos == rounds and len(r.reports) == rounds
    launches = 7 * SMALL.layers + 1 if platform == "cuda" else 0
    for rep in r.reports:
        c = rep.counters
        assert (c["staged_tensors"], c["staged_bytes"], c["copied_back_bytes"]) == (0, 0, 0)
        assert c["device_launches"] == launches
    # A warm step allocates nothing but, on cuda, the task-row region its new launch plan keeps
    # (each step's tasks differ: the cache position moves; a worker keeps four plans).
    regions = 1 if platform == "cuda" else 0
    assert [rep.counters["device_mallocs"] for rep in r.reports[1:]] == [regions] * (rounds - 1)
    ref = run_decode(SMALL, "resident", rounds, platform, worker_options=worker_options, skip_golden=True)
    np.testing.assert_array_equal(r.out, ref.out)
    np.testing.assert_array_equal(r.k_cache, ref.k_cache)


def test_command_line_compares_waiting_and_overlapping_steps(platform, capsys):
    argv = ["--mode", "overlap", "--rounds", "2", "--repeats", "1", "--layers", "1", "--hidden", "32"]
    assert main([*argv, "-p", platform]) == 0
    out = capsys.readouterr().out
    assert "leaves each step pending" in out and "bit-identical" in out


def test_streaming_upload_peak_host_memory_is_about_one_fixture(platform, worker_options):
    cfg = DecodeConfig(layers=4, hidden=128, heads=4, kv_heads=2, ffn=512)
    r = run_decode(cfg, "resident", 1, platform, worker_options=worker_options)
    s = run_decode(cfg, "staged", 1, platform, worker_options=worker_options, skip_golden=True)
    assert r.golden_ok and s.golden_ok is None
    assert len(r.fixture_bytes) == 3 + 9 * cfg.layers + 1
    assert r.sum_fixtures > 10 * r.largest_fixture
    # each host copy is dropped right after its upload ...
    assert r.largest_fixture <= r.upload_peak_bytes < 1.5 * r.largest_fixture
    assert r.upload_peak_bytes < r.sum_fixtures / 4
    # ... while host staging keeps every fixture alive for the whole run
    assert s.upload_peak_bytes >= s.sum_fixtures


def test_resident_and_staged_agree_bit_for_bit(platform, worker_options):
    a = run_decode(SMALL, "resident", 3, platform, worker_options=worker_options, skip_golden=True)
    b = run_decode(SMALL, "staged", 3, platform, worker_options=worker_options, skip_golden=True)
    for name in ("out", "k_cache", "v_cache"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_golden_detects_a_different_model(platform, worker_options):
    r = run_decode(SMALL, "resident", 2, platform, worker_options=worker_options)
    other = dataclasses.replace(SMALL, seed=1)
    g_out, _, _ = golden_decode(other, 2)
    assert r.golden_ok and not np.allclose(r.out, g_out, rtol=1e-3, atol=1e-3)


def test_cache_overrun_is_refused(platform):
    cfg = DecodeConfig(layers=1, hidden=16, heads=2, kv_heads=1, ffn=16, max_seq=2)
    with pytest.raises(ValueError, match="do not fit"):
        run_decode(cfg, "resident", 3, platform)


def test_command_line_compares_both_modes(platform, capsys):
    argv = ["--mode", "both", "--rounds", "2", "--layers", "1", "--hidden", "32", "-p", platform]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "[resident] 2 tokens" in out and "[staged] 2 tokens" in out
    assert out.count("golden: PASS") == 2 and "resident vs staged" in out
