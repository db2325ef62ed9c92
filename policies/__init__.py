"""Scheduling policies and their registry. Pure: they know only ``rlsched.cluster``.

Importing this package registers the shipped policies.
"""

from . import asynchronous, colocated, elastic, partial  # noqa: F401  (registration side effect)
from .registry import (
    available,
    canonical_spec,
    get_policy_class,
    make_policy,
    make_policy_and_spec,
    parse_spec,
    register,
)

__all__ = ["available", "canonical_spec", "get_policy_class", "make_policy", "make_policy_and_spec",
           "parse_spec", "register"]
