"""A streaming decode driver for a small Qwen-like model, one ``w.run`` per generated token.

Each step runs one callable whose orchestration reads the decode position ``t`` from a resident
int32 control tensor (``pos``, through a host view: ``get_tensor_data``), submits per layer

    RMSNorm -> QKV projection (V written into the cache at t) -> RoPE (K written into the cache at t)
    -> attention over cache positions 0..t -> output projection + residual
    -> RMSNorm -> SiLU-gated MLP + residual

then a final RMSNorm into ``out``, and advances ``pos`` to ``t + 1`` (``set_tensor_data``).
Intermediates are run-scoped ``orch.scratch`` tensors; the KV cache is reached through views
(``[1, 1, kv_heads, head_dim]`` at ``t`` for the write, ``[1, t + 1, kv_heads, head_dim]`` for the
read). The model is vocab-free: step ``t`` feeds a token embedding drawn from a seeded RNG.

``--mode resident``: every weight is generated on its own (seeded), uploaded into a
``ResidentTaskArgs`` and dropped at once, so peak host memory while uploading is about one fixture,
not the sum of all of them; the KV caches and ``pos`` are resident INOUT. Only the token
embedding (IN) and the output hidden state (OUT) are host-staged each step.
``--mode staged``: the same driver with every argument host-staged on every step.

Run ``python examples/decode/decode.py --help``; the logic is importable (:func:`run_decode`).
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
import tracemalloc
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

if __name__ == "__main__":
    # The kernels are matrix-vector products: BLAS threads add no speed there, only jitter of up
    # to 100x on a small or shared machine (measured with 2 cores). Set the variable to override.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np

import simpler as sp
from simpler.args import BuiltArgs
from simpler.testing import runner

# -- the model ------------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeConfig:
    """Model shape. ``max_seq`` (the KV cache length) defaults to the number of steps."""

    layers: int = 2
    hidden: int = 64
    heads: int = 4
    kv_heads: int = 2
    ffn: int = 128
    max_seq: int | None = None
    rope_theta: float = 1e6
    eps: float = 1e-6
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "ffn"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.hidden % self.heads:
            raise ValueError(f"hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim ({self.head_dim}) must be even for RoPE")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def seq(self, rounds: int) -> int:
        """The KV cache length for a run of ``rounds`` steps."""
        return self.max_seq if self.max_seq is not None else max(rounds, 1)


@dataclass(frozen=True)
class Fixture:
    """One device argument of the callable, generated on its own from ``(seed, index)``."""

    name: str
    shape: tuple[int, ...]
    dtype: str
    direction: sp.ArgDirection
    kind: str  # "norm" | "linear" | "zeros"
    index: int

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


LAYER_WEIGHTS = ("attn_norm", "wq", "wk", "wv", "wo", "mlp_norm", "w_gate", "w_up", "w_down")


def fixtures(cfg: DecodeConfig, seq: int) -> list[Fixture]:
    """The resident-capable arguments, in signature order (after ``x`` and ``out``)."""
    h, d, f = cfg.hidden, cfg.head_dim, cfg.ffn
    q, kv = cfg.heads * d, cfg.kv_heads * d
    shapes = {
        "attn_norm": ((h,), "norm"),
        "wq": ((h, q), "linear"),
        "wk": ((h, kv), "linear"),
        "wv": ((h, kv), "linear"),
        "wo": ((q, h), "linear"),
        "mlp_norm": ((h,), "norm"),
        "w_gate": ((h, f), "linear"),
        "w_up": ((h, f), "linear"),
        "w_down": ((f, h), "linear"),
    }
    cache = (cfg.layers, seq, cfg.kv_heads, d)
    out = [
        Fixture("pos", (1,), "int32", sp.INOUT, "zeros", 0),
        Fixture("k_cache", cache, "float32", sp.INOUT, "zeros", 1),
        Fixture("v_cache", cache, "float32", sp.INOUT, "zeros", 2),
    ]
    for layer in range(cfg.layers):
        for w in LAYER_WEIGHTS:
            shape, kind = shapes[w]
            out.append(Fixture(f"l{layer}_{w}", shape, "float32", sp.IN, kind, len(out)))
    out.append(Fixture("final_norm", (h,), "float32", sp.IN, "norm", len(out)))
    return out


def generate(cfg: DecodeConfig, fx: Fixture) -> np.ndarray:
    """The host array of ``fx``: a fresh allocation, the same bytes for the same seed."""
    if fx.kind == "zeros":
        return np.zeros(fx.shape, fx.dtype)
    rng = np.random.default_rng([cfg.seed, fx.index])
    a = rng.standard_normal(fx.shape, dtype=np.float32)
    if fx.kind == "norm":
        a *= 0.1
        a += 1.0
    else:
        a *= 1.0 / math.sqrt(fx.shape[0])
    return a


def token_embedding(cfg: DecodeConfig, t: int) -> np.ndarray:
    """The input hidden state of step ``t`` ([1, hidden] float32)."""
    rng = np.random.default_rng([cfg.seed, 1 << 20, t])
    return rng.standard_normal((1, cfg.hidden), dtype=np.float32)


def rope_tables(head_dim: int, t: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """cos and sin of position ``t`` for the rotate-half RoPE ([head_dim // 2] float32 each)."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = t * inv_freq
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


# -- kernels (numpy over the task's arrays; on sim they view device memory) -----------------


def _rmsnorm(x, w, y, eps):
    ms = np.mean(x * x, axis=-1, keepdims=True, dtype=np.float32)
    y[...] = x / np.sqrt(ms + np.float32(eps)) * w


def _qkv(h, wq, wk, wv, q, k, v_slot):
    q[...] = (h @ wq).reshape(q.shape)
    k[...] = (h @ wk).reshape(k.shape)
    v_slot[...] = (h @ wv).reshape(v_slot.shape)


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return np.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)


def _rope(q, k, q_rot, k_slot, t, theta):
    cos, sin = rope_tables(q.shape[-1], t, theta)
    q_rot[...] = _rotate(q, cos, sin)
    k_slot[...] = _rotate(k, cos, sin).reshape(k_slot.shape)


def _attention(q, k_hist, v_hist, attn, scale):
    nkv, d = k_hist.shape[2], k_hist.shape[3]
    k = k_hist.reshape(-1, nkv, d)  # [t + 1, nkv, d]
    v = v_hist.reshape(-1, nkv, d)
    qg = q.reshape(nkv, -1, d)  # [nkv, group, d]
    s = np.einsum("kgd,skd->kgs", qg, k) * np.float32(scale)
    s -= s.max(axis=-1, keepdims=True)
    p = np.exp(s)
    p /= p.sum(axis=-1, keepdims=True)
    attn[...] = np.einsum("kgs,skd->kgd", p, v).reshape(attn.shape)


def _o_proj(attn, wo, resid, y):
    y[...] = resid + attn @ wo


def _mlp(h, w_gate, w_up, w_down, resid, y):
    g = h @ w_gate
    y[...] = resid + ((g / (1.0 + np.exp(-g))) * (h @ w_up)) @ w_down


IN, OUT, INOUT = sp.IN, sp.OUT, sp.INOUT
RMSNORM = sp.Kernel(_rmsnorm, [IN, IN, OUT], name="rmsnorm")
QKV = sp.Kernel(_qkv, [IN, IN, IN, IN, OUT, OUT, OUT], name="qkv")
ROPE = sp.Kernel(_rope, [IN, IN, OUT, OUT], name="rope")
ATTENTION = sp.Kernel(_attention, [IN, IN, IN, OUT], name="attention")
O_PROJ = sp.Kernel(_o_proj, [IN, IN, IN, OUT], name="o_proj")
MLP = sp.Kernel(_mlp, [IN, IN, IN, IN, IN, OUT], name="mlp")
HOST_KERNELS = {k.name: k for k in (RMSNORM, QKV, ROPE, ATTENTION, O_PROJ, MLP)}

#: The numpy function of each kernel (the fake libcuda's stand-ins for the device code call them).
KERNEL_FNS = {
    "rmsnorm": _rmsnorm,
    "qkv": _qkv,
    "rope": _rope,
    "attention": _attention,
    "o_proj": _o_proj,
    "mlp": _mlp,
}


def device_kernels() -> dict[str, sp.Kernel]:
    """The same kernels with device code (``decode_cuda.py``): native launches on cuda (on the
    fake libcuda, through the numpy functions), the numpy functions on sim and ascend."""
    import decode_cuda  # beside this file

    return {
        name: sp.Kernel(KERNEL_FNS[name], [d for d, _ in k.signature], name=name, cuda=decode_cuda.CODE[name])
        for name, k in HOST_KERNELS.items()
    }


def make_callable(cfg: DecodeConfig, seq: int, device: bool = False) -> sp.Callable:
    """The per-token device program: ``(x, out, pos, k_cache, v_cache, *weights)``. With
    ``device``, the kernels carry device code and ``x`` / ``out`` are ``[seq, hidden]`` tables
    (every step's token embedding, every step's output) that step ``t`` views row ``t`` of, so
    every argument can be resident."""
    fxs = fixtures(cfg, seq)
    nh, nkv, d, h = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden
    scale = 1.0 / math.sqrt(d)
    k_ = device_kernels() if device else HOST_KERNELS
    RMSNORM, QKV, ROPE, ATTENTION, O_PROJ, MLP = (
        k_[n] for n in ("rmsnorm", "qkv", "rope", "attention", "o_proj", "mlp")
    )

    def decode_step(o: sp.Orchestrator, x, out, pos, k_cache, v_cache, *weights):
        t = int(o.get_tensor_data(pos, 0))  # a host view of the resident control tensor
        if not 0 <= t < seq:
            raise ValueError(f"decode position {t} is outside the KV cache (0..{seq - 1})")
        if device:
            x, out = x.view([1, h], [t, 0]), out.view([1, h], [t, 0])
        per = len(LAYER_WEIGHTS)
        for layer in range(cfg.layers):
            an, wq, wk, wv, wo, mn, wg, wu, wdn = weights[layer * per : (layer + 1) * per]
            k_slot = k_cache.view([1, 1, nkv, d], [layer, t, 0, 0])
            v_slot = v_cache.view([1, 1, nkv, d], [layer, t, 0, 0])
            k_hist = k_cache.view([1, t + 1, nkv, d], [layer, 0, 0, 0])
            v_hist = v_cache.view([1, t + 1, nkv, d], [layer, 0, 0, 0])
            hn = o.scratch([1, h], "float32", name=f"l{layer}_h")
            q = o.scratch([nh, d], "float32", name=f"l{layer}_q")
            k = o.scratch([nkv, d], "float32", name=f"l{layer}_k")
            q_rot = o.scratch([nh, d], "float32", name=f"l{layer}_q_rot")
            attn = o.scratch([1, nh * d], "float32", name=f"l{layer}_attn")
            y = o.scratch([1, h], "float32", name=f"l{layer}_y")
            h2 = o.scratch([1, h], "float32", name=f"l{layer}_h2")
            x_next = o.scratch([1, h], "float32", name=f"l{layer}_x")
            o.submit(RMSNORM, x, an, hn, cfg.eps)
            o.submit(QKV, hn, wq, wk, wv, q, k, v_slot)
            o.submit(ROPE, q, k, q_rot, k_slot, t, cfg.rope_theta)
            o.submit(ATTENTION, q_rot, k_hist, v_hist, attn, scale)
            o.submit(O_PROJ, attn, wo, x, y)
            o.submit(RMSNORM, y, mn, h2, cfg.eps)
            o.submit(MLP, h2, wg, wu, wdn, y, x_next)
            x = x_next
        o.submit(RMSNORM, x, weights[-1], out, cfg.eps)
        o.set_tensor_data(pos, 0, t + 1)  # no task touches pos: the step advances it itself

    sig = [IN, OUT] + [f.direction for f in fxs]
    return sp.Callable(decode_step, sig, name="decode_step")


# -- the numpy golden -----------------------------------------------------------------------


def golden_decode(cfg: DecodeConfig, rounds: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The same model in plain numpy float32 with its own weights (regenerated from the seeds)
    and its own KV cache: returns (final output [1, hidden], k_cache, v_cache)."""
    seq = cfg.seq(rounds)
    fx = {f.name: f for f in fixtures(cfg, seq)}
    wts = {n: generate(cfg, f) for n, f in fx.items() if f.kind != "zeros"}
    k_cache = np.zeros(fx["k_cache"].shape, np.float32)
    v_cache = np.zeros(fx["v_cache"].shape, np.float32)
    nh, nkv, d = cfg.heads, cfg.kv_heads, cfg.head_dim
    group = nh // nkv

    def norm(x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + np.float32(cfg.eps)) * w

    out = np.zeros((1, cfg.hidden), np.float32)
    for t in range(rounds):
        x = token_embedding(cfg, t)
        cos, sin = rope_tables(d, t, cfg.rope_theta)
        for layer in range(cfg.layers):
            w = {n: wts[f"l{layer}_{n}"] for n in LAYER_WEIGHTS}
            hn = norm(x, w["attn_norm"])
            q = _rotate((hn @ w["wq"]).reshape(nh, d), cos, sin)
            k_cache[layer, t] = _rotate((hn @ w["wk"]).reshape(nkv, d), cos, sin)
            v_cache[layer, t] = (hn @ w["wv"]).reshape(nkv, d)
            heads = []
            for head in range(nh):
                kh = k_cache[layer, : t + 1, head // group]  # [t + 1, d]
                vh = v_cache[layer, : t + 1, head // group]
                s = (kh @ q[head]) / np.float32(math.sqrt(d))
                p = np.exp(s - s.max())
                heads.append((p / p.sum()) @ vh)
            x = x + np.concatenate(heads)[None, :] @ w["wo"]
            h2 = norm(x, w["mlp_norm"])
            g = h2 @ w["w_gate"]
            x = x + (g / (1.0 + np.exp(-g)) * (h2 @ w["w_up"])) @ w["w_down"]
        out = norm(x, wts["final_norm"]).astype(np.float32)
    return out, k_cache, v_cache


# -- the driver -----------------------------------------------------------------------------


@dataclass
class DecodeResult:
    """What one decode run measured."""

    mode: str
    platform: str
    rounds: int
    config: DecodeConfig
    step_s: list[float]  # wall time of each w.run
    reports: list[sp.RunReport]
    fixture_bytes: dict[str, int]  # every device argument but x/out
    weight_bytes: int  # the IN fixtures (the model weights)
    upload_peak_bytes: int  # tracemalloc peak during fixture generation (+ upload when resident)
    h2d_setup_bytes: int  # driver H2D during the streaming upload
    h2d_step_bytes: int  # driver H2D during the steps
    weight_h2d_during_steps: int  # H2D calls during the steps that hit a weight buffer (resident)
    pos_view: str | None  # "mapping" | "mirror" for the resident pos tensor
    final_pos: int
    out: np.ndarray
    k_cache: np.ndarray
    v_cache: np.ndarray
    golden_errors: dict[str, float] | None = None  # max abs error per compared tensor
    golden_ok: bool | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def run_s(self) -> float:
        """Total run time: the sum of the ``w.run`` wall times."""
        return sum(self.step_s)

    @property
    def tokens_per_s(self) -> float:
        """Steps / total run time (the cold first step included)."""
        return self.rounds / self.run_s if self.run_s > 0 else float("inf")

    @property
    def warm_tokens_per_s(self) -> float:
        """Steps / run time over the warm steps (every step after the first), if any."""
        warm = self.step_s[1:] or self.step_s
        return len(warm) / sum(warm) if sum(warm) > 0 else float("inf")

    @property
    def largest_fixture(self) -> int:
        return max(self.fixture_bytes.values())

    @property
    def sum_fixtures(self) -> int:
        return sum(self.fixture_bytes.values())

    def dispatch_us(self, warm: bool = True) -> float:
        """Median dispatch-path time (all phases but execute) per step, in microseconds;
        warm steps only (every step after the first) when there are any."""
        reps = self.reports[1:] if warm and len(self.reports) > 1 else self.reports
        return float(np.median([r.dispatch_ns for r in reps])) / 1e3

    def phase_us(self, phase: str) -> float:
        reps = self.reports[1:] if len(self.reports) > 1 else self.reports
        return float(np.median([r.phases[phase] for r in reps])) / 1e3

    def warm_mallocs(self) -> int:
        return sum(r.counters["device_mallocs"] for r in self.reports[1:])


def _progress(it: Iterable[int], total: int, enabled: bool, desc: str) -> Iterator[int]:
    if enabled:
        try:
            from tqdm import tqdm
        except ImportError:  # the bar is optional
            pass
        else:
            # disable=None: no bar when stderr is not a terminal (logs, CI)
            bar = tqdm(it, total=total, desc=desc, unit="tok", leave=False, file=sys.stderr, disable=None)
            yield from bar
            return
    yield from it


def _measure_upload(cfg: DecodeConfig, fxs: list[Fixture], sink) -> int:
    """Generates every fixture and hands it to ``sink(fx, array)``; returns the tracemalloc
    peak above the starting point (numpy reports its allocations to tracemalloc)."""
    # numpy.random loads lazily on first use (about 1 MiB of Python objects, kept): do that
    # before measuring, so the figure is the streaming itself.
    np.random.default_rng([cfg.seed, 0]).standard_normal(1, dtype=np.float32)
    started = not tracemalloc.is_tracing()
    if started:
        tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        for fx in fxs:
            arr = generate(cfg, fx)
            sink(fx, arr)
            del arr  # resident: the only reference; the next fixture reuses the memory
        return tracemalloc.get_traced_memory()[1] - base
    finally:
        if started:
            tracemalloc.stop()


def run_decode(
    cfg: DecodeConfig | None = None,
    mode: str = "resident",
    rounds: int = 8,
    platform: str = "sim",
    *,
    svm: str | int | None = None,
    skip_golden: bool = False,
    progress: bool = False,
    rtol: float = 1e-3,
    atol: float = 1e-3,
    worker_options: dict[str, Any] | None = None,
    wait: bool = True,
) -> DecodeResult:
    """Runs ``rounds`` decode steps (one token each) in ``mode``: "resident", "staged", or
    "device" (every argument resident, the token embeddings and the outputs as ``[seq,
    hidden]`` tables, and kernels with device code: on cuda the whole step runs on the device).
    With ``wait=False`` each step is left pending (``w.run(..., wait=False)``): the next step's
    bind and orchestration overlap the device's work on it."""
    cfg = cfg or DecodeConfig()
    if mode not in ("resident", "staged", "device"):
        raise ValueError(f"mode must be 'resident', 'staged' or 'device', not {mode!r}")
    if rounds < 1:
        raise ValueError("rounds must be >= 1")
    seq = cfg.seq(rounds)
    if rounds > seq:
        raise ValueError(f"{rounds} steps do not fit a KV cache of {seq} positions")
    fxs = fixtures(cfg, seq)
    device = mode == "device"
    call = make_callable(cfg, seq, device=device)
    opts = dict(worker_options or {})
    if svm is not None:
        opts["svm"] = svm
    if device and platform == "cuda":
        import decode_cuda  # beside this file

        from simpler.testing import fake_kernels

        decode_cuda.install_fakes(KERNEL_FNS)
        fake_kernels.install_if_fake()  # a GPU-less machine: the fake runs the launches
    with sp.Worker(platform, **opts) as w, sp.ResidentTaskArgs(w) as res:
        h2d0 = w.stats()["h2d_bytes"]
        host: dict[str, np.ndarray] = {}
        if device:
            res.add("x", np.stack([token_embedding(cfg, t) for t in range(seq)]).reshape(seq, -1), sp.IN)
            res.add("out", np.zeros((seq, cfg.hidden), np.float32), sp.OUT)
        if mode in ("resident", "device"):
            peak = _measure_upload(cfg, fxs, lambda fx, a: res.add(fx.name, a, fx.direction))
        else:
            peak = _measure_upload(cfg, fxs, lambda fx, a: host.__setitem__(fx.name, a))
        h2d1 = w.stats()["h2d_bytes"]
        if device:
            built = res.build_args(expected_count=len(fxs) + 2)
            dev = list(zip(built.names, built))
            weight_ranges = []
        elif mode == "resident":
            # Every fixture must be there, in signature order: a skipped one (an empty fixture a
            # driver forgot to add) would shift every later argument against the signature.
            built = res.build_args(expected_count=len(fxs))
            dev = list(zip(built.names, built))
            weight_ranges = [
                (t.buffer.ptr, t.buffer.ptr + t.buffer.nbytes)
                for fx, (_, t) in zip(fxs, dev)
                if fx.direction is sp.IN
            ]
        else:
            dev = [(fx.name, host[fx.name]) for fx in fxs]
            weight_ranges = []
        log_mark = len(w.call_log())
        reports: list[sp.RunReport] = []
        out = np.zeros((1, cfg.hidden), np.float32)
        step_s: list[float] = []
        pending = None
        for t in _progress(range(rounds), rounds, progress, f"decode {mode}"):
            if device:
                args = BuiltArgs(dev)
            else:
                args = BuiltArgs([("x", token_embedding(cfg, t)), ("out", out), *dev])
            t0 = time.perf_counter()
            if wait:
                reports.append(w.run(call, args))
            else:
                # This step's execute waited for the previous step: its report is ready.
                step = w.run(call, args, wait=False)
                if pending is not None:
                    reports.append(pending.wait())
                pending = step
            step_s.append(time.perf_counter() - t0)
        if pending is not None:
            # The last step's device work: its wait counts as the last step's time.
            t0 = time.perf_counter()
            reports.append(pending.wait())
            step_s[-1] += time.perf_counter() - t0
        h2d2 = w.stats()["h2d_bytes"]
        calls = w.call_log()[log_mark:]
        weight_hits = sum(
            1 for op, addr, *_ in calls if op == "h2d" and any(s <= addr < e for s, e in weight_ranges)
        )
        if mode in ("resident", "device"):
            inout = [fx for fx in fxs if fx.direction is sp.INOUT]
            back = sp.TaskArgsBuilder(*(sp.TensorArg(fx.name, np.empty(fx.shape, fx.dtype)) for fx in inout))
            res.copy_back(back, [fx.name for fx in inout])
            pos_view = w.host_view_info(res["pos"])
            k_cache, v_cache, pos = back.k_cache, back.v_cache, back.pos
            if device:
                rows = sp.TaskArgsBuilder(sp.TensorArg("out", np.empty((seq, cfg.hidden), np.float32)))
                res.copy_back(rows, "out")
                out[...] = rows.out[rounds - 1]
        else:
            pos_view = None
            k_cache, v_cache, pos = host["k_cache"], host["v_cache"], host["pos"]
    result = DecodeResult(
        mode=mode,
        platform=platform,
        rounds=rounds,
        config=cfg,
        step_s=step_s,
        reports=reports,
        fixture_bytes={fx.name: fx.nbytes for fx in fxs},
        weight_bytes=sum(fx.nbytes for fx in fxs if fx.direction is sp.IN),
        upload_peak_bytes=peak,
        h2d_setup_bytes=h2d1 - h2d0,
        h2d_step_bytes=h2d2 - h2d1,
        weight_h2d_during_steps=weight_hits,
        pos_view=pos_view,
        final_pos=int(pos[0]),
        out=out,
        k_cache=k_cache,
        v_cache=v_cache,
    )
    if not skip_golden:
        g_out, g_k, g_v = golden_decode(cfg, rounds)
        pairs = {"out": (out, g_out), "k_cache": (k_cache, g_k), "v_cache": (v_cache, g_v)}
        result.golden_errors = {n: float(np.max(np.abs(a - b))) for n, (a, b) in pairs.items()}
        result.golden_ok = result.final_pos == rounds and all(
            np.allclose(a, b, rtol=rtol, atol=atol) for a, b in pairs.values()
        )
    return result


# -- the command line -----------------------------------------------------------------------


def _mib(n: int) -> str:
    return f"{n / (1 << 20):.2f} MiB" if n >= 1 << 20 else f"{n / 1024:.1f} KiB"


def report_lines(r: DecodeResult) -> list[str]:
    """A human-readable summary of one run."""
    last = r.reports[-1].counters
    lines = [
        f"[{r.mode}] {r.rounds} tokens in {r.run_s * 1e3:.1f} ms: {r.tokens_per_s:.1f} tokens/s"
        f" ({r.warm_tokens_per_s:.1f} tokens/s over the warm steps)",
        f"  dispatch path per step (all phases but execute, median of warm steps): "
        f"{r.dispatch_us():.1f} us (cold step: {r.reports[0].dispatch_ns / 1e3:.1f} us); "
        f"execute {r.phase_us('execute'):.1f} us",
        f"  per step: staged {last['staged_bytes']} B H2D, {last['copied_back_bytes']} B copied back, "
        f"{last['tasks']} tasks, {last['scratch_tensors']} scratch tensors; "
        f"device mallocs on warm steps: {r.warm_mallocs()}",
        f"  host memory during the upload (tracemalloc peak): {_mib(r.upload_peak_bytes)}"
        f" = {r.upload_peak_bytes / r.largest_fixture:.2f}x the largest fixture ({_mib(r.largest_fixture)}),"
        f" {r.upload_peak_bytes / r.sum_fixtures:.2f}x the sum of {len(r.fixture_bytes)} fixtures"
        f" ({_mib(r.sum_fixtures)})",
        f"  driver H2D: {_mib(r.h2d_setup_bytes)} during the upload, "
        f"{_mib(r.h2d_step_bytes)} during the steps (weights {_mib(r.weight_bytes)})",
    ]
    if r.mode == "resident":
        lines.append(
            f"  pos control tensor: host view '{r.pos_view}', final value {r.final_pos}; "
            f"H2D calls into weight buffers during the steps: {r.weight_h2d_during_steps}"
        )
    if r.golden_errors is None:
        lines.append("  golden: skipped")
    else:
        errs = ", ".join(f"{k} {v:.2e}" for k, v in r.golden_errors.items())
        lines.append(f"  golden: {'PASS' if r.golden_ok else 'FAIL'} (max abs error: {errs})")
    return lines


def compare_overlap(
    cfg: DecodeConfig,
    rounds: int,
    platform: str,
    repeats: int = 3,
    *,
    svm: str | int | None = None,
    skip_golden: bool = False,
) -> int:
    """Tokens per second of the "device" mode with each step waited for and with each step left
    pending (the next step's bind and orchestration overlap the device's work), the two arms
    interleaved ``repeats`` times in this process; prints the medians and their ratio. Returns
    the exit status (1 when a golden check failed or the arms' outputs differ)."""
    arms: dict[bool, list[DecodeResult]] = {True: [], False: []}
    for i in range(repeats):
        for wait in (True, False) if i % 2 == 0 else (False, True):
            arms[wait].append(
                run_decode(cfg, "device", rounds, platform, svm=svm, skip_golden=skip_golden, wait=wait)
            )
    med = {w: float(np.median([r.tokens_per_s for r in rs])) for w, rs in arms.items()}
    for wait, label in ((True, "waits for each step"), (False, "leaves each step pending")):
        each = ", ".join(f"{r.tokens_per_s:.1f}" for r in arms[wait])
        print(f"[device, {label}] median {med[wait]:.1f} tokens/s over {repeats} runs ({each})")
    print(f"overlap vs wait: {med[False] / med[True]:.2f}x tokens/s ({rounds} tokens a run on {platform})")
    same = all(
        np.array_equal(a.out, b.out) and np.array_equal(a.k_cache, b.k_cache)
        for a, b in zip(arms[True], arms[False])
    )
    print(f"outputs of the two arms: {'bit-identical' if same else 'DIFFERENT'}")
    ok = same and all(r.golden_ok is not False for rs in arms.values() for r in rs)
    return 0 if ok else 1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=8, help="decode steps = tokens generated (default 8)")
    p.add_argument(
        "--mode",
        choices=("resident", "staged", "both", "device", "overlap"),
        default="resident",
        help="resident weights + KV cache, or everything host-staged every step; both = compare; "
        "device = every argument resident and device code (native launches on cuda); overlap = "
        "device with and without waiting for each step (w.run(..., wait=False)), interleaved",
    )
    p.add_argument("--repeats", type=int, default=3, help="runs of each arm for --mode overlap")
    # The platform and --svm mean what they mean for scene tests: the runner's choices and its
    # parser (the native core's, the one parser of the option).
    p.add_argument("-p", "--platform", default="sim", choices=runner.PLATFORMS, help="sim, ascend or cuda")
    p.add_argument(
        "--svm", type=runner.parse_svm, default=None, help="sim map_host policy: always, never or min bytes"
    )
    p.add_argument("--skip-golden", action="store_true", help="no numpy golden comparison")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    d = DecodeConfig()
    p.add_argument("--layers", type=int, default=d.layers)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--heads", type=int, default=d.heads)
    p.add_argument("--kv-heads", type=int, default=d.kv_heads)
    p.add_argument("--ffn", type=int, default=d.ffn, help="MLP intermediate size")
    p.add_argument("--max-seq", type=int, default=None, help="KV cache positions (default: --rounds)")
    p.add_argument("--seed", type=int, default=d.seed)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    a = parse_args(argv)
    svm: str | int | None = a.svm
    cfg = DecodeConfig(
        layers=a.layers,
        hidden=a.hidden,
        heads=a.heads,
        kv_heads=a.kv_heads,
        ffn=a.ffn,
        max_seq=a.max_seq,
        seed=a.seed,
    )
    seq = cfg.seq(a.rounds)
    fxs = fixtures(cfg, seq)
    print(
        f"decode: {cfg.layers} layers, hidden {cfg.hidden}, {cfg.heads} heads / {cfg.kv_heads} kv heads "
        f"(head_dim {cfg.head_dim}), ffn {cfg.ffn}, KV cache {seq} positions; {len(fxs)} fixtures, "
        f"{_mib(sum(f.nbytes for f in fxs))}; {a.rounds} steps on {a.platform}"
    )
    if a.mode == "overlap":
        return compare_overlap(cfg, a.rounds, a.platform, a.repeats, svm=svm, skip_golden=a.skip_golden)
    modes = ("resident", "staged") if a.mode == "both" else (a.mode,)
    results = []
    for mode in modes:
        r = run_decode(
            cfg,
            mode,
            a.rounds,
            a.platform,
            svm=svm,
            skip_golden=a.skip_golden,
            progress=not a.no_progress and a.rounds >= 32,
        )
        results.append(r)
        print("\n".join(report_lines(r)))
    if len(results) == 2:
        res_, stg = results
        print(
            f"resident vs staged: {res_.tokens_per_s / stg.tokens_per_s:.2f}x tokens/s "
            f"({res_.warm_tokens_per_s / stg.warm_tokens_per_s:.2f}x warm), "
            f"dispatch path {res_.dispatch_us() / stg.dispatch_us():.3f}x"
        )
    return 0 if all(r.golden_ok is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
