"""TorchEstimator's checks of the data and the network, all before anything is launched: the
input's schema (turned into the ``features``/``label``/``is_validation`` columns the training
stage reads), one pass over the data (rows, vector lengths, bad values, label range), and the
network itself on two rows of zeros; also a loaded model's weights and the scoring side's
check of a DataFrame's features. The Params are checked where they become the typed spec
(:mod:`sparkdist.torchtrain.spec`). Functions of plain values and spec parts: this module
knows no estimator class (sparkdist.models.torch imports it, never the other way)."""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
from collections.abc import Callable
from typing import Any

from pyspark.ml.linalg import VectorUDT
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, BooleanType, IntegralType, NumericType, StructType

from sparkdist.columns import col, empty_data_error, require_columns, require_numeric
from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError
from sparkdist.models._recovery import content_hash
from sparkdist.torchtrain import datacheck, finetune, network, strategies
from sparkdist.torchtrain.spec import DataRules, InputField, TrainSpec

_INDEX_STRINGS = "index string labels with FeatureAssembler(labelCol=...) or cast to double."


def prepare(dataset: DataFrame, source: list[str], label: str | list[str],
            validation_col: str | None, fraction: float, seed: int,
            fields: tuple[InputField, ...] = (), weight_col: str = "") -> DataFrame:
    """Columns ``features`` (array<float>) or each typed input (``fields``), ``label``
    (float, or array<float> for an array label or a list of columns: labelCols), ``weight``
    (float, with ``weight_col``), ``is_validation``: the rows of ``validation_col`` where
    given, else a seeded hash split holding out ``fraction``."""
    weights = [weight_col] if weight_col else []
    labels = label if isinstance(label, list) else [label]
    columns = ([f.column for f in fields] or source) + labels + weights + (
        [validation_col] if validation_col else [])
    require_columns(dataset.schema, columns, "TorchEstimator")
    names = [f.name for f in fields] or ["features"]
    inputs = [input_column(dataset.schema, f) for f in fields] or [
        features_array(dataset.schema, source)]
    if validation_col:
        flag = _validation_flag(dataset.schema, validation_col)
    else:  # a seeded hash of the row: the same rows are held out on every run and retry
        bucket = F.abs(F.xxhash64(*inputs, F.lit(seed))) % 10**6
        flag = bucket < F.lit(int(fraction * 10**6)) if fraction else F.lit(False)
    for name in weights:
        require_numeric(dataset.schema, name, "weightCol", "cast the weights to double.")
    return dataset.select(*(c.alias(name) for c, name in zip(inputs, names)),
                          label_column(dataset.schema, label).alias("label"),
                          *(col(name).cast("float").alias("weight") for name in weights),
                          flag.alias("is_validation"))


# ------------------------------------------------------------------------------- labels
def label_column(schema: StructType, label: str | list[str]) -> Any:
    """The label as the training stage reads it: float, or array<float> for an array or
    vector label and for a list of label columns (labelCols, in their order)."""
    from pyspark.ml.functions import vector_to_array

    if isinstance(label, list):
        for name in label:
            require_numeric(schema, name, "labelCols", _INDEX_STRINGS)
        return F.array(*[col(name).cast("float") for name in label])
    dtype = schema[label].dataType
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col(label), "float32")
    if isinstance(dtype, ArrayType) and isinstance(dtype.elementType, NumericType):
        return col(label).cast("array<float>")
    require_numeric(schema, label, "labelCol", "use numbers, an array of numbers or an ML "
                    "vector; " + _INDEX_STRINGS)
    return col(label).cast("float")


def label_width(dataset: DataFrame, label: str | list[str], loss: str) -> int:
    """Values per row of the label: 0 for one number, else the array's length (from the
    first row, as the schema does not tell) or the number of labelCols. SchemaError for an
    array label with ``cross_entropy`` (one class index per row)."""
    if isinstance(label, list):
        require_columns(dataset.schema, label, "TorchEstimator")
        return len(label)
    require_columns(dataset.schema, [label], "TorchEstimator")
    if not isinstance(dataset.schema[label].dataType, ArrayType | VectorUDT):
        return 0
    if loss == "cross_entropy":
        raise SchemaError(f"labelCol '{label}' is an array, but loss='cross_entropy' takes one "
                          f"class index per row; use loss='bce' for several 0/1 labels, "
                          f"'mse' for several numbers, or a loss function.")
    row = dataset.select(F.size(label_column(dataset.schema, label)).alias("n")).first()
    if row is None:
        raise empty_data_error("TorchEstimator.fit")
    if not row["n"] or row["n"] < 1:
        raise SchemaError(f"labelCol '{label}': the first row's array is null or empty, so "
                          f"the label's length is unknown; drop rows without a label.")
    return int(row["n"])


