"""CUDA device code for the unrolled paged attention (:mod:`simpler.workloads.paged_attention_unroll`).

Each of the four group kernels there (``qk``, ``softmax``, ``pv``, ``update``) has a device entry
here (``pu_qk``, ...) computing the same thing on the same views: :data:`SOURCE` is one
self-contained CUDA C++ translation unit (no ``#include``: bfloat16 travels as ``unsigned short``)
holding all four, and :data:`KERNELS` gives each entry's scalar kinds and launch function. The
device code is ``cuda/paged_attention_unroll.cu``, shipped with the package (the ``#define``
lines before it come from this module's constants); the fake libcuda CI runs over has a host
implementation of every entry in :mod:`simpler.testing.fake_kernels.paged_attention_unroll`. The
ABI is the runtime's (``docs/device-kernels.md``): one
parameter, the address of the launch's first task row; a row holds the views' addresses, the
task's scalars, then the launch function's consts; task ``blockIdx.z`` reads ``rows[blockIdx.z]``.

Shapes (per task view): ``q`` [1, QT, D] bf16, ``key_cache`` / ``value_cache`` the whole cache
[NB, BS, 1, D] bf16, ``ids`` [1, n] int32 (the group's slice of the block table), ``scores``
[1, n, QT, BS] f32 and ``probs`` [1, n, QT, BS] bf16 (one tile per block), ``m`` / ``l``
[1, QT] f32, ``oi`` / ``acc`` / ``out`` [1, QT, D] f32.

=================  =====================  =====================  ==================================
entry              row fields             consts                 per-task grid / block
=================  =====================  =====================  ==================================
``pu_qk``          q, key_cache, ids,     QT, D, BS, n, NB       (n, 1, 1) / (128, 1, 1): a CTA per
                   scores                                        block; Q and the K block staged in
                                                                 shared memory with 16-byte loads,
                                                                 bf16 ``mma.sync`` m16n8k16
``pu_softmax``     scores, probs, m, l,   QT, BS, n              (QT, 1, 1) / (256, 1, 1): a CTA per
                   scale, valid_last                             head row; the row (up to 8,192
                                                                 scores) held in registers
``pu_pv``          probs, value_cache,    QT, D, BS, n, NB       (ceil(D / 16), 1, 1) / (512, 1, 1):
                   ids, oi                                       a CTA per 16 columns of D, its 16
                                                                 warps splitting the blocks; V staged
                                                                 with 16-byte loads, bf16 ``mma.sync``,
                                                                 partials summed in shared memory
``pu_update``      m_g, l_g, oi_g, m, l,  QT, D                  (QT, 1, 1) / (bx, 1, 1): a CTA per
                   acc, out, first, last                         head row
=================  =====================  =====================  ==================================

``mma.sync`` needs compute capability 8.0; below it the same fragments are computed with scalar
FMAs (``__CUDA_ARCH__ < 800``). Summation orders differ from numpy's, so device results agree
with the numpy kernels to float32 rounding (the scores) and to one bfloat16 rounding step of P
where an exponential lands on a rounding boundary, not bit for bit.

No entry traps: the launch functions refuse, at submit, every geometry the code cannot run (``D``
past :data:`MAX_HEAD_DIM`, ``QT`` past :data:`MAX_Q_TILE`, views of the wrong shapes), and an
entry launched otherwise returns without writing. A block id outside the cache (the block table
is data, so the launch functions cannot see it) makes ``pu_qk`` and ``pu_pv`` skip that block:
its scores are left unwritten and its V rows are not read.
"""

from __future__ import annotations

from collections.abc import Sequence
from importlib import resources

import simpler as sp

#: The largest head dimension the entries take (the QK tile in shared memory).
MAX_HEAD_DIM = 256
#: The most query heads of one task (upstream's ``q_tile`` limit).
MAX_Q_TILE = 128
#: Threads of a ``pu_qk`` CTA (4 warps) and of a ``pu_softmax`` CTA (8 warps).
QK_THREADS = 128
ROW_THREADS = 256
#: Columns of D one ``pu_pv`` CTA computes (two 8-wide ``mma`` tiles), and its threads (16 warps).
PV_COLS = 16
PV_THREADS = 512
#: Scores of one softmax row held in registers (256 threads x 32); longer rows are read twice.
SOFTMAX_REGS = ROW_THREADS * 32
#: Most threads of a ``pu_update`` CTA.
UPDATE_THREADS = 128
WARP = 32
#: The most dynamic shared memory a launch asks for (the H200's opt-in limit per block).
MAX_SHARED = 227 << 10

