"""Host implementations of the shipped workloads' CUDA entries, for the fake libcuda
(:mod:`simpler.testing.fake_cuda`): importing this package registers them, and
:func:`install_if_fake` registers them with the fake when it is the driver. They live here, beside
the fake, so that the workloads themselves never import the test fake."""

from __future__ import annotations

import os

from .. import fake_cuda
from . import paged_attention, paged_attention_unroll  # noqa: F401  (each registers its entries)

__all__ = ["install_if_fake"]


def install_if_fake(lib_path: str | os.PathLike[str] | None = None) -> bool:
    """:func:`simpler.testing.fake_cuda.install_if_fake`, with the shipped workloads' host
    implementations registered (by importing this package) before it runs."""
    return fake_cuda.install_if_fake(lib_path)
