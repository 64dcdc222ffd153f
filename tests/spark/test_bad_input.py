"""The bad-input corpus: every misuse a user can make, one row each, in one table.

Each case does one wrong thing and must end in a typed sparkdist error (``error``) whose
message names the column or Param and the fix (``names``: a regex), before any expensive work,
writing nothing: a case keeps its own inputs under ``ctx.inputs``, and after the error nothing
else may exist in its scratch directory (and the inputs must be unchanged). Add a row for
every new bad input; cases that need a fitted model or data share the fixtures below.
Report ids (F1, K1, C9, ...) refer to ../shared/reports/bad_input_and_security.md.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from sparkdist.exceptions import ModelLoadError, ParamError, SchemaError, SparkdistError


@dataclass(frozen=True)
class Ctx:
    """What a case may use: the session, a scratch directory, and small shared frames."""

    spark: Any
    tmp: Path  # where a case points its outputs
    frame: Any  # x (double), c (string), label (double 0/1): 60 rows

    @property
    def inputs(self) -> Path:
        """Where a case puts files it needs as input (a model, data, a config)."""
        path = self.tmp / "input"
        path.mkdir(exist_ok=True)
        return path


@dataclass(frozen=True)
class Case:
    id: str
    run: Callable[[Ctx], Any]
    error: type[BaseException]
    names: str  # a regex the message must match: the column or Param, and the fix


# ---------------------------------------------------------------- FeatureAssembler and split
def _assemble(ctx: Ctx, frame: Any = None, **params: Any) -> Any:
    from sparkdist.features import FeatureAssembler

    return FeatureAssembler(**params).fit(ctx.frame if frame is None else frame)


def _with_x(ctx: Ctx, value: float) -> Any:
    """ctx.frame with ``value`` in x on every labelled row (NaN, inf)."""
    from pyspark.sql import functions as F

    return ctx.frame.withColumn("x", F.when(F.col("label") == 1, value).otherwise(F.col("x")))


def _transform_with_label(ctx: Ctx, label: str) -> Any:
    """Fit with string label c ('a', 'b'), then transform a frame whose c is ``label``."""
    from pyspark.sql import functions as F

    model = _assemble(ctx, numericCols=["x"], labelCol="c")
    return model.transform(ctx.frame.withColumn("c", F.lit(label)))


def _split(ctx: Ctx, fractions: dict[str, float]) -> Any:
    from sparkdist.features import split

    return split(ctx.frame, fractions)


FEATURES = [
    Case("F-unknown-column", lambda c: _assemble(c, numericCols=["nope"]), SchemaError,
         r"nope"),
    Case("F-null-policy", lambda c: _assemble(c, numericCols=["x"], nullPolicy="zero"),
         ParamError, r"nullPolicy"),
    Case("F1-nan-error", lambda c: _assemble(c, _with_x(c, float("nan")), numericCols=["x"],
                                             standardize=True),
         SchemaError, r"'x'.*NaN.*nullPolicy='drop'"),
    Case("F2-inf", lambda c: _assemble(c, _with_x(c, float("inf")), numericCols=["x"],
                                       nullPolicy="impute", standardize=True),
         SchemaError, r"numericCols: infinite values in \{'x'.*replace them"),
    Case("F4c-struct-field", lambda c: _assemble(c, numericCols=["s.x"]), SchemaError,
         r"numericCols: column 's\.x' is not in the DataFrame"),
    Case("F6b-null-string-label",
         lambda c: _assemble(c, c.frame.selectExpr("x", "IF(label = 1, c, NULL) AS c"),
                             numericCols=["x"], labelCol="c"),
         SchemaError, r"labelCol: column 'c' is null.*dropna"),
    Case("F6c-unseen-string-label", lambda c: _transform_with_label(c, "zzz"), SchemaError,
         r"labelCol: column 'c' holds 'zzz', a label not seen at fit.*refit"),
    Case("F16-output-exists", lambda c: _assemble(c, numericCols=["x"]).transform(
        _assemble(c, numericCols=["x"]).transform(c.frame)), SchemaError,
         r"outputCol 'features' already exists.*another outputCol"),
    Case("F11-fractions-sum", lambda c: _split(c, {"train": 0.799999, "test": 0.2}),
         ParamError, r"fractions sum to 0\.999999\d*, not 1"),
]

# ------------------------------------------------------------------------ classical models
def _labelled(ctx: Ctx, label: str = "label") -> Any:
    """ctx.frame with features assembled from x and its label replaced by the SQL ``label``."""
    from pyspark.sql import functions as F

    from sparkdist.features import FeatureAssembler

    data = FeatureAssembler(numericCols=["x"]).fit(ctx.frame).transform(ctx.frame)
    return data.withColumn("label", F.expr(label))


def _model_fit(ctx: Ctx, estimator: str, label: str = "label", **params: Any) -> Any:
    import sparkdist.models

    return getattr(sparkdist.models, estimator)(**params).fit(_labelled(ctx, label))


MODELS: list[Case] = [  # D12: labels and MLlib Param ranges (x = 0 on 9 of the 60 rows)
    Case("F6-lr-null-label", lambda c: _model_fit(c, "LogisticRegression",
                                                  "IF(x = 0, NULL, label)"),
         SchemaError, r"labelCol: column 'label' has 9 null or NaN values; drop or fill"),
    Case("M2c-lr-nan-label", lambda c: _model_fit(c, "LogisticRegression",
                                                  "IF(x = 0, double('NaN'), label)"),
         SchemaError, r"labelCol: column 'label' has 9 null or NaN values"),
    Case("M2d-lr-negative-label", lambda c: _model_fit(c, "LogisticRegression", "label - 1"),
         SchemaError, r"labelCol: column 'label' holds negative values.*class indices.*"
                      r"FeatureAssembler\(labelCol"),
    Case("F7c-lr-fractional-label", lambda c: _model_fit(c, "LogisticRegression", "label / 2"),
         SchemaError, r"labelCol: column 'label' holds fractional values.*class indices"),
    Case("F7-lr-binomial-three-classes", lambda c: _model_fit(
        c, "LogisticRegression", "x % 3", family="binomial"), ParamError,
         r"family='binomial' fits 2 classes, but labelCol 'label' holds labels up to 2 "
         r"\(3 classes.*"
         r"'multinomial'"),
    Case("M2b-rf-null-label", lambda c: _model_fit(c, "RandomForestClassifier",
                                                   "IF(x = 0, NULL, label)"),
         SchemaError, r"labelCol: column 'label' has 9 null or NaN values"),
    Case("M1e-rf-regressor-inf-label", lambda c: _model_fit(
        c, "RandomForestRegressor", "IF(x = 0, double('inf'), x)"), SchemaError,
         r"labelCol: column 'label' has 9 infinite values; drop or clip"),
    Case("M1e-xgboost-regressor-inf-label", lambda c: _model_fit(
        c, "XGBoostRegressor", "IF(x = 0, double('inf'), x)", n_estimators=2), SchemaError,
         r"labelCol: column 'label' has 9 infinite values; drop or clip"),
    Case("M3-rf-maxDepth", lambda c: _model_fit(c, "RandomForestClassifier", maxDepth=40),
         ParamError, r"maxDepth=40 is out of range: .* needs maxDepth in \[0, 30\]"),
    Case("M3-lr-maxIter", lambda c: _model_fit(c, "LogisticRegression", maxIter=-1),
         ParamError, r"maxIter=-1 is out of range: .* needs maxIter >= 0"),
    Case("M3-als-rank", lambda c: _model_fit(c, "ALS", rank=0), ParamError,
         r"rank=0 is out of range: ALS needs rank >= 1"),
]


def _xgboost_fit(ctx: Ctx, **params: Any) -> Any:
    from sparkdist.features import FeatureAssembler
    from sparkdist.models import XGBoostClassifier

    data = FeatureAssembler(numericCols=["x"]).fit(ctx.frame).transform(ctx.frame)
    return XGBoostClassifier(**{"n_estimators": 2, **params}).fit(data)


MODELS += [  # D3: a runId is one directory under checkpointDir
    Case("K-xgboost-runId-traversal", lambda c: _xgboost_fit(
        c, checkpointDir=str(c.tmp / "ckpt"), runId="../x"), ParamError,
         r"runId='\.\./x' is not a plain name"),
]

# ------------------------------------------------------------------------------ TorchEstimator
def _torch_fit(ctx: Ctx, **params: Any) -> Any:
    from sparkdist.features import FeatureAssembler
    from sparkdist.models import TorchEstimator

    data = FeatureAssembler(numericCols=["x"]).fit(ctx.frame).transform(ctx.frame)
    return TorchEstimator(**{"epochs": 1, "progress": False, **params}).fit(data)


TORCH = [
    Case(f"T6-{name}", lambda c, p={name: value}: _torch_fit(c, **p), ParamError, name)
    for name, value in (("batchSize", 0), ("epochs", 0), ("learningRate", -1.0),
                        ("numWorkers", 0), ("timeoutSeconds", 0.0))
] + [  # D3: runId and resume are checked before the checkpoint directory is touched
    Case("K-torch-runId-traversal", lambda c: _torch_fit(
        c, checkpointDir=str(c.tmp / "ckpt"), runId="../x"), ParamError,
         r"runId='\.\./x' is not a plain name"),
    Case("K-torch-runId-absolute", lambda c: _torch_fit(
        c, checkpointDir=str(c.tmp / "ckpt"), runId="/tmp/x"), ParamError,
         r"runId='/tmp/x' is not a plain name"),
    Case("K-torch-resume-value", lambda c: _torch_fit(
        c, checkpointDir=str(c.tmp / "ckpt"), runId="r", resume="sometimes"), ParamError,
         r"resume='sometimes' is not one of \['auto', 'never', 'required'\]"),
]

def _torch_model() -> Any:
    """A TorchModel taking 2 features, built without a fit (a fresh MLP's weights)."""
    from sparkdist.models import TorchModel
    from sparkdist.torchtrain.nets import MLP

    return TorchModel._fitted(MLP(input_dim=2, output_dim=1).state_dict(),
                              {"input_dim": 2, "output_dim": 1, "num_classes": 2})


TORCH += [  # D12 (T9): a width the schema tells is checked at transform, before any job
    Case("T9-transform-width", lambda c: _torch_model().transform(_labelled(c)), SchemaError,
         r"featuresCol: 'features' holds 1 features per row, but this TorchModel was "
         r"trained on 2; .*same FeatureAssemblerModel"),
]


# ------------------------------------------------------------------------ saving and loading
def _save_over_input(ctx: Ctx) -> None:
    from sparkdist.features import FeatureAssembler

    (ctx.inputs / "mine.txt").write_text("user data")
    FeatureAssembler(numericCols=["x"]).write().overwrite().save(str(ctx.inputs))


PERSISTENCE = [
    Case("P7-empty-path", lambda c: _assemble(c, numericCols=["x"]).write().overwrite()
         .save(""), ParamError, r"empty"),
    Case("P-not-a-model", _save_over_input, ParamError, r"not a saved model"),
]

def _tampered(ctx: Ctx, stage: Any, loader: Any, drop_state: str | None = None,
              drop_dir: str | None = None) -> Any:
    """Save ``stage`` under ctx.inputs, remove a state key or a directory, load it again."""
    import json
    import shutil

    from sparkdist.persist import DATA_KEY, RECORD, STATE_KEY

    path = ctx.inputs / "model"
    stage.write().save(str(path))
    record = json.loads((path / RECORD).read_text())
    if drop_state:
        del record[STATE_KEY][drop_state]
        (path / RECORD).write_text(json.dumps(record) + "\n")
    if drop_dir:
        shutil.rmtree(path / record[DATA_KEY] / drop_dir)
    return loader.load(str(path))


def _lr_model(ctx: Ctx) -> Any:
    from sparkdist.models import LogisticRegression

    return LogisticRegression(maxIter=2).fit(_labelled(ctx))


PERSISTENCE += [  # D12: tampered directories (P2a, P2d)
    Case("P2a-missing-mllib-dir", lambda c: _tampered(
        c, _lr_model(c), type(_lr_model(c)), drop_dir="mllib"), ModelLoadError,
         r"is incomplete: it has no mllib/ directory.*Save the model again"),
    Case("P2d-torch-state-key", lambda c: _tampered(
        c, _torch_model(), type(_torch_model()), drop_state="input_dim"), ModelLoadError,
         r"state lacks \['input_dim'\].*Save the model again"),
    Case("P2d-assembler-state-key", lambda c: _tampered(
        c, _assemble(c, numericCols=["x"]), type(_assemble(c, numericCols=["x"])),
        drop_state="featureNames"), ModelLoadError,
         r"lacks 'featureNames'.*Save the model again"),
]

# ------------------------------------------------------------------------------- the CLI
class CliError(SparkdistError):
    """The CLI's one-line error (exit status 2), raised here so that a row can match it."""


def _cli(*argv: str) -> None:
    import contextlib
    import io

    from sparkdist.cli import main

    err = io.StringIO()
    with contextlib.redirect_stderr(err):
        code = main(list(argv))
    lines = err.getvalue().strip().splitlines()
    if code == 2 and len(lines) == 1:
        raise CliError(lines[0])
    raise AssertionError(f"exit status {code}, stderr: {err.getvalue()[-2000:]}")


def _parquet(ctx: Ctx) -> str:
    path = str(ctx.inputs / "data.parquet")
    ctx.frame.write.mode("overwrite").parquet(path)
    return path


def _train(ctx: Ctx, params: dict[str, Any], data: str = "nope.parquet") -> None:
    import json

    config = ctx.inputs / "config.json"
    config.write_text(json.dumps({
        "name": "c", "data": {"path": str(ctx.inputs / data)},
        "features": {"numericCols": ["x"]}, "tracking": {"enabled": False},
        "models": [{"type": "LogisticRegression", "params": params}]}))
    _cli("train", str(config))


def _evaluate_missing_data(ctx: Ctx) -> None:
    model = str(ctx.inputs / "model")
    _assemble(ctx, numericCols=["x"]).write().save(model)
    _cli("evaluate", model, str(ctx.inputs / "nope.parquet"))


def _predict_dropping_rows(ctx: Ctx) -> None:
    """Report note on nullPolicy='drop': predict wrote fewer rows than it read."""
    from pyspark.sql import functions as F

    model = str(ctx.inputs / "model")
    _assemble(ctx, numericCols=["x"], nullPolicy="drop").write().save(model)
    data = str(ctx.inputs / "holes.parquet")
    ctx.frame.withColumn("x", F.when(F.col("x") > 5, None).otherwise(F.col("x"))).write.parquet(
        data)
    _cli("predict", model, data, str(ctx.tmp / "out"))


CLI: list[Case] = [  # D10, D4
    Case("C3-train-missing-data", lambda c: _train(c, {}), CliError,
         r"sparkdist train: data\.path: cannot read the data: .*PATH_NOT_FOUND"),
    Case("C8-evaluate-missing-data", _evaluate_missing_data, CliError,
         r"sparkdist evaluate: data: cannot read the data: .*nope\.parquet"),
    Case("C5-param-type", lambda c: _train(c, {"maxIter": "ten"}), CliError,
         r"models\[LogisticRegression\]\.params\.maxIter: 'ten' is not a valid value"),
    Case("C6-param-range", lambda c: _train(c, {"maxIter": -1}), CliError,
         r"models\[LogisticRegression\]\.params: maxIter=-1 is out of range"),
    Case("C9-predict-over-input", lambda c: _cli(
        "predict", str(c.inputs / "model"), _parquet(c), _parquet(c), "--overwrite"), CliError,
         r"sparkdist predict: output '.*data\.parquet' is, contains or lies inside the input"),
    Case("C9-predict-into-input", lambda c: _cli(
        "predict", str(c.inputs / "model"), _parquet(c), _parquet(c) + "/out", "--overwrite"),
         CliError, r"lies inside the input.*Choose another output path"),
    Case("P9-predict-drops-rows", _predict_dropping_rows, CliError,
         r"8 input rows have a missing value.*nullPolicy='drop'.*nullPolicy='impute'"),
]

CASES = FEATURES + MODELS + TORCH + PERSISTENCE + CLI


@pytest.fixture(scope="module")
def frame(spark):
    rows = [(float(i % 7), "a" if i % 3 else "b", float(i % 2)) for i in range(60)]
    return spark.createDataFrame(rows, ["x", "c", "label"]).cache()


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_a_typed_error_naming_the_fix(case, spark, frame, tmp_path):
    ctx = Ctx(spark=spark, tmp=tmp_path, frame=frame)
    with pytest.raises(case.error, match=case.names):
        case.run(ctx)
    left = {p for p in tmp_path.iterdir() if p.name != "input"}
    assert not left, f"{case.id} wrote {sorted(map(str, left))}"


def test_case_ids_are_unique():
    assert len({case.id for case in CASES}) == len(CASES)
