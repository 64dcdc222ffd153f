"""FeatureAssembler: one feature contract for every sparkdist model family.

Numeric columns pass through (optionally standardised), categorical columns are indexed and
one-hot encoded (a category unseen at fit time encodes as all zeros), vector columns are
appended as they are. Nulls follow ``nullPolicy``. The label is cast to double, or indexed
when it is a string. Internally the work is done by MLlib stages, so it scales like them.
"""

from __future__ import annotations

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
from pyspark.sql.types import AtomicType, StringType, StructType

from sparkdist.columns import is_numeric, require_columns, suggest
from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError
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
        "nulls in input columns: 'error' (refuse at fit), 'drop' (drop the row) or 'impute' "
        "(training mean for numeric, most frequent value for categorical columns)",
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
            (param, col)
            for param in ("numericCols", "categoricalCols", "vectorCols")
            for col in self.getOrDefault(param)
        ]


class FeatureAssembler(Estimator, _FeatureAssemblerParams, ParamsPersistence):
    """Assemble numeric, categorical and vector columns into one feature vector.

    Examples
    --------
    >>> assembler = FeatureAssembler(numericCols=["month_interaction_count"],
    ...                              categoricalCols=["plan"],
    ...                              labelCol="cancelled_within_week", nullPolicy="impute")
    >>> model = assembler.fit(train)
    >>> model.transform(test).select("features", "cancelled_within_week")
    >>> model.featureNames  # ['month_interaction_count', 'plan=basic', ...]
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
        fill = self._check_nulls(dataset)
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
        policy = self.getOrDefault(self.nullPolicy)
        if policy not in NULL_POLICIES:
            raise ParamError(f"nullPolicy={policy!r} is not one of {NULL_POLICIES}."
                             f"{suggest(policy, NULL_POLICIES)}")
        columns = [col for _, col in inputs]
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        if repeated:
            raise ParamError(f"column(s) {repeated} are listed more than once across "
                             "numericCols, categoricalCols and vectorCols; list each once.")
        for param, col in inputs:
            require_columns(schema, [col], param)
            _check_type(param, col, schema[col].dataType)
        out = self.getOutputCol()
        if out in schema.fieldNames():
            raise SchemaError(f"outputCol '{out}' already exists in the DataFrame; "
                              "set outputCol to a new name or drop that column first.")
        if self.isSet(self.labelCol):
            require_columns(schema, [self.getLabelCol()], "labelCol")
        label = self.getLabelCol()
        if label in schema.fieldNames():
            _check_label_type(label, schema[label].dataType)

    def _check_nulls(self, dataset: DataFrame) -> dict[str, Any]:
        """One pass: row and null counts; refuse empty data, all-null columns and (under
        'error') any null. Returns the impute values (training mean / mode)."""
        inputs = self._inputs()
        aggs = [F.count(F.lit(1)).alias("rows")]
        aggs += [F.count_if(F.col(c).isNull()).alias(f"n{i}") for i, (_, c) in enumerate(inputs)]
        numeric = self.getOrDefault(self.numericCols)
        aggs += [F.avg(F.col(c).cast("double")).alias(f"m{i}") for i, c in enumerate(numeric)]
        stats = dataset.agg(*aggs).first()
        assert stats is not None
        if stats["rows"] == 0:
            raise SchemaError("FeatureAssembler.fit got an empty DataFrame (0 rows); "
                              "check the filter or split that produced it.")
        nulls = {c: stats[f"n{i}"] for i, (_, c) in enumerate(inputs) if stats[f"n{i}"]}
        for param, col in inputs:
            if nulls.get(col) == stats["rows"]:
                raise SchemaError(f"{param}: column '{col}' is null in all {stats['rows']} "
                                  f"rows; remove it from {param}.")
        return self._fill_values(dataset, nulls, [stats[f"m{i}"] for i in range(len(numeric))])

    def _fill_values(self, dataset: DataFrame, nulls: dict[str, int],
                     means: list[float]) -> dict[str, Any]:
        """Impute values for every input column: nulls may first appear at transform time."""
        policy = self.getOrDefault(self.nullPolicy)
        if policy == "error" and nulls:
            raise SchemaError(f"nulls in input columns {nulls} (column: null count) under "
                              "nullPolicy='error'; set nullPolicy='drop' to drop those rows or "
                              "'impute' to fill them with training means and modes.")
        if policy != "impute":
            return {}
        vectors = [c for c in self.getOrDefault(self.vectorCols) if c in nulls]
        if vectors:
            raise SchemaError(f"vectorCols {vectors} contain nulls, which cannot be imputed; "
                              "use nullPolicy='drop' or fill them before assembling.")
        fill: dict[str, Any] = dict(zip(self.getOrDefault(self.numericCols), means))
        for col in self.getOrDefault(self.categoricalCols):
            fill[col] = _mode(dataset, col)
        return fill

    def _label_values(self, dataset: DataFrame) -> list[str] | None:
        """Sorted label strings for a string label (indexed 0..k-1), else None."""
        label = self.getLabelCol()
        if label not in dataset.columns or not isinstance(dataset.schema[label].dataType,
                                                         StringType):
            return None
        rows = dataset.select(label).where(F.col(label).isNotNull()).distinct().collect()
        return sorted(r[0] for r in rows)


class FeatureAssemblerModel(Model, _FeatureAssemblerParams, PersistentModel):
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
        out = self._stages.transform(self._working(dataset))
        out = out.withColumn(self.getOutputCol(), self._with_names(F.col(self.getOutputCol())))
        out = out.drop(*[c for c in out.columns if c.startswith(_TMP)])
        return self._label(out)

    # -- how a DataFrame becomes the working columns the stages read -----------------------
    def _working(self, dataset: DataFrame) -> DataFrame:
        """Apply the null policy into working columns; the user's columns stay untouched."""
        if self.getOrDefault(self.nullPolicy) == "drop":
            dataset = dataset.dropna(subset=[c for _, c in self._inputs()])
        extra = [self._working_col(param, col).alias(_TMP + f"in{i}")
                 for i, (param, col) in enumerate(self._inputs())]
        return dataset.select("*", *extra)

    def _working_col(self, param: str, col: str) -> Column:
        kind = {"numericCols": "double", "categoricalCols": "string"}.get(param)
        value = F.col(col) if kind is None else F.col(col).cast(kind)
        if col in self.fill:
            value = F.coalesce(value, F.lit(self.fill[col]).cast(kind or "double"))
        return value

    def _stage_plan(self) -> list[Any]:
        names = {col: _TMP + f"in{i}" for i, (_, col) in enumerate(self._inputs())}
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
        for col, labels in zip(self.getOrDefault(self.categoricalCols),
                               indexers[0].labelsArray if indexers else []):
            names += [f"{col}={label}" for label in labels]
        vectors = self.getOrDefault(self.vectorCols)
        if vectors:
            first = working.select(*vectors).where(
                " AND ".join(f"`{c}` IS NOT NULL" for c in vectors)).first()
            assert first is not None, "vectorCols are null in every row"
            for col in vectors:
                names += [f"{col}[{j}]" for j in range(first[col].size)]
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
            return dataset.withColumn(label, F.col(label).cast("double"))
        indexer = StringIndexerModel.from_labels(self.labels, inputCol=label,
                                                 outputCol=_TMP + "label", handleInvalid="error")
        indexed = indexer.transform(dataset)
        return indexed.withColumn(label, F.col(_TMP + "label")).drop(_TMP + "label")

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


