"""CUDA device code for the paged attention kernels (:mod:`simpler.workloads.paged_attention`).

Each of the six numpy kernels there (``qk``, ``block_softmax``, ``pv``, ``online_update``,
``normalize``, ``zero``) has a device entry here (``pa_qk``, ...) computing the same thing on the
same views: :data:`SOURCE` is one self-contained CUDA C++ translation unit (no ``#include``: it
compiles with the NVRTC wheel alone) holding all six, and :data:`KERNELS` gives each entry's
scalar kinds and launch function. The device code is ``cuda/paged_attention.cu``, shipped with
the package; the ``#define`` lines before it come from this module's constants. The fake libcuda
CI runs over has a host implementation of every entry in
:mod:`simpler.testing.fake_kernels.paged_attention`.

The ABI, as these kernels use it
--------------------------------
* An entry is ``extern "C" __global__ void pa_x(const pa_x_row* rows)``: one parameter, the
  device address of the first task row of the launch.
* A launch covers ``n`` tasks of one submit call (consecutive, or one dependence level): grid
  ``(gx, gy, gz * n)``, where ``(gx, gy, gz)`` is the per-task grid the launch function
  returned. Every launch function here returns ``gz = 1``, so task ``blockIdx.z`` reads
  ``rows[blockIdx.z]`` and its blocks are ``(blockIdx.x, blockIdx.y)``.
* A row is a C struct of 8-byte fields: the device address of the first element of each tensor
  slot's view (the views here are dense, row-major), then the task's scalars in submit order
  (``double`` for ``"float64"``, ``long long`` for ``"int64"``), then the launch function's
  ``consts`` (``long long`` each, the same for every task of the submit call). The dimensions a
  kernel needs travel as consts; nothing else tells it the shape of a view.

Shapes (per task view): ``q`` [1, H, D] bf16, ``k`` / ``v`` [1, BS, 1, D] bf16, ``scores`` /
``probs`` [1, H, BS] f32, ``stats`` [1, 2, H] f32, ``block_out`` [1, H, D] f32, running max /
sum [1, H] f32, ``acc`` [1, H, D] f32, ``out`` [1, H, D] f32. bfloat16 is read as ``unsigned
short`` and widened exactly (``__uint_as_float(u << 16)``); all arithmetic is float32.

=====================  ===================  ==============  ===========================================
entry                  row fields           consts          per-task grid / block
=====================  ===================  ==============  ===========================================
``pa_qk``              q, k, scores,        H, D, BS        (ceil(BS/4), 1, 1) / (32, 4, 1): a warp
                       scale, valid                         per token, lanes over D, every head
``pa_block_softmax``   scores, probs,       H, BS           (ceil(H/4), 1, 1) / (32, 4, 1): a warp
                       stats, valid                         per head, lanes over tokens
``pa_pv``              probs, v,            H, D, BS        (ceil(H/4), ceil(D/bx), 1) / (bx, 1, 1):
                       block_out, valid                     a thread per (4 heads, d)
``pa_online_update``   stats, block_out,    H, D            (H, 1, 1) / (bx, 1, 1): a block per head
                       m, s, acc, first
``pa_normalize``       s, acc, out          H, D            (ceil(H*D/256), 1, 1) / (256, 1, 1)
``pa_zero``            out                  count           (ceil(count/256), 1, 1) / (256, 1, 1)
=====================  ===================  ==============  ===========================================

(``bx`` is ``D`` rounded up to a warp, at most 128.) As the numpy kernels do, ``pa_qk``,
``pa_block_softmax`` and ``pa_pv`` read and write only the first ``valid`` tokens (``valid`` is
clamped to ``[0, BS]``); the rest of ``scores`` / ``probs`` is left untouched. ``D`` is at most
:data:`MAX_HEAD_DIM` (a key row lives in registers in ``pa_qk``); ``H`` and ``BS`` are bounded only
by the grid. Summation orders differ from numpy's, so device results agree with the numpy kernels
to float32 rounding, not bit for bit.

No entry ever traps. A trap is a sticky fault: it leaves the CUDA context unusable for every
library that shares it (torch, CuPy, other workers), not only for this kernel. So the launch
functions refuse, at submit, every geometry the device code cannot handle (an
``ArgumentError`` naming the entry and the limit: ``D`` past :data:`MAX_HEAD_DIM`, a grid past the
device's limits, views of the wrong shapes), and an entry launched with a geometry its launch
function never makes returns without writing anything.

Tasks of one launch run concurrently. The ``online_update`` submits hold dependent tasks (the
blocks of one batch fold into the same running max / sum / accumulator, in order); the runtime
runs such a batch in levels, one launch per level, so no launch holds two tasks of one batch.
The fake's host implementations check that: a launch whose tasks touch the same bytes, one of
them writing, fails (``simpler.testing.fake_cuda.LaunchRace``) instead of producing the
sequential answer a device would not.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources
from typing import Any

import numpy as np

import simpler as sp


def __getattr__(name: str) -> Any:
    """``BF16``: ``ml_dtypes.bfloat16``, resolved when first read (``ml_dtypes`` is imported only
    where a bfloat16 array is made or read, not with this module)."""
    if name == "BF16":
        return sp.np_dtype("bfloat16").type
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


#: The largest head dimension ``pa_qk`` supports (a key row is held in registers, 8 per lane).
MAX_HEAD_DIM = 256
#: Warps per block of ``pa_qk`` (one token each) and of ``pa_block_softmax`` (one head each).
WARPS = 4
#: Heads per ``pa_pv`` thread (each value element read is used for this many heads).
PV_HEADS = 4
#: Most threads per block along D (``pa_pv``, ``pa_online_update``).
DIM_THREADS = 128
#: Threads per block of the elementwise entries (``pa_normalize``, ``pa_zero``).
FLAT_THREADS = 256
#: Threads per warp.
WARP = 32
#: The most blocks of a grid along x the device takes (2**31 - 1).
MAX_GRID_X = 2**31 - 1
#: The most blocks of a grid along y (and z) the device takes.
MAX_GRID_Y = 65535

_DEFINES = f"""
#define PA_WARP {WARP}
#define PA_MAX_DIM {MAX_HEAD_DIM}
#define PA_DIM_PER_LANE (PA_MAX_DIM / PA_WARP)
#define PA_PV_HEADS {PV_HEADS}
"""

#: The entries' CUDA C++ (``cuda/paged_attention.cu``, shipped with the package), after :data:`_DEFINES`.
_BODY = (resources.files(__package__) / "cuda" / "paged_attention.cu").read_text(encoding="utf-8")

#: The CUDA C++ source of the six entries (self-contained; compile with NVRTC).
SOURCE = (
    "/* simpler: paged attention (decode) device kernels; see simpler.workloads.paged_attention_cuda */\n"
    + _DEFINES
    + _BODY
)


# -- launch functions (one call per submit, with the shapes of the task's views) --------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _size(shape: Sequence[int]) -> int:
    return int(np.prod([int(s) for s in shape], dtype=np.int64))


def _require(ok: bool, msg: str) -> None:
    """Refuses a submit the device code cannot run: an ``ArgumentError`` (a ``ValueError``) with
    ``msg``, which names the entry and the limit."""
    if not ok:
        raise sp.ArgumentError(msg)


def _mat(shape: Sequence[int], what: str) -> tuple[int, int]:
    """The (rows, cols) a numpy kernel reshapes a view to: its last two dims, leading dims 1."""
    shape = tuple(int(s) for s in shape)
    _require(len(shape) >= 2 and _size(shape[:-2]) == 1, f"{what} view {shape} is not [1.., rows, cols]")
    _require(shape[-2] >= 1 and shape[-1] >= 1, f"{what} view {shape} is empty")
    return shape[-2], shape[-1]


def _kv(shape: Sequence[int], what: str) -> tuple[int, int]:
    """(BS, D) of a key / value block view [1, BS, 1, D]."""
    shape = tuple(int(s) for s in shape)
    _require(
        len(shape) == 4 and shape[0] == 1 and shape[2] == 1 and shape[1] >= 1 and shape[3] >= 1,
        f"{what} view {shape} is not [1, BS, 1, D]",
    )
    return shape[1], shape[3]


def _dim_threads(dim: int) -> int:
    return min(DIM_THREADS, _cdiv(dim, WARP) * WARP)


def _launch(
    entry: str, grid: tuple[int, int, int], block: tuple[int, int, int], consts: tuple[int, ...]
) -> dict:
    """The launch dict of ``entry``, refused when its per-task grid is past the device's limits
    (:data:`MAX_GRID_X`, :data:`MAX_GRID_Y`; the message gives the grid and the consts it
    came from)."""
    _require(
        grid[0] <= MAX_GRID_X and grid[1] <= MAX_GRID_Y,
        f"{entry}: grid {grid} is past the device's limits (x <= {MAX_GRID_X}, y <= {MAX_GRID_Y}) "
        f"for consts {consts}",
    )
    return {"grid": grid, "block": block, "shared": 0, "consts": consts}


def qk_launch(q_shape: Sequence[int], k_shape: Sequence[int], scores_shape: Sequence[int]) -> dict:
    """``pa_qk``: a warp per token (:data:`WARPS` per block), consts ``(H, D, BS)``; refuses
    ``D > MAX_HEAD_DIM``."""
    heads, dim = _mat(q_shape, "pa_qk: q")
    block_size, k_dim = _kv(k_shape, "pa_qk: k")
    _require(k_dim == dim, f"pa_qk: q {tuple(q_shape)} and k {tuple(k_shape)} differ in D")
    _require(
        _mat(scores_shape, "pa_qk: scores") == (heads, block_size),
        f"pa_qk: scores view {tuple(scores_shape)} != [1, H, BS]",
    )
    _require(
        dim <= MAX_HEAD_DIM,
        f"pa_qk: head dimension D = {dim} is past the kernel's limit MAX_HEAD_DIM = {MAX_HEAD_DIM} "
        "(a key row is held in registers)",
    )
    return _launch("pa_qk", (_cdiv(block_size, WARPS), 1, 1), (WARP, WARPS, 1), (heads, dim, block_size))


def block_softmax_launch(
    scores_shape: Sequence[int], probs_shape: Sequence[int], stats_shape: Sequence[int]
) -> dict:
    """``pa_block_softmax``: a warp per head (:data:`WARPS` per block), consts ``(H, BS)``."""
    heads, block_size = _mat(scores_shape, "pa_block_softmax: scores")
    _require(
        _mat(probs_shape, "pa_block_softmax: probs") == (heads, block_size),
        f"pa_block_softmax: probs view {tuple(probs_shape)} != scores'",
    )
    _require(
        _size(stats_shape) == 2 * heads, f"pa_block_softmax: stats view {tuple(stats_shape)} is not [1, 2, H]"
    )
    return _launch("pa_block_softmax", (_cdiv(heads, WARPS), 1, 1), (WARP, WARPS, 1), (heads, block_size))


def pv_launch(probs_shape: Sequence[int], v_shape: Sequence[int], block_out_shape: Sequence[int]) -> dict:
    """``pa_pv``: a thread per (:data:`PV_HEADS` heads, d), consts ``(H, D, BS)``."""
    heads, block_size = _mat(probs_shape, "pa_pv: probs")
    v_block, dim = _kv(v_shape, "pa_pv: v")
    _require(v_block == block_size, f"pa_pv: probs {tuple(probs_shape)} and v {tuple(v_shape)} differ in BS")
    _require(
        _mat(block_out_shape, "pa_pv: block_out") == (heads, dim),
        f"pa_pv: block_out view {tuple(block_out_shape)} != [1, H, D]",
    )
    bx = _dim_threads(dim)
    return _launch("pa_pv", (_cdiv(heads, PV_HEADS), _cdiv(dim, bx), 1), (bx, 1, 1), (heads, dim, block_size))


def online_update_launch(
    stats_shape: Sequence[int],
    block_out_shape: Sequence[int],
    m_shape: Sequence[int],
    s_shape: Sequence[int],
    acc_shape: Sequence[int],
) -> dict:
    """``pa_online_update``: a block per head, consts ``(H, D)``."""
    heads, dim = _mat(block_out_shape, "pa_online_update: block_out")
    _require(
        _size(stats_shape) == 2 * heads,
        f"pa_online_update: stats view {tuple(stats_shape)} is not [1, 2, H]",
    )
    _require(
        _size(m_shape) == heads and _size(s_shape) == heads,
        f"pa_online_update: running max / sum views != [1, {heads}]",
    )
    _require(
        _mat(acc_shape, "pa_online_update: acc") == (heads, dim),
        f"pa_online_update: acc view {tuple(acc_shape)} != block_out's",
    )
    return _launch("pa_online_update", (heads, 1, 1), (_dim_threads(dim), 1, 1), (heads, dim))


def normalize_launch(s_shape: Sequence[int], acc_shape: Sequence[int], out_shape: Sequence[int]) -> dict:
    """``pa_normalize``: a thread per element, consts ``(H, D)``."""
    heads, dim = _mat(acc_shape, "pa_normalize: acc")
    _require(_size(s_shape) == heads, f"pa_normalize: sum view {tuple(s_shape)} != [1, {heads}]")
    _require(
        _mat(out_shape, "pa_normalize: out") == (heads, dim),
        f"pa_normalize: out view {tuple(out_shape)} != acc's",
    )
    grid = (_cdiv(heads * dim, FLAT_THREADS), 1, 1)
    return _launch("pa_normalize", grid, (FLAT_THREADS, 1, 1), (heads, dim))


def zero_launch(out_shape: Sequence[int]) -> dict:
    """``pa_zero``: a thread per element, consts ``(count,)``."""
    count = _size(out_shape)
    _require(count >= 1, f"pa_zero: out view {tuple(out_shape)} is empty")
    return _launch("pa_zero", (_cdiv(count, FLAT_THREADS), 1, 1), (FLAT_THREADS, 1, 1), (count,))


#: Entry name -> its ``entry``, the kinds of the task scalars (in submit order) and its launch
#: function. The numpy kernel of entry ``pa_<name>`` is the ``Kernel`` named ``<name>`` in
#: :mod:`simpler.workloads.paged_attention`.
KERNELS: dict[str, dict] = {
    "pa_qk": {"entry": "pa_qk", "scalars": ("float64", "int64"), "launch": qk_launch},
    "pa_block_softmax": {"entry": "pa_block_softmax", "scalars": ("int64",), "launch": block_softmax_launch},
    "pa_pv": {"entry": "pa_pv", "scalars": ("int64",), "launch": pv_launch},
    "pa_online_update": {"entry": "pa_online_update", "scalars": ("int64",), "launch": online_update_launch},
    "pa_normalize": {"entry": "pa_normalize", "scalars": (), "launch": normalize_launch},
    "pa_zero": {"entry": "pa_zero", "scalars": (), "launch": zero_launch},
}


def cuda_code(entry: str) -> sp.CudaCode:
    """The :class:`simpler.CudaCode` of ``entry`` (one of :data:`KERNELS`): :data:`SOURCE`
    compiled with NVRTC, launched with the entry's launch function, once per submit call."""
    spec = KERNELS[entry]
    shape_launch = spec["launch"]

    def launch(*shapes: Sequence[int]) -> sp.Launch:
        d = shape_launch(*shapes)
        return sp.Launch(d["grid"], d["block"], d["shared"], d["consts"])

    launch.__name__ = f"{entry}_launch"
    # The entries read dense row-major views (only each view's first address travels).
    return sp.CudaCode(SOURCE, entry=entry, launch=launch, scalars=spec["scalars"], contiguous=True)