_DEFINES = f"""
#define PU_MAX_DIM {MAX_HEAD_DIM}
#define PU_MAX_QT {MAX_Q_TILE}
#define PU_QK_THREADS {QK_THREADS}
#define PU_ROW_THREADS {ROW_THREADS}
#define PU_PV_COLS {PV_COLS}
#define PU_PV_THREADS {PV_THREADS}
#define PU_UPDATE_THREADS {UPDATE_THREADS}
"""

#: The entries' CUDA C++ (``cuda/paged_attention_unroll.cu``, shipped with the package), after
#: :data:`_DEFINES`.
_BODY = (resources.files(__package__) / "cuda" / "paged_attention_unroll.cu").read_text(encoding="utf-8")

#: The CUDA C++ source of the four entries (self-contained; compile with NVRTC).
SOURCE = (
    "/* simpler: unrolled paged attention (decode) device kernels; see "
    "simpler.workloads.paged_attention_unroll_cuda */\n" + _DEFINES + _BODY
)


# -- launch functions (one call per submit, with the shapes of the task's views) ------------------


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _require(ok: bool, msg: str) -> None:
    """Refuses a submit the device code cannot run (an ``ArgumentError`` naming the entry)."""
    if not ok:
        raise sp.ArgumentError(msg)


def _shape(shape: Sequence[int]) -> tuple[int, ...]:
    return tuple(int(s) for s in shape)