def _check_type(param: str, col: str, dtype: Any) -> None:
    if param == "numericCols" and not is_numeric(dtype):
        raise SchemaError(f"numericCols: column '{col}' has type {dtype.simpleString()}, not a "
                          "numeric type; move it to categoricalCols, or cast it first "
                          f"(F.col('{col}').cast('double')).")
    if param == "vectorCols" and not isinstance(dtype, VectorUDT):
        raise SchemaError(f"vectorCols: column '{col}' has type {dtype.simpleString()}, not an "
                          "ML vector; list numeric columns under numericCols, or build the "
                          "vector with pyspark.ml.functions.array_to_vector.")
    if param == "categoricalCols" and not isinstance(dtype, AtomicType):
        raise SchemaError(f"categoricalCols: column '{col}' has type {dtype.simpleString()}; "
                          "categories must be strings, numbers or booleans.")


def _check_label_type(label: str, dtype: Any) -> None:
    if not (is_numeric(dtype) or isinstance(dtype, StringType)):
        raise SchemaError(f"labelCol: column '{label}' has type {dtype.simpleString()}; a label "
                          "must be numeric, boolean or string.")


def _mode(dataset: DataFrame, col: str) -> str:
    """Most frequent non-null value of ``col`` as a string (ties: smallest value)."""
    value = F.col(col).cast("string")
    row = (dataset.where(value.isNotNull()).groupBy(value.alias("v")).count()
           .orderBy(F.desc("count"), F.asc("v")).first())
    assert row is not None
    return row["v"]
