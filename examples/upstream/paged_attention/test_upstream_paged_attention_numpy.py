"""The torch-free twin of ``test_upstream_paged_attention.py`` (upstream's paged attention,
ported): the same ``CASES`` and golden, with inputs made over numpy, so the port runs where torch
is absent."""

from __future__ import annotations

from pa_port import PagedAttentionCase

from simpler import SceneTestCase, scene_test


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestPagedAttentionNumpy(PagedAttentionCase):
    """Paged attention over bfloat16 numpy inputs, upstream's cases."""


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
