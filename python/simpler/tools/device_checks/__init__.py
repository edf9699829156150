"""The device checks as pytest tests, shipped in the package so that they run from an installed
wheel on a machine with a device (``python -m simpler.tools.device_check``, which runs them
with ``pytest.main``): ``check_driver`` (``driver.*``), ``check_workloads``
(``paged_attention.*``, ``paged_attention_unroll.*``, ``bench.*``) and ``check_device``
(``decode.overlap``, ``export.queued_work``, ``compile.kernel_resources``, ``launches``), what
they share in ``common``, and the pytest plugin that names them, hands them the context and
writes their figures as JSON lines in ``plugin``.
"""
