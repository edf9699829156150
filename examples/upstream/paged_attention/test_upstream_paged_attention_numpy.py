"""The torch-free twin of ``test_upstream_paged_attention.py`` (upstream's paged attention, ported): the
same ``CASES`` and golden, with inputs made over numpy, so the port runs where torch is absent."""

from __future__ import annotations

import pa_port

from simpler import SceneTestCase, TaskArgsBuilder, scene_test


@scene_test(level=2, runtime="tensormap_and_ringbuffer")
class TestPagedAttentionNumpy(SceneTestCase):
    """Paged attention over bfloat16 numpy inputs, upstream's cases."""

    CALLABLE = pa_port.CALLABLE
    CASES = pa_port.CASES
    RTOL = pa_port.RTOL
    ATOL = pa_port.ATOL

    def generate_args(self, params):
        args = TaskArgsBuilder()
        for name, value in pa_port.generate_inputs(params):
            if name == "scale":
                args.add_scalar(name, value)
            else:
                args.add_tensor(name, value)
        return args

    def compute_golden(self, args, params):
        names = ("query", "key_cache", "value_cache", "block_table", "context_lens")
        args.out[:] = pa_port.golden(*(getattr(args, n) for n in names), args.scale)


if __name__ == "__main__":
    SceneTestCase.run_module(__name__)