def _tiles(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """(n, QT, BS) of a scores / probs view [1, n, QT, BS]."""
    s = _shape(shape)
    _require(len(s) == 4 and s[0] == 1 and min(s) >= 1, f"{entry}: {what} view {s} is not [1, n, QT, BS]")
    return s[1], s[2], s[3]


def _cache(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int, int]:
    """(NB, BS, D) of a whole cache [NB, BS, 1, D]."""
    s = _shape(shape)
    _require(len(s) == 4 and s[2] == 1 and min(s) >= 1, f"{entry}: {what} {s} is not [NB, BS, 1, D]")
    return s[0], s[1], s[3]


def _rowmat(entry: str, what: str, shape: Sequence[int]) -> tuple[int, int]:
    """(QT, D) of a [1, QT, D] view."""
    s = _shape(shape)
    _require(len(s) == 3 and s[0] == 1 and min(s) >= 1, f"{entry}: {what} view {s} is not [1, QT, D]")
    return s[1], s[2]


def _vec(entry: str, what: str, shape: Sequence[int], n: int) -> None:
    s = _shape(shape)
    _require(len(s) == 2 and s[0] == 1 and s[1] == n, f"{entry}: {what} view {s} is not [1, {n}]")


def _limits(entry: str, qt: int, dim: int) -> None:
    _require(
        dim <= MAX_HEAD_DIM,
        f"{entry}: head dimension D = {dim} is past the kernel's limit MAX_HEAD_DIM = {MAX_HEAD_DIM}",
    )
    _require(qt <= MAX_Q_TILE, f"{entry}: {qt} query heads per task are past MAX_Q_TILE = {MAX_Q_TILE}")


def qk_shared(qt: int, dim: int, block_size: int) -> int:
    """Dynamic shared bytes of ``pu_qk``: Q (rows padded to 16) and a K block (tokens padded to
    8), each row ``roundup(D, 16) + 8`` bf16."""
    ld = _cdiv(dim, 16) * 16 + 8
    return (_cdiv(qt, 16) * 16 + _cdiv(block_size, 8) * 8) * ld * 2


def qk_launch(q_shape, kc_shape, ids_shape, scores_shape) -> dict:
    """``pu_qk``: a CTA per block of the group, consts ``(QT, D, BS, n, NB)``."""
    qt, dim = _rowmat("pu_qk", "q", q_shape)
    nb, bs, k_dim = _cache("pu_qk", "key_cache", kc_shape)
    n, s_qt, s_bs = _tiles("pu_qk", "scores", scores_shape)
    _require(k_dim == dim, f"pu_qk: q {_shape(q_shape)} and key_cache {_shape(kc_shape)} differ in D")
    _require((s_qt, s_bs) == (qt, bs), f"pu_qk: scores view {_shape(scores_shape)} != [1, n, {qt}, {bs}]")
    _vec("pu_qk", "ids", ids_shape, n)
    _limits("pu_qk", qt, dim)
    shared = qk_shared(qt, dim, bs)
    _require(shared <= MAX_SHARED, f"pu_qk: {shared} bytes of shared memory are past {MAX_SHARED}")
    return {"grid": (n, 1, 1), "block": (QK_THREADS, 1, 1), "shared": shared, "consts": (qt, dim, bs, n, nb)}


def softmax_launch(scores_shape, probs_shape, m_shape, l_shape) -> dict:
    """``pu_softmax``: a CTA per head row, consts ``(QT, BS, n)``."""
    n, qt, bs = _tiles("pu_softmax", "scores", scores_shape)
    _require(
        _tiles("pu_softmax", "probs", probs_shape) == (n, qt, bs),
        f"pu_softmax: probs view {_shape(probs_shape)} != scores'",
    )
    _vec("pu_softmax", "m", m_shape, qt)
    _vec("pu_softmax", "l", l_shape, qt)
    _require(qt <= MAX_Q_TILE, f"pu_softmax: {qt} query heads per task are past MAX_Q_TILE = {MAX_Q_TILE}")
    return {"grid": (qt, 1, 1), "block": (ROW_THREADS, 1, 1), "shared": 0, "consts": (qt, bs, n)}


def pv_launch(probs_shape, vc_shape, ids_shape, oi_shape) -> dict:
    """``pu_pv``: a CTA per 16 columns of D, consts ``(QT, D, BS, n, NB)``."""
    n, qt, bs = _tiles("pu_pv", "probs", probs_shape)
    nb, v_bs, dim = _cache("pu_pv", "value_cache", vc_shape)
    _require(
        v_bs == bs, f"pu_pv: probs {_shape(probs_shape)} and value_cache {_shape(vc_shape)} differ in BS"
    )
    _require(
        _rowmat("pu_pv", "oi", oi_shape) == (qt, dim),
        f"pu_pv: oi view {_shape(oi_shape)} != [1, {qt}, {dim}]",
    )
    _vec("pu_pv", "ids", ids_shape, n)
    _limits("pu_pv", qt, dim)
    grid = (_cdiv(dim, PV_COLS), 1, 1)
    return {"grid": grid, "block": (PV_THREADS, 1, 1), "shared": 0, "consts": (qt, dim, bs, n, nb)}


def update_launch(mg_shape, lg_shape, oig_shape, m_shape, l_shape, acc_shape, out_shape) -> dict:
    """``pu_update``: a CTA per head row, consts ``(QT, D)``."""
    qt, dim = _rowmat("pu_update", "oi_g", oig_shape)
    for what, shape in (("m_g", mg_shape), ("l_g", lg_shape), ("m", m_shape), ("l", l_shape)):
        _vec("pu_update", what, shape, qt)
    for what, shape in (("acc", acc_shape), ("out", out_shape)):
        _require(
            _rowmat("pu_update", what, shape) == (qt, dim),
            f"pu_update: {what} view {_shape(shape)} != [1, {qt}, {dim}]",
        )
    bx = min(UPDATE_THREADS, _cdiv(dim, WARP) * WARP)
    return {"grid": (qt, 1, 1), "block": (bx, 1, 1), "shared": 0, "consts": (qt, dim)}


#: Entry name -> its entry, the kinds of its task scalars (in submit order) and its launch
#: function; the numpy kernel of ``pu_<name>`` is the kernel named ``<name>`` in
#: :mod:`simpler.workloads.paged_attention_unroll`.
KERNELS: dict[str, dict] = {
    "pu_qk": {"scalars": (), "launch": qk_launch},
    "pu_softmax": {"scalars": ("float64", "int64"), "launch": softmax_launch},
    "pu_pv": {"scalars": (), "launch": pv_launch},
    "pu_pv_m16": {"scalars": (), "launch": pv_launch},
    "pu_update": {"scalars": ("int64", "int64"), "launch": update_launch},
}


def cuda_code(entry: str) -> sp.CudaCode:
    """The :class:`simpler.CudaCode` of ``entry``: :data:`SOURCE` compiled with NVRTC, launched with
    the entry's launch function once per submit call; every view is read as dense row-major."""
    spec = KERNELS[entry]
    shape_launch = spec["launch"]

    def launch(*shapes: Sequence[int]) -> sp.Launch:
        d = shape_launch(*shapes)
        return sp.Launch(d["grid"], d["block"], d["shared"], d["consts"])

    launch.__name__ = f"{entry}_launch"
    return sp.CudaCode(SOURCE, entry=entry, launch=launch, scalars=spec["scalars"], contiguous=True)
