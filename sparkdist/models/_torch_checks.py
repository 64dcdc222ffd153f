"""TorchEstimator's checks, all before anything is launched: its Params, the input's schema
(turned into the ``features``/``label``/``is_validation`` columns the training stage reads), one
pass over the data (rows, vector lengths, bad values, label range), and the network itself on
two rows of zeros. Also the scoring side's check of a DataFrame's features."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, NumericType, StructType

from sparkdist.columns import (
    check_one_of,
    col,
    empty_data_error,
    require_columns,
    require_numeric,
)
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.models._recovery import content_hash
from sparkdist.torchtrain import loop

if TYPE_CHECKING:
    from sparkdist.models.torch import TorchEstimator

USE_GPU = ("auto", True, False)
NAN_POLICIES = ("error", "drop")
_INDEX_STRINGS = "index string labels with FeatureAssembler(labelCol=...) or cast to double."


def check_params(est: TorchEstimator) -> None:
    """Every Param in its range and among its choices: ParamError naming it."""
    get = est.getOrDefault
    for name, low in (("batchSize", 1), ("epochs", 1), ("numWorkers", 1),
                      ("earlyStoppingPatience", 0), ("numClasses", 0),
                      ("checkpointEverySteps", 0)):
        if get(name) < low:
            raise ParamError(f"{name}={get(name)}: use {low} or more.")
    for name in ("learningRate", "timeoutSeconds", "rendezvousTimeoutSeconds"):
        if not get(name) > 0:
            raise ParamError(f"{name}={get(name)}: use a positive number.")
    if get("weightDecay") < 0 or not 0 <= get("validationFraction") < 1:
        raise ParamError("weightDecay must be >= 0 and validationFraction in [0, 1); got "
                         f"{get('weightDecay')} and {get('validationFraction')}.")
    check_one_of("optimizer", get("optimizer"), loop.OPTIMIZERS)
    check_one_of("nanPolicy", get("nanPolicy"), NAN_POLICIES)
    check_one_of("useGpu", get("useGpu"), USE_GPU)
    from sparkdist.torchtrain.backends import BACKENDS, HOROVOD_INSTALL, horovod_available

    check_one_of("backend", get("backend"), BACKENDS)
    if get("backend") == "horovod" and not horovod_available():
        raise ParamError(f"backend='horovod': {HOROVOD_INSTALL}")
    if get("earlyStoppingPatience") and not has_validation(est):
        raise ParamError("earlyStoppingPatience needs validation rows: set "
                         "validationFraction or validationCol.")


def has_validation(est: TorchEstimator) -> bool:
    return est.isSet("validationCol") or est.getOrDefault("validationFraction") > 0


def prepare(est: TorchEstimator, dataset: DataFrame) -> DataFrame:
    """Columns ``features`` (array<float>), ``label`` (float), ``is_validation``."""
    label = est.getOrDefault("labelCol")
    columns = est.featureSource() + [label]
    if est.isSet("validationCol"):
        columns.append(est.getOrDefault("validationCol"))
    require_columns(dataset.schema, columns, "TorchEstimator")
    features = features_array(dataset.schema, est.featureSource())
    require_numeric(dataset.schema, label, "labelCol", _INDEX_STRINGS)
    return dataset.select(features.alias("features"),
                          col(label).cast("float").alias("label"),
                          _validation_flag(est, dataset, features).alias("is_validation"))


def _validation_flag(est: TorchEstimator, dataset: DataFrame, features: Any) -> Any:
    if est.isSet("validationCol"):
        name = est.getOrDefault("validationCol")
        if not isinstance(dataset.schema[name].dataType, BooleanType):
            raise SchemaError(f"validationCol: column '{name}' has type "
                              f"{dataset.schema[name].dataType.simpleString()}; it must be "
                              f"boolean (true marks validation rows).")
        return F.coalesce(col(name), F.lit(False))
    fraction = est.getOrDefault("validationFraction")
    # a seeded hash of the row: the same rows are held out on every run and retry
    bucket = F.abs(F.xxhash64(features, F.lit(est.getOrDefault("seed")))) % 10**6
    return bucket < F.lit(int(fraction * 10**6)) if fraction else F.lit(False)


def check_data(est: TorchEstimator, prepared: DataFrame, identity: bool = False) -> dict[str, Any]:
    """One Spark job: rows, vector lengths, bad values, label range; with ``identity``
    also the content hash of the rows (the resume fingerprint's data identity)."""
    extra = [content_hash("features", "label", "is_validation")] if identity else []
    stats = prepared.agg(*_data_aggregates(), *extra).collect()[0].asDict()
    source = ", ".join(est.featureSource())
    if stats["rows"] == 0:
        raise empty_data_error("TorchEstimator.fit")
    if stats["min_dim"] != stats["max_dim"]:
        raise SchemaError(f"featuresCol: rows of '{source}' have between {stats['min_dim']} "
                          f"and {stats['max_dim']} values; every row needs the same length "
                          f"(assemble them with FeatureAssembler).")
    if stats["bad_rows"] and est.getOrDefault("nanPolicy") == "error":
        raise SchemaError(f"{stats['bad_rows']} of {stats['rows']} rows have NaN, infinite or "
                          f"null values in '{source}' or the label "
                          f"'{est.getOrDefault('labelCol')}'; clean them, impute them "
                          f"(FeatureAssembler nullPolicy='impute') or set nanPolicy='drop'.")
    good = stats["rows"] - (stats["bad_rows"] or 0)
    if est.getOrDefault("batchSize") > good:
        raise ParamError(f"batchSize={est.getOrDefault('batchSize')} exceeds the {good} "
                         f"usable rows; lower batchSize.")
    _check_labels(est, stats)
    return stats


def _check_labels(est: TorchEstimator, stats: dict[str, Any]) -> None:
    loss, label = est.getOrDefault("loss"), est.getOrDefault("labelCol")
    if loss not in ("bce", "cross_entropy"):
        return
    if stats["fractional"] or stats["min_label"] < 0 or (
            loss == "bce" and stats["max_label"] > 1):
        allowed = "0 and 1" if loss == "bce" else "class indices 0..k-1"
        hint = (" For more than 2 classes use loss='cross_entropy'." if loss == "bce"
                and not stats["fractional"] else "")
        raise SchemaError(f"labelCol: '{label}' holds values from {stats['min_label']} to "
                          f"{stats['max_label']}, but loss='{loss}' needs {allowed}.{hint}")
    classes = est.getOrDefault("numClasses")
    if loss == "cross_entropy" and classes and stats["max_label"] >= classes:
        raise ParamError(f"numClasses={classes} but labelCol '{label}' reaches "
                         f"{stats['max_label']:.0f}; raise numClasses or leave it 0.")


def check_model(spec: dict[str, Any]) -> None:
    """Build the network on the driver and run two rows of zeros through it."""
    import torch

    try:
        module = loop.build_module(spec["module"], spec["module_kwargs"], spec["input_dim"],
                                   spec["output_dim"])
        module.eval()
        with torch.no_grad():
            output = module(torch.zeros(2, spec["input_dim"]))
    except Exception as err:
        raise ParamError(f"model={spec['module_name']!r} with modelKwargs="
                         f"{spec['module_kwargs']} fails on input of shape "
                         f"(2, {spec['input_dim']}): {type(err).__name__}: {err}") from err
    width = int(math.prod(output.shape[1:])) if output.dim() > 1 else 1
    if output.shape[0] != 2 or width != spec["output_dim"]:
        raise ParamError(f"model={spec['module_name']!r} returns shape "
                         f"{tuple(output.shape)} for 2 rows, but loss='{spec['loss']}' "
                         f"needs {spec['output_dim']} output(s) per row; set the model's "
                         f"output size (modelKwargs) to {spec['output_dim']}.")


def scoring_features(schema: StructType, columns: list[str], dim: int) -> Any:
    """The features as array<float>, each row checked to hold ``dim`` numbers (the model's
    ``inputDim``).

    A width the schema already tells (numeric columns, a vector column with ML attribute
    metadata, e.g. FeatureAssembler's) is checked now: SchemaError. Otherwise scoring is
    lazy, so a null or wrong-length row stops the job that reaches it, with this message
    (Spark's USER_RAISED_EXCEPTION) rather than a failure inside the network."""
    source = ", ".join(f"'{c}'" for c in columns)
    fix = ("score the columns the model was fitted on, assembled the same way (the same "
           "FeatureAssemblerModel), with nulls imputed or dropped")
    width = len(columns) if len(columns) > 1 else (
        1 if isinstance(schema[columns[0]].dataType, NumericType)
        else schema[columns[0]].metadata.get("ml_attr", {}).get("num_attrs"))
    if width is not None and width != dim:
        raise SchemaError(f"featuresCol: {source} holds {width} features per row, but this "
                          f"TorchModel was trained on {dim}; {fix}.")
    features = features_array(schema, columns)
    size = F.size(features).cast("string")
    return (F.when(features.isNull() | F.exists(features, lambda v: v.isNull()),
                   F.raise_error(F.lit(f"TorchModel: a row of featuresCol {source} is null "
                                       f"or holds a null; {fix}.")))
            .when(F.size(features) != dim,
                  F.raise_error(F.concat(F.lit(f"TorchModel: a row of featuresCol {source} "
                                               "holds "), size,
                                         F.lit(f" values, but the model was trained on "
                                               f"{dim}; {fix}."))))
            .otherwise(features))


def features_array(schema: StructType, columns: list[str]) -> Any:
    """The features as one array<float> column: from a vector, an array or numeric columns."""
    from pyspark.ml.functions import vector_to_array

    if len(columns) > 1:
        for name in columns:
            require_numeric(schema, name, "featureCols", _INDEX_STRINGS)
        return F.array(*[col(name).cast("float") for name in columns])
    name = columns[0]
    dtype = schema[name].dataType
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col(name), "float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return col(name).cast("array<float>")
    if isinstance(dtype, NumericType):
        return F.array(col(name).cast("float"))
    raise SchemaError(f"featuresCol: column '{name}' has type {dtype.simpleString()}; use an "
                      f"ML vector, an array of numbers, or numeric columns in featureCols "
                      f"(FeatureAssembler builds a vector from any columns).")





def _bad_value(column: Any) -> Any:
    return column.isNull() | F.isnan(column) | (F.abs(column) == F.lit(float("inf")))


def good_row() -> Any:
    return ~(F.col("features").isNull() | F.exists("features", _bad_value)
             | _bad_value(F.col("label")))


def _data_aggregates() -> list[Any]:
    label = F.col("label")
    good_label = F.when(~_bad_value(label), label)
    return [F.count(F.lit(1)).alias("rows"),
            F.min(F.size("features")).alias("min_dim"),
            F.max(F.size("features")).alias("max_dim"),
            F.count_if(~good_row()).alias("bad_rows"),
            F.min(good_label).alias("min_label"), F.max(good_label).alias("max_label"),
            F.count_if(good_label != F.floor(good_label)).alias("fractional")]


