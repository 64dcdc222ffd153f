"""FeatureAssembler: one feature contract for every sparkdist model family.

Numeric columns pass through (optionally standardised), categorical columns are indexed and
one-hot encoded (a category unseen at fit time encodes as all zeros), vector columns are
appended as they are. Missing values, null or NaN, follow ``nullPolicy``; fit refuses
infinities in numeric columns. The label is cast to double, or indexed when it is a string:
fit refuses a null string label, transform refuses a label unseen at fit and keeps a null one
as null (an unknown outcome). Under ``nullPolicy="drop"`` transform drops rows too, so it can
return fewer rows than it read. Column names may hold any character, ``.`` and backticks
included. Internally the work is done by MLlib stages, so it scales like them.
"""

from __future__ import annotations

from functools import reduce
from typing import Any

from pyspark import keyword_only
from pyspark.ml import Estimator, Model, Pipeline, PipelineModel
from pyspark.ml.feature import (
    OneHotEncoder,
    StandardScaler,
    StringIndexer,
    StringIndexerModel,
    VectorAssembler,
)
from pyspark.ml.linalg import VectorUDT
from pyspark.ml.param import Param, Params, TypeConverters
from pyspark.ml.param.shared import HasLabelCol, HasOutputCol
from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import AtomicType, DataType, DoubleType, FloatType, StringType, StructType

from sparkdist.columns import check_one_of, col, empty_data_error, is_numeric, require_columns
from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError
from sparkdist.features._accessors_assembly import (
    _FeatureAssemblerAccessors,
    _FeatureAssemblerModelAccessors,
)
from sparkdist.persist import ParamsPersistence, PersistentModel, load_model, save_model

NULL_POLICIES = ("error", "drop", "impute")
_TMP = "_sparkdist_"  # prefix of the working columns a transform adds and drops again


class _FeatureAssemblerParams(HasLabelCol, HasOutputCol):
    numericCols: Param[Any] = Param(
        Params._dummy(), "numericCols", "numeric input columns (any numeric or boolean type)",
        typeConverter=TypeConverters.toListString,
    )
    categoricalCols: Param[Any] = Param(
        Params._dummy(), "categoricalCols",
        "categorical input columns, indexed and one-hot encoded; unseen values encode as zeros",
        typeConverter=TypeConverters.toListString,
    )
    vectorCols: Param[Any] = Param(
        Params._dummy(), "vectorCols", "input columns that already hold ML vectors",
        typeConverter=TypeConverters.toListString,
    )
    nullPolicy: Param[Any] = Param(
        Params._dummy(), "nullPolicy",
        "missing (null or NaN) values in input columns: 'error' (refuse at fit), 'drop' (drop "
        "the row, at fit and at transform) or 'impute' (training mean for numeric, most "
        "frequent value for categorical columns)",
        typeConverter=TypeConverters.toString,
    )
    standardize: Param[Any] = Param(
        Params._dummy(), "standardize",
        "scale numeric columns to zero mean and unit variance (training statistics)",
        typeConverter=TypeConverters.toBoolean,
    )

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(
            numericCols=[], categoricalCols=[], vectorCols=[], labelCol="label",
            outputCol="features", nullPolicy="error", standardize=False,
        )

    def _inputs(self) -> list[tuple[str, str]]:
        """(param name, column) for every input column, in vector order."""
        return [
            (param, name)
            for param in ("numericCols", "categoricalCols", "vectorCols")
            for name in self.getOrDefault(param)
        ]


