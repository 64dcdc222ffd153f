"""TorchEstimator's checks of the data and the network, all before anything is launched: the
input's schema (turned into the ``features``/``label``/``is_validation`` columns the training
stage reads), one pass over the data (rows, vector lengths, bad values, label range), and the
network itself on two rows of zeros; also a loaded model's weights and the scoring side's
check of a DataFrame's features. The Params are checked where they become the typed spec
(:mod:`sparkdist.torchtrain.spec`). Functions of plain values and spec parts: this module
knows no estimator class (sparkdist.models.torch imports it, never the other way)."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, NumericType, StructType

from sparkdist.columns import col, empty_data_error, require_columns, require_numeric
from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError
from sparkdist.models._recovery import content_hash
from sparkdist.torchtrain import datacheck, network, strategies
from sparkdist.torchtrain.spec import DataRules, TrainSpec

_INDEX_STRINGS = "index string labels with FeatureAssembler(labelCol=...) or cast to double."


def prepare(dataset: DataFrame, source: list[str], label: str, validation_col: str | None,
            fraction: float, seed: int) -> DataFrame:
    """Columns ``features`` (array<float>), ``label`` (float), ``is_validation``: the rows of
    ``validation_col`` where given, else a seeded hash split holding out ``fraction``."""
    columns = source + [label] + ([validation_col] if validation_col else [])
    require_columns(dataset.schema, columns, "TorchEstimator")
    features = features_array(dataset.schema, source)
    require_numeric(dataset.schema, label, "labelCol", _INDEX_STRINGS)
    if validation_col:
        flag = _validation_flag(dataset.schema, validation_col)
    else:  # a seeded hash of the row: the same rows are held out on every run and retry
        bucket = F.abs(F.xxhash64(features, F.lit(seed))) % 10**6
        flag = bucket < F.lit(int(fraction * 10**6)) if fraction else F.lit(False)
    return dataset.select(features.alias("features"),
                          col(label).cast("float").alias("label"),
                          flag.alias("is_validation"))


def _validation_flag(schema: StructType, name: str) -> Any:
    if not isinstance(schema[name].dataType, BooleanType):
        raise SchemaError(f"validationIndicatorCol: column '{name}' has type "
                          f"{schema[name].dataType.simpleString()}; it must be "
                          f"boolean (true marks validation rows).")
    return F.coalesce(col(name), F.lit(False))


def check_data(prepared: DataFrame, rules: DataRules, identity: bool = False) -> dict[str, Any]:
    """One Spark job over the data, for fits that must read it before launch (a class count
    to infer, a resume fingerprint): rows, vector lengths, bad values, label range, checked by
    :func:`datacheck.check_stats`; with ``identity`` also the content hash of the rows (the
    resume fingerprint's data identity)."""
    extra = [content_hash("features", "label", "is_validation")] if identity else []
    stats = prepared.agg(*_data_aggregates(), *extra).collect()[0].asDict()
    datacheck.check_stats(stats, rules)
    return stats


def input_width(schema: StructType, source: list[str], prepared: DataFrame) -> int | None:
    """Features per row, from the schema when it tells (numeric columns, a vector with ML
    attribute metadata), else from the first row: a job that reads one row, not the data.
    None when the first row cannot tell (a null vector); SchemaError for no rows at all."""
    width = schema_width(schema, source)
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


def check_model(spec: TrainSpec) -> None:
    """Build the network on the driver and run two rows of zeros through it; then the
    strategy's preflight."""
    import torch

    model = spec.model
    try:
        module = network.build_module(model.module, model.module_kwargs, model.input_dim,
                                   model.output_dim)
        module.eval()
        with torch.no_grad():
            output = module(torch.zeros(2, model.input_dim))
    except Exception as err:
        raise ParamError(f"model={model.module_name!r} with modelKwargs="
                         f"{model.module_kwargs} fails on input of shape "
                         f"(2, {model.input_dim}): {type(err).__name__}: {err}") from err
    width = int(math.prod(output.shape[1:])) if output.dim() > 1 else 1
    if output.shape[0] != 2 or width != model.output_dim:
        raise ParamError(f"model={model.module_name!r} returns shape "
                         f"{tuple(output.shape)} for 2 rows, but loss='{model.loss}' "
                         f"needs {model.output_dim} output(s) per row; set the model's "
                         f"output size (modelKwargs) to {model.output_dim}.")
    strategies.check(spec, module)


def check_weights(weights: dict[str, Any], module_class: type, name: str,
                  kwargs: dict[str, Any], dims: tuple[int, int], where: str) -> None:
    """A loaded model's weights against ``module_class`` (the class its ``model`` Param ``name``
    resolves to) built with its saved ``modelKwargs`` and (input, output) ``dims``:
    ModelLoadError naming ``where`` and the first differences unless every tensor name and
    shape matches. The network is never allocated from the (untrusted) saved kwargs: see
    :func:`network_shapes`."""
    # generous for any network these weights fit; far below what an edited kwarg can ask
    budget = (4 * sum(t.numel() * t.element_size() for t in weights.values()) + 2**28,
              64 * len(weights) + 10_000)
    try:
        shapes = network_shapes(lambda: network.build_module(module_class, kwargs, *dims),
                                *budget)
    except Exception as err:
        raise ModelLoadError(f"'{where}': model={name!r} with modelKwargs={kwargs} cannot be "
                             f"built ({type(err).__name__}: {err}); the metadata was edited "
                             "or does not belong to these weights. Save the model again.") \
            from err
    saved = {key: tuple(tensor.shape) for key, tensor in weights.items()}
    if shapes == saved:
        return
    differences = ([f"{key!r} missing" for key in shapes if key not in saved]
                   + [f"{key!r} unexpected" for key in saved if key not in shapes]
                   + [f"{key!r} is {saved[key]}, not {shape}" for key, shape
                      in shapes.items() if key in saved and saved[key] != shape])
    counts = [sum(math.prod(shape) for shape in d.values()) for d in (shapes, saved)]
    raise ModelLoadError(f"'{where}': its weights do not fit model={name!r} "
                         f"with modelKwargs={kwargs}: the network has "
                         f"{counts[0]} values in {len(shapes)} tensors, the weights {counts[1]} "
                         f"in {len(saved)} ({'; '.join(differences[:4])}"
                         f"{f'; {len(differences) - 4} more' if len(differences) > 4 else ''}). "
                         "The metadata or the weights were edited, or come from another model: "
                         "save the model again.")


def network_shapes(build: Callable[[], Any], max_bytes: int,
                   max_ops: int) -> dict[str, tuple[int, ...]]:
    """Names and shapes of the state dict of the network ``build()`` makes, without
    allocating it: built on the ``meta`` device. A constructor that cannot run there (it
    reads a value, e.g. ``.item()``) is built on the CPU instead, every allocation counted
    before it happens and refused past ``max_bytes`` (:func:`_allocation_budget`, also
    around the meta build, for tensors a constructor puts on the CPU explicitly, and capping
    the tensor operations at ``max_ops``: a kwarg asking for millions of tiny layers)."""
    import torch

    budgeted = _allocation_budget(max_bytes, max_ops)
    try:
        with torch.device("meta"), budgeted:
            module = build()
    except MemoryError:
        raise
    except Exception:  # the meta device cannot run it: on the CPU, within the budget
        with budgeted:
            module = build()
    return {name: tuple(tensor.shape) for name, tensor in module.state_dict().items()}


def _allocation_budget(max_bytes: int, max_ops: int) -> Any:
    """A torch dispatch mode that refuses (MemoryError), before it runs, an op whose new
    non-meta outputs would take the bytes allocated under it past ``max_bytes``, or that is
    past ``max_ops`` (an op counts once per tensor it returns). (Defined here, not at module
    level: torch is imported only when needed.)"""
    from torch.utils._python_dispatch import TorchDispatchMode

    class AllocationBudget(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.bytes_left, self.ops_left = max_bytes, max_ops

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            kwargs = kwargs or {}
            self.ops_left -= _output_count(func, args, kwargs)  # before it makes them
            planned = _planned_bytes(func, args, kwargs) if self.ops_left >= 0 else 0
            if planned > self.bytes_left or self.ops_left < 0:
                raise MemoryError(f"building the network takes more memory or tensor "
                                  f"operations than its weights can need (at most {max_bytes} "
                                  f"bytes and {max_ops} operations)")
            self.bytes_left -= planned
            return func(*args, **kwargs)

    return AllocationBudget()


def _output_count(func: Any, args: Any, kwargs: dict[str, Any]) -> int:
    """1, or for an op returning a list of tensors (unbind, split: iterating a tensor) at most
    the longest dimension of its inputs: counted as operations, since each is a tensor object
    (``[x.item() for x in torch.linspace(0, 1, depth)]`` makes ``depth`` of them)."""
    import torch
    from torch.utils._pytree import tree_flatten

    if not any("List[Tensor]" in str(ret.type) for ret in func._schema.returns):
        return 1
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    return max([1, *(size for t in tensors for size in t.shape)])


def _planned_bytes(func: Any, args: Any, kwargs: dict[str, Any]) -> int:
    """Bytes the op's outputs would take off the meta device; 0 when it writes nothing new
    (a view, an in-place op), runs on meta, or cannot run on meta (its output then depends
    on values, e.g. ``.item()``: bounded by its inputs, already counted)."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_map

    if any(ret.alias_info is not None for ret in func._schema.returns):
        return 0
    tensors = [x for x in tree_flatten((args, kwargs))[0] if isinstance(x, torch.Tensor)]
    device = kwargs.get("device")
    on_meta = (torch.device(device).type == "meta" if device is not None
               else bool(tensors) and all(t.is_meta for t in tensors))
    if on_meta:
        return 0

    def meta(x: Any) -> Any:
        return x.to("meta") if isinstance(x, torch.Tensor) else x

    meta_kwargs = tree_map(meta, kwargs)
    if any(argument.name == "device" for argument in func._schema.arguments):
        meta_kwargs["device"] = torch.device("meta")  # a factory: its default is the CPU
    try:
        out = func(*tree_map(meta, args), **meta_kwargs)
    except Exception:
        return 0
    return sum(t.numel() * t.element_size() for t in tree_flatten(out)[0]
               if isinstance(t, torch.Tensor))


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
