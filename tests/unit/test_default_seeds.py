"""Every sparkdist stage with a ``seed`` Param defaults to the same seed in every process.

pyspark's ``HasSeed`` defaults to ``hash(class name)``, which Python salts per process
(PYTHONHASHSEED), so an unseeded fit would hold out other rows and start from other weights in
every run. Two interpreters with different hash seeds must agree on each default.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # two interpreters import every model family (about 15 s)

# Imports every sparkdist module and prints {class: default seed} for each public Params
# class that has a seed Param with a default.
_PROBE = """
import importlib, inspect, json, pkgutil
import sparkdist
from pyspark.ml.param import Params
found = {}
for info in pkgutil.walk_packages(sparkdist.__path__, "sparkdist."):
    try:
        module = importlib.import_module(info.name)
    except ModuleNotFoundError as err:  # an optional extra that is not installed
        if (err.name or "").startswith("sparkdist"):
            raise
        continue
    for name, cls in inspect.getmembers(module, inspect.isclass):
        if cls.__module__ != module.__name__ or name.startswith("_"):
            continue
        if not issubclass(cls, Params) or inspect.isabstract(cls):
            continue
        try:
            stage = cls()
        except TypeError:  # needs constructor arguments
            continue
        if stage.hasParam("seed") and stage.hasDefault("seed"):
            found[f"{cls.__module__}.{name}"] = stage.getOrDefault("seed")
print(json.dumps(found))
"""

EXPECTED = [
    "sparkdist.models.als.ALS",
    "sparkdist.models.forest.RandomForestClassificationModel",
    "sparkdist.models.forest.RandomForestClassifier",
    "sparkdist.models.forest.RandomForestRegressionModel",
    "sparkdist.models.forest.RandomForestRegressor",
    "sparkdist.models.keras.KerasEstimator",
    "sparkdist.models.logistic.LogisticRegression",
    "sparkdist.models.logistic.LogisticRegressionModel",
    "sparkdist.models.torch.TorchEstimator",
    "sparkdist.torchtrain.params.HasOptimization",  # TorchEstimator's group that reads it
    "sparkdist.tuning.tuner.Tuner",  # the validation split's seed, and the sampler's
    "sparkdist.tuning.tuner.TunerModel",
]


def _defaults(hash_seed: str) -> dict[str, int]:
    env = {**os.environ, "PYTHONHASHSEED": hash_seed}
    out = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True,
                         text=True, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def two_processes() -> tuple[dict[str, int], dict[str, int]]:
    return _defaults("1"), _defaults("2")


def test_every_seeded_stage_is_checked(two_processes):
    first, second = two_processes
    assert sorted(first) == sorted(second) == EXPECTED


@pytest.mark.parametrize("stage", EXPECTED)
def test_default_seed_is_the_same_in_every_process(two_processes, stage):
    first, second = two_processes
    assert first[stage] == second[stage], (
        f"{stage}'s default seed differs between processes ({first[stage]} vs "
        f"{second[stage]}): set it with sparkdist.models._classification.stable_seed")
