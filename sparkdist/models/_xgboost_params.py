"""The XGBoost estimators' and models' Params: xgboost's own names, xgboost.spark's column
Params, the names refused with a hint, and each Param's class under the fingerprint policy
(:mod:`sparkdist.models._recovery`).

Adding an xgboost Param: a row in ``SHARED_PARAMS`` (or ``REGRESSION_PARAMS``) and its class
in ``TRAJECTORY`` (tests/unit/test_fingerprint_policy.py fails until it has one).
"""

from __future__ import annotations

from typing import Any, ClassVar

from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import (
    HasFeaturesCol,
    HasLabelCol,
    HasPredictionCol,
    HasProbabilityCol,
    HasRawPredictionCol,
    HasValidationIndicatorCol,
    HasWeightCol,
)

from sparkdist.models._recovery import ELASTIC_TRAJECTORY, RECOVERY_TRAJECTORY

# xgboost.spark's snake_case constructor names for the column Params.
ALIASES = {"features_col": "featuresCol", "label_col": "labelCol",
           "prediction_col": "predictionCol", "probability_col": "probabilityCol",
           "raw_prediction_col": "rawPredictionCol", "weight_col": "weightCol",
           "validation_indicator_col": "validationIndicatorCol"}
HINTS = {
    "objective": "XGBoostClassifier picks the objective from the label (binary:logistic for "
                 "two classes, multi:softprob above); drop objective.",
    "n_jobs": "each worker uses spark.task.cpus threads; set that Spark conf instead.",
    "nthread": "each worker uses spark.task.cpus threads; set that Spark conf instead.",
    "enable_categorical": "mark categorical features with 'c' in feature_types instead.",
    "eval_set": "mark validation rows with a boolean validationIndicatorCol instead.",
    "sample_weight": "put weights in a column and set weightCol instead.",
    "xgb_model": "continuing from a booster is not supported (it cannot be saved as JSON); "
                 "to continue a fit by rounds, set checkpointDir and runId.",
    "coll_cfg": "not supported: the tracker runs on the driver with xgboost's defaults.",
}

_I, _F, _S, _B = (TypeConverters.toInt, TypeConverters.toFloat, TypeConverters.toString,
                  TypeConverters.toBoolean)
_ANY = TypeConverters.identity  # JSON-ability is checked at save time

#: name: (converter, default, doc). Defaults are xgboost.spark's (but force_repartition);
#: None means xgboost's own default.
SHARED_PARAMS: dict[str, tuple[Any, Any, str]] = {
    "num_workers": (_I, 1, "XGBoost workers, one Spark barrier task each; at most the "
                           "cluster's task slots"),
    "device": (_S, "cpu", "'cpu', or 'cuda'/'gpu' to train each worker on its task's GPU"),
    "n_estimators": (_I, 100, "boosting rounds"),
    "max_depth": (_I, None, "maximum tree depth"),
    "max_leaves": (_I, None, "maximum leaves per tree (0: no limit)"),
    "max_bin": (_I, None, "maximum histogram bins per feature"),
    "grow_policy": (_S, None, "'depthwise' or 'lossguide'"),
    "learning_rate": (_F, None, "boosting learning rate (xgboost's eta)"),
    "verbosity": (_I, None, "xgboost log level, 0 (silent) to 3 (debug)"),
    "booster": (_S, None, "'gbtree', 'gblinear' or 'dart'"),
    "tree_method": (_S, None, "'hist' or 'approx' ('exact' is not distributed)"),
    "gamma": (_F, None, "minimum loss reduction to split a leaf"),
    "min_child_weight": (_F, None, "minimum hessian sum in a child"),
    "max_delta_step": (_F, None, "maximum delta step of each leaf output"),
    "subsample": (_F, None, "row subsample ratio per tree, in (0, 1]"),
    "sampling_method": (_S, None, "'uniform' or 'gradient_based'"),
    "colsample_bytree": (_F, None, "column subsample ratio per tree"),
    "colsample_bylevel": (_F, None, "column subsample ratio per level"),
    "colsample_bynode": (_F, None, "column subsample ratio per split"),
    "reg_alpha": (_F, None, "L1 regularisation of the weights"),
    "reg_lambda": (_F, None, "L2 regularisation of the weights"),
    "scale_pos_weight": (_F, None, "balance of positive and negative weights"),
    "base_score": (_ANY, None, "initial prediction score (a number, or a list per target)"),
    "random_state": (_I, None, "random seed"),
    "missing": (_F, float("nan"), "feature value treated as missing"),
    "num_parallel_tree": (_I, None, "trees grown per round (boosted random forest)"),
    "monotone_constraints": (_ANY, None, "per-feature monotonicity: '(1,0,-1)' or {name: 1}"),
    "interaction_constraints": (_ANY, None, "allowed interactions: '[[0, 1], [2]]' or lists"),
    "importance_type": (_S, None, "feature importance type"),
    "validate_parameters": (_B, None, "let xgboost warn about unused parameters"),
    "feature_types": (TypeConverters.toListString, None, "per-feature type, 'q' or 'c'"),
    "feature_weights": (TypeConverters.toListFloat, None, "per-feature column sampling weight"),
    "feature_names": (TypeConverters.toListString, None, "names of the features"),
    "max_cat_to_onehot": (_I, None, "one-hot split threshold for categorical features"),
    "max_cat_threshold": (_I, None, "maximum categories per split"),
    "multi_strategy": (_S, None, "'one_output_per_tree' or 'multi_output_tree'"),
    "eval_metric": (_ANY, None, "metric name, or list of names, on the validation rows"),
    "early_stopping_rounds": (_I, None, "stop after this many rounds without validation "
                                        "improvement (needs validationIndicatorCol)"),
    "verbose": (_B, False, "log evaluation results each round on the workers (off: quiet)"),
    "iteration_range": (TypeConverters.toListInt, None, "[begin, end) rounds used to predict"),
    # Off, as in xgboost.spark, which then repartitions only input that has not num_workers
    # partitions; sparkdist also repartitions when one of them is empty (an idle worker).
    "force_repartition": (_B, False, "repartition the input evenly over the workers even when "
                                     "it has num_workers partitions, none of them empty"),
    "repartition_random_shuffle": (_B, False, "repartition by a random key, not round-robin"),
    "enable_sparse_data_optim": (_B, False, "build sparse DMatrix from sparse vectors "
                                            "(requires missing=0)"),
    "launch_tracker_on_driver": (_B, True, "start xgboost's tracker on the driver"),
    "base_margin_col": (_S, None, "column of initial margins"),
    "pred_contrib_col": (_S, None, "output column of SHAP contributions (unset: none)"),
}
REGRESSION_PARAMS = {"objective": (_S, "reg:squarederror", "learning objective, e.g. "
                                    "'reg:squarederror', 'reg:absoluteerror', 'count:poisson'")}
