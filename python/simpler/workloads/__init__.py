"""Workloads shipped with simpler, runnable from any install (``simpler bench <name>``).

Each is a module of scene tests (and their kernels and golden models); :data:`WORKLOADS` maps the
bench's names to them. A module's ``BENCH_CASES`` are the cases ``simpler bench`` runs when none is
named, and ``simpler bench`` without a workload runs :data:`DEFAULT_WORKLOAD`: the unrolled paged
attention (upstream's graph, which the published figures were measured on), ``Case1`` and
``Case2``. The per-block graph (``simpler bench paged_attention``) runs on request, as the
orchestration stress it is (65,792 tasks per round at B=256).
"""

from __future__ import annotations

#: Bench name -> module of scene tests.
WORKLOADS: dict[str, str] = {
    "paged_attention": "simpler.workloads.paged_attention",
    "paged_attention_unroll": "simpler.workloads.paged_attention_unroll",
}

#: What ``simpler bench`` runs when no workload is named.
DEFAULT_WORKLOAD = "paged_attention_unroll"