# ------------------------------------------------------------------------- typed inputs
def input_fields(dataset: DataFrame, columns: dict[str, str], shapes: dict[str, list[int]],
                 longest: int, module: type) -> tuple[InputField, ...]:
    """The typed inputs (``inputCols``) from the columns' types and the network's ``forward``:
    SchemaError naming a missing or unsupported column, ParamError naming an argument
    ``forward`` does not take (or one it needs that inputCols leaves out). A fixed width the
    schema does not tell (a float array, a vector without metadata) comes from the first row:
    one job that reads a row."""
    if not columns:
        return ()
    require_columns(dataset.schema, list(columns.values()), "TorchEstimator")
    takes = _forward_arguments(module, columns)
    fields = [_input_field(dataset.schema, arg, name, shapes.get(arg), longest, takes)
              for arg, name in columns.items()]
    unknown = [f for f in fields if f.shape == (0,)]
    if unknown:
        widths = _first_row_widths(dataset, unknown)
        fields = [dataclasses.replace(f, shape=(widths[f.arg],)) if f.arg in widths else f
                  for f in fields]
    return tuple(fields)


def _forward_arguments(module: type, columns: dict[str, str]) -> set[str] | None:
    """The keyword arguments ``module.forward`` takes (None: any, it has ``**kwargs``);
    ParamError for an argument of inputCols it does not take, or one it needs that is not
    given."""
    forward = getattr(module, "forward")  # noqa: B009 (a type to mypy, a Module here)
    parameters = list(inspect.signature(forward).parameters.values())[1:]  # no self
    if any(p.kind is p.VAR_KEYWORD for p in parameters):
        return None
    takes = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    named = f"{module.__qualname__}.forward({', '.join(p.name for p in parameters)})"
    for arg in columns:
        if arg not in takes:
            raise ParamError(f"inputCols names the argument '{arg}', but {named} does not "
                             f"take it; name the arguments forward takes.")
    given = {*columns, *(f"{arg}_mask" for arg in columns)}  # a sequence's mask is given
    needed = [p.name for p in parameters if p.default is p.empty and p.name not in given
              and p.kind is not p.VAR_POSITIONAL]
    if needed:
        raise ParamError(f"{named} needs {needed}, which inputCols does not give; add "
                         f"them to inputCols (or give them defaults).")
    return takes


def _input_field(schema: StructType, arg: str, name: str, shape: list[int] | None,
                 longest: int, takes: set[str] | None) -> InputField:
    """One typed input; shape (0,) where its width is still to be read from a row."""
    dtype = schema[name].dataType
    element = dtype.elementType if isinstance(dtype, ArrayType) else dtype
    where = f"inputCols['{arg}'] (column '{name}')"
    if not isinstance(element, NumericType | BooleanType) and not isinstance(dtype, VectorUDT):
        raise SchemaError(f"{where} has type {dtype.simpleString()}; use numbers, integer ids, "
                          f"an ML vector or an array of numbers (index strings with "
                          f"StringIndexer, flatten nested arrays with F.flatten).")
    ints = isinstance(element, IntegralType)
    kind = "int64" if ints else "float32"
    mask = takes is not None and f"{arg}_mask" in takes
    if isinstance(dtype, ArrayType | VectorUDT):
        if shape:
            return InputField(arg, name, kind, tuple(shape))
        if ints:  # a variable-length sequence, the one kind with a mask
            return InputField(arg, name, kind, sequence=True, max_length=longest, mask=mask)
        width = schema_width(schema, [name]) if isinstance(dtype, VectorUDT) else None
        return InputField(arg, name, kind, (width or 0,))
    if shape and math.prod(shape) != 1:
        raise ParamError(f"inputShapes['{arg}']={shape}, but {where} holds one number per "
                         f"row; leave its shape out (or use [1]).")
    return InputField(arg, name, kind, tuple(shape or ()))


