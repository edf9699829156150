"""Shared test configuration: hypothesis profiles, chosen by ``HYPOTHESIS_PROFILE``.

* ``ci`` (default): modest example counts so `make test` stays within CI's time budget.
* ``dev``: ten times more, for a local soak (``HYPOTHESIS_PROFILE=dev pytest tests/test_stateful.py
  --hypothesis-show-statistics``).

Both use no example database (nothing is written under the checkout) and no deadline (timing on
a loaded CI machine is not a property of the code).
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_COMMON = {
    "deadline": None,
    "database": None,
    "print_blob": True,
    "suppress_health_check": [HealthCheck.too_slow],
}
settings.register_profile("ci", max_examples=100, stateful_step_count=50, **_COMMON)
settings.register_profile("dev", max_examples=1000, stateful_step_count=100, **_COMMON)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