_OUTPUT_COL_PARAMS = ("base_margin_col", "pred_contrib_col")  # defaults are "unset", not None
#: Every XGBoost Param classified: True when it shapes the booster a fit builds (in the
#: resume fingerprint, see ``_recovery``); device does not, so a run may resume on other
#: hardware. checkpointEvery does: the chunk boundaries restart xgboost's sampling.
TRAJECTORY: dict[str, bool] = {
    **RECOVERY_TRAJECTORY, **ELASTIC_TRAJECTORY, "checkpointEvery": True,
    **dict.fromkeys((
        "featuresCol", "labelCol", "weightCol", "validationIndicatorCol", "num_workers",
        "n_estimators", "max_depth", "max_leaves", "max_bin", "grow_policy", "learning_rate",
        "booster", "tree_method", "gamma", "min_child_weight", "max_delta_step", "subsample",
        "sampling_method", "colsample_bytree", "colsample_bylevel", "colsample_bynode",
        "reg_alpha", "reg_lambda", "scale_pos_weight", "base_score", "random_state",
        "missing", "num_parallel_tree", "monotone_constraints", "interaction_constraints",
        "feature_types", "feature_weights", "feature_names", "max_cat_to_onehot",
        "max_cat_threshold", "multi_strategy", "eval_metric", "early_stopping_rounds",
        "force_repartition", "repartition_random_shuffle", "enable_sparse_data_optim",
        "base_margin_col"), True),
    **dict.fromkeys((
        "device", "callbacks", "allowUnencrypted", "predictionCol", "pred_contrib_col",
        "iteration_range", "importance_type", "verbose", "verbosity", "validate_parameters",
        "launch_tracker_on_driver"), False),
}


def _declare(cls: type, table: dict[str, tuple[Any, Any, str]]) -> None:
    """Attach one class-level Param per table row, as pyspark's shared Params do."""
    for name, (converter, _, doc) in table.items():
        setattr(cls, name, Param(Params._dummy(), name, doc, typeConverter=converter))


def _defaults(table: dict[str, tuple[Any, Any, str]]) -> dict[str, Any]:
    return {n: d for n, (_, d, _) in table.items() if n not in _OUTPUT_COL_PARAMS}


class XGBoostParams(HasFeaturesCol, HasLabelCol, HasPredictionCol, HasWeightCol,
                    HasValidationIndicatorCol):
    """Params shared by every XGBoost estimator and model (see ``SHARED_PARAMS``)."""

    _table: ClassVar[dict[str, tuple[Any, Any, str]]] = SHARED_PARAMS

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(**_defaults(self._table))


class ClassifierParams(XGBoostParams, HasProbabilityCol, HasRawPredictionCol):
    """Classifier outputs: probability and raw-margin vectors besides the prediction."""


class RegressorParams(XGBoostParams):
    """The regressor's objective besides the shared Params."""

    _table = {**SHARED_PARAMS, **REGRESSION_PARAMS}


_declare(XGBoostParams, SHARED_PARAMS)
_declare(RegressorParams, REGRESSION_PARAMS)


class XGBoostFitParams(Params):
    """The estimators' Params that no model has: callbacks and allowUnencrypted."""

    callbacks: Param[Any] = Param(
        Params._dummy(), "callbacks", "xgboost TrainingCallback objects (training only; an "
        "estimator holding them cannot be saved)", typeConverter=_ANY)
    allowUnencrypted: Param[bool] = Param(
        Params._dummy(), "allowUnencrypted",
        "train on a cluster with Spark authentication/encryption on although XGBoost's "
        "traffic between workers is not encrypted", typeConverter=_B)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(allowUnencrypted=False)