def _first_row_widths(dataset: DataFrame, fields: list[InputField]) -> dict[str, int]:
    """Values per row of each of ``fields``, read from the first row."""
    from pyspark.ml.functions import vector_to_array

    sizes = [F.size(vector_to_array(col(f.column)) if isinstance(
        dataset.schema[f.column].dataType, VectorUDT) else col(f.column)).alias(f.arg)
        for f in fields]
    row = dataset.select(*sizes).first()
    if row is None:
        raise empty_data_error("TorchEstimator.fit")
    widths = {f.arg: row[f.arg] for f in fields}
    empty = [f.describe() for f in fields if not widths[f.arg] or widths[f.arg] < 1]
    if empty:
        raise SchemaError(f"{', '.join(empty)}: the first row's array is null or empty, so "
                          f"its length is unknown; set its shape in inputShapes.")
    return widths


def input_column(schema: StructType, field: InputField) -> Any:
    """A typed input's column cast to what the feed holds: int64 ids or float32 values."""
    from pyspark.ml.functions import vector_to_array

    dtype = schema[field.column].dataType
    if isinstance(dtype, VectorUDT):
        return vector_to_array(col(field.column), "float32")
    value = "bigint" if field.dtype == "int64" else "float"
    return col(field.column).cast(f"array<{value}>" if isinstance(dtype, ArrayType) else value)


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
    resume fingerprint's data identity). Typed inputs' own values are checked by the ranks,
    in the pass that trains on them."""
    inputs = [f.name for f in rules.inputs] or ["features"]
    weights = ["weight"] if rules.weight_col else []
    extra = [content_hash(*inputs, "label", *weights, "is_validation")] if identity else []
    stats = prepared.agg(*_data_aggregates(rules), *extra).collect()[0].asDict()
    for field in rules.inputs:
        stats.update({f"{field.arg}.{name}": 0 for name in datacheck.INPUT_FIELDS})
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


def check_model(spec: TrainSpec) -> TrainSpec:
    """Build the network on the driver and run two rows of zeros through it; then the
    strategy's preflight. Returns ``spec`` with the embedding table sizes the network
    declares (``embedding_sizes``: a dict from argument to rows) for its typed inputs."""
    import torch

    model = spec.model
    inputs = network.dummy_inputs(model.input_dim, model.inputs)
    try:
        module = network.build_module(model.module, model.module_kwargs, model.input_dim,
                                      model.output_dim)
    except Exception as err:
        raise ParamError(f"model={model.module_name!r} with modelKwargs="
                         f"{model.module_kwargs} cannot be built: {type(err).__name__}: "
                         f"{err}") from err
    finetune.prepare(module, spec.finetune)  # ParamError naming initialWeights or freeze
    try:
        output = _check_forward(module, inputs)
    except Exception as err:
        raise ParamError(f"model={model.module_name!r} with modelKwargs="
                         f"{model.module_kwargs} fails on input of shape "
                         f"({network.describe_inputs(inputs)}): {type(err).__name__}: {err}"
                         ) from err
    if not isinstance(output, torch.Tensor):
        raise ParamError(f"model={model.module_name!r} returns {type(output).__name__}, not "
                         f"a tensor; return the outputs as one tensor.")
    width = int(math.prod(output.shape[1:])) if output.dim() > 1 else 1
    if output.shape[0] != 2 or (width != model.output_dim and not model.label_names):
        raise ParamError(f"model={model.module_name!r} returns shape "
                         f"{tuple(output.shape)} for 2 rows, but loss='{model.loss}' "
                         f"needs {model.output_dim} output(s) per row; set the model's "
                         f"output size (modelKwargs) to {model.output_dim}.")
    _check_loss(model, output)
    strategies.check(spec, module)
    return _with_table_sizes(spec, module)


def _check_forward(module: Any, inputs: Any) -> Any:
    """The network's output for ``inputs``, in eval mode without gradients. A network with
    tables on the meta device (``strategy="ps"``: no rank holds them whole) runs on the meta
    device (shapes only, no memory), and its output is zeros of that shape."""
    import torch

    module.eval()
    if any(parameter.is_meta for parameter in module.parameters()):
        module = copy.deepcopy(module).to("meta")
        inputs = ({name: value.to("meta") for name, value in inputs.items()}
                  if isinstance(inputs, dict) else inputs.to("meta"))
    with torch.no_grad():
        output = network.forward(module, inputs)
    if isinstance(output, torch.Tensor) and output.is_meta:
        output = torch.zeros(output.shape, dtype=output.dtype)
    return output


def _check_loss(model: Any, output: Any) -> None:
    """A loss function given by the user, on the network's two rows and zero labels: it must
    return one loss per row (ParamError naming it otherwise)."""
    import torch

    if model.loss in network.LOSSES:
        return
    label = torch.zeros((2, model.label_width) if model.label_width else (2,))
    try:
        losses = network.row_losses(model.loss_fn, output, label, model.label_names)
    except Exception as err:
        raise ParamError(f"loss={model.loss!r} fails on the network's output for 2 rows "
                         f"({tuple(output.shape)}) and labels {_labels_given(model)}: "
                         f"{type(err).__name__}: {err}") from err
    if not isinstance(losses, torch.Tensor) or tuple(losses.shape) != (2,):
        shape = tuple(losses.shape) if isinstance(losses, torch.Tensor) else type(losses)
        raise ParamError(f"loss={model.loss!r} returns {shape} for 2 rows; return one loss "
                         f"per row (e.g. reduction='none'): the fit averages them (weighted "
                         f"by weightCol) over the global batch.")


def _labels_given(model: Any) -> str:
    if model.label_names:
        return "{" + ", ".join(f"'{name}': [2]" for name in model.label_names) + "}"
    return f"[2, {model.label_width}]" if model.label_width else "[2]"


def _with_table_sizes(spec: TrainSpec, module: Any) -> TrainSpec:
    """``spec`` whose typed inputs carry the table sizes ``module.embedding_sizes`` declares."""
    sizes = getattr(module, "embedding_sizes", None) or {}
    if not spec.model.inputs or not sizes:
        return spec
    args = {f.arg for f in spec.model.inputs}
    if not isinstance(sizes, dict) or not all(
            arg in args and isinstance(n, int) and n > 0 for arg, n in sizes.items()):
        raise ParamError(f"model={spec.model.module_name!r} declares embedding_sizes={sizes!r}; "
                         f"use a dict from inputCols arguments ({sorted(args)}) to table rows.")
    fields = tuple(dataclasses.replace(f, num_embeddings=sizes.get(f.arg, 0))
                   for f in spec.model.inputs)
    return dataclasses.replace(spec, model=dataclasses.replace(spec.model, inputs=fields),
                               rules=dataclasses.replace(spec.rules, inputs=fields))


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


def _data_aggregates(rules: DataRules) -> list[Any]:
    """The stats row's aggregates; with typed inputs, the inputs' own figures come from the
    ranks, as do an array label's lengths and nulls (only the label's range and the weights
    are read here)."""
    label = F.col("label")
    low, high = (F.array_min(label), F.array_max(label)) if rules.label_width else (label,
                                                                                     label)
    bad_label = _bad_value(low) | _bad_value(high)
    weight = F.col("weight") if rules.weight_col else F.lit(1.0)
    whole = F.forall(label, lambda v: v == F.floor(v)) if rules.label_width else \
        label == F.floor(label)
    width = F.lit(0) if rules.inputs else F.size("features")
    bad = bad_label | (F.lit(False) if rules.inputs else _bad_features(F.col("features"))) | \
        _bad_value(weight)
    good = ~bad_label
    return [F.count(F.lit(1)).alias("rows"), F.min(width).alias("min_dim"),
            F.max(width).alias("max_dim"), F.count_if(bad).alias("bad_rows"),
            F.min(F.when(good, low)).alias("min_label"),
            F.max(F.when(good, high)).alias("max_label"),
            F.count_if(good & ~whole).alias("fractional"),
            F.count_if(weight < 0).alias("negative_weights")]