class FeatureAssembler(Estimator, _FeatureAssemblerParams, ParamsPersistence,
                       _FeatureAssemblerAccessors):
    """Assemble numeric, categorical and vector columns into one feature vector.

    Examples
    --------
    >>> assembler = FeatureAssembler(numericCols=["month_interaction_count"],
    ...                              categoricalCols=["plan"],
    ...                              labelCol="cancelled_within_week", nullPolicy="impute")
    >>> model = assembler.fit(train)
    >>> model.featureNames
    ['month_interaction_count', 'plan=basic', 'plan=premium', 'plan=standard']
    >>> model.transform(test).select("features", "cancelled_within_week").first()
    Row(features=DenseVector([42.0, 1.0, 0.0, 0.0]), cancelled_within_week=0.0)
    """

    @keyword_only
    def __init__(self, *, numericCols: list[str] | None = None,
                 categoricalCols: list[str] | None = None, vectorCols: list[str] | None = None,
                 labelCol: str = "label", outputCol: str = "features",
                 nullPolicy: str = "error", standardize: bool = False) -> None:
        super().__init__()
        self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    @keyword_only
    def setParams(self, *, numericCols: list[str] | None = None,
                  categoricalCols: list[str] | None = None, vectorCols: list[str] | None = None,
                  labelCol: str = "label", outputCol: str = "features",
                  nullPolicy: str = "error", standardize: bool = False) -> FeatureAssembler:
        return self._set(**self._input_kwargs)  # type: ignore[attr-defined]

    def _fit(self, dataset: DataFrame) -> FeatureAssemblerModel:
        self._validate(dataset.schema)
        fill = self._check_values(dataset)
        labels = self._label_values(dataset)
        model = FeatureAssemblerModel(fill=fill, labels=labels)
        self._copyValues(model)
        working = model._working(dataset)
        model._stages = Pipeline(stages=model._stage_plan()).fit(working)
        model.featureNames = model._feature_names(working)
        return model

    def _validate(self, schema: StructType) -> None:
        inputs = self._inputs()
        if not inputs:
            raise ParamError("FeatureAssembler needs at least one of numericCols, "
                             "categoricalCols or vectorCols.")
        check_one_of("nullPolicy", self.getOrDefault(self.nullPolicy), NULL_POLICIES)
        columns = [name for _, name in inputs]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise ParamError(f"column(s) {repeated} are listed more than once across "
                             "numericCols, categoricalCols and vectorCols; list each once.")
        for param, name in inputs:
            require_columns(schema, [name], param)
            _check_type(param, name, schema[name].dataType)
        out = self.getOutputCol()
        if out in schema.fieldNames():
            raise SchemaError(f"outputCol '{out}' already exists in the DataFrame; "
                              "set outputCol to a new name or drop that column first.")
        if self.isSet(self.labelCol):
            require_columns(schema, [self.getLabelCol()], "labelCol")
        label = self.getLabelCol()
        if label in schema.fieldNames():
            _check_label_type(label, schema[label].dataType)

    def _check_values(self, dataset: DataFrame) -> dict[str, Any]:
        """One pass: row, missing (null or NaN) and infinity counts; refuse empty data,
        infinities, all-missing columns, null string labels and (under 'error') any missing
        value. Returns the impute values (training mean / mode)."""
        inputs, schema = self._inputs(), dataset.schema
        numeric = self.getOrDefault(self.numericCols)
        values = {c: _missing_as_null(col(c), schema[c].dataType) for _, c in inputs}
        aggs = [F.count(F.lit(1)).alias("rows")]
        aggs += [F.count_if(values[c].isNull()).alias(f"n{i}") for i, (_, c) in enumerate(inputs)]
        aggs += [F.count_if(F.abs(col(c)) == float("inf")).alias(f"inf{i}")
                 for i, c in enumerate(numeric) if isinstance(schema[c].dataType, _FLOATS)]
        aggs += [F.avg(values[c].cast("double")).alias(f"m{i}") for i, c in enumerate(numeric)]
        label = self.getLabelCol()
        string_label = label in schema.fieldNames() and isinstance(schema[label].dataType,
                                                                   StringType)
        if string_label:
            aggs.append(F.count_if(col(label).isNull()).alias("label_nulls"))
        row = dataset.agg(*aggs).first()
        assert row is not None
        stats = row.asDict()
        rows = stats["rows"]
        if rows == 0:
            raise empty_data_error("FeatureAssembler.fit")
        infinite = {c: stats[f"inf{i}"] for i, c in enumerate(numeric)
                    if stats.get(f"inf{i}")}
        if infinite:
            # No policy fits: an inf cannot be imputed over, and one inf turns the whole
            # column into NaN under standardize (mean inf, std NaN).
            raise SchemaError(f"numericCols: infinite values in {infinite} (column: count); "
                              "replace them first, e.g. cap them at a finite value or set them "
                              "to null and choose a nullPolicy.")
        nulls = {c: stats[f"n{i}"] for i, (_, c) in enumerate(inputs) if stats[f"n{i}"]}
        for param, c in inputs:
            if nulls.get(c) == rows:
                raise SchemaError(f"{param}: column '{c}' is null in all {rows} rows (NaN "
                                  f"counts as null); remove it from {param}.")
        if string_label and stats["label_nulls"]:
            raise SchemaError(f"labelCol: column '{label}' is null in {stats['label_nulls']} of "
                              f"{rows} rows; a training row needs its label. Drop those rows "
                              f"first (df.dropna(subset=['{label}'])) or fill them.")
        return self._fill_values(dataset, nulls, [stats[f"m{i}"] for i in range(len(numeric))])

    def _fill_values(self, dataset: DataFrame, nulls: dict[str, int],
                     means: list[float]) -> dict[str, Any]:
        """Impute values for every input column: nulls may first appear at transform time."""
        policy = self.getOrDefault(self.nullPolicy)
        if policy == "error" and nulls:
            raise SchemaError(f"missing values in input columns {nulls} (column: count of nulls "
                              "and NaNs) under "
                              "nullPolicy='error'; set nullPolicy='drop' to drop those rows or "
                              "'impute' to fill them with training means and modes.")
        if policy != "impute":
            return {}
        vectors = [c for c in self.getOrDefault(self.vectorCols) if c in nulls]
        if vectors:
            raise SchemaError(f"vectorCols {vectors} contain nulls, which cannot be imputed; "
                              "use nullPolicy='drop' or fill them before assembling.")
        fill: dict[str, Any] = dict(zip(self.getOrDefault(self.numericCols), means))
        for c in self.getOrDefault(self.categoricalCols):
            fill[c] = _mode(dataset, c)
        return fill

    def _label_values(self, dataset: DataFrame) -> list[str] | None:
        """Sorted label strings for a string label (indexed 0..k-1), else None."""
        label = self.getLabelCol()
        if label not in dataset.columns or not isinstance(dataset.schema[label].dataType,
                                                         StringType):
            return None
        rows = dataset.select(col(label)).where(col(label).isNotNull()).distinct().collect()
        return sorted(r[0] for r in rows)


