"""The ``simpler`` pytest entry point (``pytest11``).

It only loads :mod:`simpler.testing.pytest_plugin` under that module's own name, so both ways of naming
the plugin work together: ``-p no:simpler`` turns it off, and loading it again by module name
(``-p simpler.testing.pytest_plugin``, a conftest's ``pytest_plugins``) finds it loaded already.
"""

pytest_plugins = ["simpler.testing.pytest_plugin"]
