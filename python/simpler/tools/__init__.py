"""The tools: the ``simpler`` command (:mod:`simpler.tools.cli`: ``simpler bench`` and ``simpler
report``), the bench it runs (:mod:`simpler.tools.bench`), the round tables and plots of its
records (:mod:`simpler.tools.report`), and the overhead benchmarks
(``python -m simpler.tools.benchmarks``).
"""