class FeatureAssemblerModel(Model, _FeatureAssemblerParams, PersistentModel,
                            _FeatureAssemblerModelAccessors):
    """A fitted :class:`FeatureAssembler`.

    Attributes
    ----------
    featureNames : list of str
        The name of each slot of the output vector (``plan=basic`` for one-hot slots).
    labels : list of str or None
        For a string label, the label of each index (0.0, 1.0, ...).
    """

    def __init__(self, fill: dict[str, Any] | None = None,
                 labels: list[str] | None = None) -> None:
        super().__init__()
        self.fill = dict(fill or {})
        self.labels = labels
        self.featureNames: list[str] = []
        self._stages: PipelineModel | None = None

    def _transform(self, dataset: DataFrame) -> DataFrame:
        assert self._stages is not None, "FeatureAssemblerModel has no fitted stages"
        require_columns(dataset.schema, [c for _, c in self._inputs()], "FeatureAssemblerModel")
        out_col = self.getOutputCol()
        if out_col in dataset.columns:
            raise SchemaError(f"outputCol '{out_col}' already exists in the DataFrame; drop or "
                              "rename that column first, or fit the assembler with another "
                              "outputCol.")
        self._check_unseen_labels(dataset)
        out = self._stages.transform(self._working(dataset))
        out = out.withColumn(out_col, self._with_names(col(out_col)))
        out = out.drop(*[c for c in out.columns if c.startswith(_TMP)])
        return self._label(out)

    def rows_dropped(self, dataset: DataFrame) -> int:
        """How many rows of ``dataset`` :meth:`transform` leaves out: those with a missing
        input value under ``nullPolicy="drop"`` (one Spark job), else 0 (no job)."""
        if self.getOrDefault(self.nullPolicy) != "drop":
            return 0
        require_columns(dataset.schema, [c for _, c in self._inputs()], "FeatureAssemblerModel")
        missing = [self._working_col(param, c, dataset.schema[c].dataType).isNull()
                   for param, c in self._inputs()]
        return dataset.where(reduce(Column.__or__, missing)).count()

    # -- how a DataFrame becomes the working columns the stages read -----------------------
    def _working(self, dataset: DataFrame) -> DataFrame:
        """Apply the null policy into working columns; the user's columns stay untouched."""
        names = [_TMP + f"in{i}" for i in range(len(self._inputs()))]
        extra = [self._working_col(param, c, dataset.schema[c].dataType).alias(name)
                 for (param, c), name in zip(self._inputs(), names)]
        working = dataset.select("*", *extra)
        if self.getOrDefault(self.nullPolicy) == "drop":  # NaN is already null here
            working = working.where(reduce(Column.__and__, [F.col(n).isNotNull() for n in names]))
        return working

    def _working_col(self, param: str, name: str, dtype: DataType) -> Column:
        kind = {"numericCols": "double", "categoricalCols": "string"}.get(param)
        value = _missing_as_null(col(name), dtype)
        value = value if kind is None else value.cast(kind)
        if name in self.fill:
            value = F.coalesce(value, F.lit(self.fill[name]).cast(kind or "double"))
        return value

    def _stage_plan(self) -> list[Any]:
        names = {name: _TMP + f"in{i}" for i, (_, name) in enumerate(self._inputs())}
        numeric = [names[c] for c in self.getOrDefault(self.numericCols)]
        categorical = [names[c] for c in self.getOrDefault(self.categoricalCols)]
        vectors = [names[c] for c in self.getOrDefault(self.vectorCols)]
        stages: list[Any] = []
        if numeric and self.getOrDefault(self.standardize):
            stages += [VectorAssembler(inputCols=numeric, outputCol=_TMP + "num"),
                       StandardScaler(inputCol=_TMP + "num", outputCol=_TMP + "scaled",
                                      withMean=True, withStd=True)]
            numeric = [_TMP + "scaled"]
        onehot = [c + "_onehot" for c in categorical]
        if categorical:
            indexed = [c + "_index" for c in categorical]
            stages += [StringIndexer(inputCols=categorical, outputCols=indexed,
                                     handleInvalid="keep", stringOrderType="alphabetAsc"),
                       # The indexer puts unseen values in a last, extra category; dropLast
                       # drops exactly that slot, so an unseen value encodes as all zeros.
                       OneHotEncoder(inputCols=indexed, outputCols=onehot, dropLast=True)]
        stages.append(VectorAssembler(inputCols=numeric + onehot + vectors,
                                      outputCol=self.getOutputCol(), handleInvalid="error"))
        return stages

    # -- names and label ---------------------------------------------------------------
    def _feature_names(self, working: DataFrame) -> list[str]:
        assert self._stages is not None
        names = list(self.getOrDefault(self.numericCols))
        indexers = [s for s in self._stages.stages if isinstance(s, StringIndexerModel)]
        for name, labels in zip(self.getOrDefault(self.categoricalCols),
                                indexers[0].labelsArray if indexers else []):
            names += [f"{name}={label}" for label in labels]
        vectors = self.getOrDefault(self.vectorCols)
        if vectors:
            first = working.select(*[col(c) for c in vectors]).where(
                reduce(Column.__and__, [col(c).isNotNull() for c in vectors])).first()
            assert first is not None, "vectorCols are null in every row"
            for c in vectors:
                names += [f"{c}[{j}]" for j in range(first[c].size)]
        return names

    def _with_names(self, features: Column) -> Column:
        """Attach slot names as ML attributes, so downstream stages report real names."""
        attrs = [{"idx": i, "name": n} for i, n in enumerate(self.featureNames)]
        meta = {"ml_attr": {"attrs": {"numeric": attrs}, "num_attrs": len(attrs)}}
        return features.alias(self.getOutputCol(), metadata=meta)

    def _label(self, dataset: DataFrame) -> DataFrame:
        label = self.getLabelCol()
        if label not in dataset.columns:
            return dataset
        if self.labels is None:
            return dataset.withColumn(label, col(label).cast("double"))
        # A null label (an unknown outcome, as in scoring data) stays null.
        index = F.create_map(*[F.lit(v) for i, name in enumerate(self.labels)
                               for v in (name, float(i))])
        return dataset.withColumn(label, F.try_element_at(index, col(label)))

    def _check_unseen_labels(self, dataset: DataFrame) -> None:
        """Refuse a string label the model has no index for (one job over the label column;
        a streaming DataFrame cannot run it, and there such a label becomes null)."""
        label = self.getLabelCol()
        if self.labels is None or label not in dataset.columns or dataset.isStreaming:
            return
        value = col(label).cast("string")
        unseen = dataset.where(value.isNotNull() & ~value.isin(self.labels)).select(value).first()
        if unseen is not None:
            raise SchemaError(f"labelCol: column '{label}' holds {unseen[0]!r}, a label not seen "
                              f"at fit (known labels: {self.labels}); drop or relabel those rows, "
                              "or refit on data that includes it.")

    # -- persistence -------------------------------------------------------------------
    def _state(self) -> dict[str, Any]:
        return {"fill": self.fill, "labels": self.labels, "featureNames": self.featureNames}

    def _save_artifacts(self, path: str) -> None:
        assert self._stages is not None
        save_model(self._stages, f"{path}/stages")

    @classmethod
    def _from_state(cls, state: dict[str, Any], path: str) -> FeatureAssemblerModel:
        model = cls(fill=state["fill"], labels=state["labels"])
        model.featureNames = state["featureNames"]
        stages = load_model(f"{path}/stages")  # the same class allowlist as every load
        if not isinstance(stages, PipelineModel):
            raise ModelLoadError(f"'{path}/stages' holds a {type(stages).__name__}, not the "
                                 "PipelineModel a FeatureAssemblerModel saves.")
        model._stages = stages
        return model


