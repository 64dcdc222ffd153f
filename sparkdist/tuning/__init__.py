"""Hyperparameter search as pyspark.ml stages: :class:`Tuner` and :class:`TunerModel`
(Optuna samplers, pruners and storage; needs the ``tuning`` extra)."""

from __future__ import annotations

from sparkdist.tuning.tuner import Tuner, TunerModel

__all__ = ["Tuner", "TunerModel"]
