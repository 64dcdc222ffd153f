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
from sparkdist.torchtrain import compression, datacheck, loop, strategies
from sparkdist.torchtrain.strategies import STRATEGIES

if TYPE_CHECKING:
    from sparkdist.models.torch import TorchEstimator

USE_GPU = ("auto", True, False)
PIPELINE_SCHEDULES = ("gpipe", "1f1b")
COMPRESSIONS = ("none", "fp16", "bf16", "powersgd")
QUANTIZATIONS = ("none", "int8")
NAN_POLICIES = ("error", "drop")
_INDEX_STRINGS = "index string labels with FeatureAssembler(labelCol=...) or cast to double."


def check_params(est: TorchEstimator) -> None:
    """Every Param in its range and among its choices: ParamError naming it."""
    get = est.getOrDefault
    for name, low in (("batchSize", 1), ("epochs", 1), ("numWorkers", 1),
                      ("earlyStoppingPatience", 0), ("numClasses", 0),
                      ("checkpointEverySteps", 0), ("pipelineStages", 0), ("microBatches", 1),
                      ("syncEvery", 1), ("syncWarmupSteps", 0), ("maxStaleness", 0),
                      ("powerSgdRank", 1), ("minWorkers", 0)):
        if get(name) < low:
            raise ParamError(f"{name}={get(name)}: use {low} or more.")
    for name in ("learningRate", "timeoutSeconds", "rendezvousTimeoutSeconds",
                 "slotWaitSeconds"):
        if not get(name) > 0:
            raise ParamError(f"{name}={get(name)}: use a positive number.")
    if get("weightDecay") < 0 or not 0 <= get("validationFraction") < 1:
        raise ParamError("weightDecay must be >= 0 and validationFraction in [0, 1); got "
                         f"{get('weightDecay')} and {get('validationFraction')}.")
    check_one_of("optimizer", get("optimizer"), loop.OPTIMIZERS)
    check_one_of("nanPolicy", get("nanPolicy"), NAN_POLICIES)
    check_one_of("useGpu", get("useGpu"), USE_GPU)
    check_one_of("strategy", get("strategy"), STRATEGIES)
    check_one_of("pipelineSchedule", get("pipelineSchedule"), PIPELINE_SCHEDULES)
    check_one_of("gradientCompression", get("gradientCompression"), COMPRESSIONS)
    check_one_of("quantization", get("quantization"), QUANTIZATIONS)
    if get("minWorkers") > get("numWorkers"):
        raise ParamError(f"minWorkers={get('minWorkers')} is more than numWorkers="
                         f"{get('numWorkers')}: use at most numWorkers (0: numWorkers).")
    from sparkdist.torchtrain.backends import BACKENDS, HOROVOD_INSTALL, horovod_available

    check_one_of("backend", get("backend"), BACKENDS)
    compression.check_combination(get)
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


def rules(est: TorchEstimator) -> dict[str, Any]:
    """The Params :func:`datacheck.check_stats` applies, as plain values (they travel to the
    training ranks)."""
    get = est.getOrDefault
    return {"source": ", ".join(est.featureSource()), "label_col": get("labelCol"),
            "nan_policy": get("nanPolicy"), "batch_size": get("batchSize"),
            "loss": get("loss"), "num_classes": get("numClasses")}


def check_data(est: TorchEstimator, prepared: DataFrame, identity: bool = False) -> dict[str, Any]:
    """One Spark job over the data, for fits that must read it before launch (a class count
    to infer, a resume fingerprint): rows, vector lengths, bad values, label range, checked by
    :func:`datacheck.check_stats`; with ``identity`` also the content hash of the rows (the
    resume fingerprint's data identity)."""
    extra = [content_hash("features", "label", "is_validation")] if identity else []
    stats = prepared.agg(*_data_aggregates(), *extra).collect()[0].asDict()
    datacheck.check_stats(stats, rules(est))
    return stats


def input_width(est: TorchEstimator, schema: StructType, prepared: DataFrame) -> int | None:
    """Features per row, from the schema when it tells (numeric columns, a vector with ML
    attribute metadata), else from the first row: a job that reads one row, not the data.
    None when the first row cannot tell (a null vector); SchemaError for no rows at all."""
    width = schema_width(schema, est.featureSource())
    if width is not None:
        return width
    row = prepared.select(F.size("features").alias("width")).first()
    if row is None:
        raise empty_data_error("TorchEstimator.fit")
    return int(row["width"]) if row["width"] is not None and row["width"] > 0 else None


def schema_width(schema: StructType, columns: list[str]) -> int | None:
    """Features per row when the schema tells: numeric columns, or a vector column with ML
    attribute metadata (FeatureAssembler's); else None."""
    if len(columns) > 1:
        return len(columns)
    field = schema[columns[0]]
    if isinstance(field.dataType, NumericType):
        return 1
    width = field.metadata.get("ml_attr", {}).get("num_attrs")
    return int(width) if width else None


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
    strategies.check(spec, module)


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
    width = schema_width(schema, columns)
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


def _bad_features(features: Any) -> Any:
    """A null vector, or one holding a null, NaN or infinite value. Native expressions, not a
    lambda per element (a higher-order function runs interpreted): Spark orders NaN above
    every number, so ``array_max`` finds NaN and +inf, ``array_min`` -inf, and
    ``array_compact`` drops nulls."""
    largest, smallest = F.array_max(features), F.array_min(features)
    inf = F.lit(float("inf"))
    return features.isNull() | F.coalesce(
        F.isnan(largest) | (largest == inf) | (smallest == -inf)
        | (F.size(F.array_compact(features)) != F.size(features)), F.lit(False))


def good_row() -> Any:
    return ~(_bad_features(F.col("features")) | _bad_value(F.col("label")))


def _data_aggregates() -> list[Any]:
    label = F.col("label")
    good_label = F.when(~_bad_value(label), label)
    return [F.count(F.lit(1)).alias("rows"),
            F.min(F.size("features")).alias("min_dim"),
            F.max(F.size("features")).alias("max_dim"),
            F.count_if(~good_row()).alias("bad_rows"),
            F.min(good_label).alias("min_label"), F.max(good_label).alias("max_label"),
            F.count_if(good_label != F.floor(good_label)).alias("fractional")]