def _check_type(param: str, name: str, dtype: Any) -> None:
    if param == "numericCols" and not is_numeric(dtype):
        raise SchemaError(f"numericCols: column '{name}' has type {dtype.simpleString()}, not a "
                          "numeric type; move it to categoricalCols, or cast it first "
                          f"(F.col('{name}').cast('double')).")
    if param == "vectorCols" and not isinstance(dtype, VectorUDT):
        raise SchemaError(f"vectorCols: column '{name}' has type {dtype.simpleString()}, not an "
                          "ML vector; list numeric columns under numericCols, or build the "
                          "vector with pyspark.ml.functions.array_to_vector.")
    if param == "categoricalCols" and not isinstance(dtype, AtomicType):
        raise SchemaError(f"categoricalCols: column '{name}' has type {dtype.simpleString()}; "
                          "categories must be strings, numbers or booleans.")


def _check_label_type(label: str, dtype: Any) -> None:
    if not (is_numeric(dtype) or isinstance(dtype, StringType)):
        raise SchemaError(f"labelCol: column '{label}' has type {dtype.simpleString()}; a label "
                          "must be numeric, boolean or string.")


_FLOATS = (FloatType, DoubleType)


def _missing_as_null(value: Column, dtype: DataType) -> Column:
    """NaN as null: both are missing (MLlib's assembler refuses NaN, and avg spreads it)."""
    return F.nanvl(value, F.lit(None).cast(dtype)) if isinstance(dtype, _FLOATS) else value


def _mode(dataset: DataFrame, name: str) -> str:
    """Most frequent non-missing value of ``name`` as a string (ties: smallest value)."""
    value = _missing_as_null(col(name), dataset.schema[name].dataType).cast("string")
    row = (dataset.where(value.isNotNull()).groupBy(value.alias("v")).count()
           .orderBy(F.desc("count"), F.asc("v")).first())
    assert row is not None
    return row["v"]
