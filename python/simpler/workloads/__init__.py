"""Workloads shipped with simpler, runnable from any install (``simpler bench <name>``).

Each is a module of scene tests (and their kernels and golden models); :data:`WORKLOADS` maps the
bench's names to them.
"""

from __future__ import annotations

#: Bench name -> module of scene tests.
WORKLOADS: dict[str, str] = {
    "paged_attention": "simpler.workloads.paged_attention",
    "paged_attention_unroll": "simpler.workloads.paged_attention_unroll",
}
