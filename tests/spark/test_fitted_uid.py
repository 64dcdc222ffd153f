"""A fitted sparkdist model carries its estimator's uid, as pyspark's JVM-backed models do
(issue 13 item 5). Every public estimator is found by walking the packages' exports and fitted
once on a few rows; a new estimator without a cheap fit below fails the coverage test."""

from __future__ import annotations

import pytest
from pyspark.ml import Estimator
from pyspark.ml.linalg import Vectors

from tests.stages import public_classes

ESTIMATORS = public_classes(Estimator)

#: Class name -> (data set, constructor keywords) for a fit of a few seconds at most.
CHEAP_FITS = {
    "FeatureAssembler": ("table", {"numericCols": ["x"], "labelCol": "label"}),
    "LogisticRegression": ("vectors", {"maxIter": 2}),
    "RandomForestClassifier": ("vectors", {"numTrees": 2, "maxDepth": 2}),
    "RandomForestRegressor": ("vectors", {"numTrees": 2, "maxDepth": 2}),
    "ALS": ("ratings", {"rank": 2, "maxIter": 1, "checkpointInterval": -1}),
    "TorchEstimator": ("vectors", {"epochs": 1, "numWorkers": 1, "batchSize": 8,
                                   "progress": False}),
    "KerasEstimator": ("vectors", {"epochs": 1, "numWorkers": 1, "batchSize": 8,
                                   "progress": False}),
    "XGBoostClassifier": ("vectors", {"n_estimators": 2, "num_workers": 1}),
    "XGBoostRegressor": ("vectors", {"n_estimators": 2, "num_workers": 1}),
}


def test_every_estimator_has_a_cheap_fit():
    assert sorted(cls.__name__ for cls in ESTIMATORS) == sorted(CHEAP_FITS)


@pytest.fixture(scope="module")
def frames(spark):
    rows = [(float(i % 7), float(i % 2)) for i in range(40)]
    return {
        "table": spark.createDataFrame(rows, ["x", "label"]),
        "vectors": spark.createDataFrame(
            [(Vectors.dense([x, x * x % 5]), y) for x, y in rows], ["features", "label"]),
        "ratings": spark.createDataFrame(
            [(u, i, float((u + i) % 5 + 1)) for u in range(6) for i in range(5)],
            ["user", "item", "rating"]),
    }


@pytest.mark.slow
@pytest.mark.parametrize("cls", ESTIMATORS, ids=lambda cls: cls.__name__)
def test_fitted_model_carries_the_estimator_uid(cls, frames):
    data, params = CHEAP_FITS[cls.__name__]
    estimator = cls(**params)
    model = estimator.fit(frames[data])
    assert model.uid == estimator.uid
    # the model's Params belong to that uid too, and keep the estimator's values
    assert all(p.parent == estimator.uid for p in model.params)
    for param in model.params:
        if estimator.hasParam(param.name) and estimator.isSet(param.name):
            assert model.getOrDefault(param.name) == estimator.getOrDefault(param.name)


def test_a_fit_with_a_param_map_keeps_the_uid(frames):
    from sparkdist.models import LogisticRegression

    estimator = LogisticRegression(maxIter=2)
    model = estimator.fit(frames["vectors"], {estimator.maxIter: 1})
    assert model.uid == estimator.uid and model.getMaxIter() == 1
