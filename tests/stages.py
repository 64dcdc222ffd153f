"""The public stage classes of sparkdist, found by walking its packages' exports: the tests
that must cover every stage (Params surface, fitted uids) use this one list."""

from __future__ import annotations

import sparkdist
import sparkdist.features
import sparkdist.models


def public_classes(base: type) -> list[type]:
    """Every exported subclass of ``base`` (a pyspark ``Params`` or ``Estimator``), by name."""
    found: dict[str, type] = {}
    for module in (sparkdist, sparkdist.models, sparkdist.features):
        for name in module.__all__:
            value = getattr(module, name)
            if isinstance(value, type) and issubclass(value, base):
                found[name] = value
    return [found[name] for name in sorted(found)]
