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

from torch import nn as _nn  # noqa: E402  (round 3, N1: a module-level network class)


class TiedN1(_nn.Module):
    """Weight tying: the second Linear's weight is the first one's (one Parameter)."""

    def __init__(self, input_dim: int, output_dim: int) -> None:
        super().__init__()
        width = input_dim  # a square weight, so that it fits both layers
        self.layers = _nn.Sequential(_nn.Linear(input_dim, width), _nn.ReLU(),
                                     _nn.Linear(width, width), _nn.ReLU(),
                                     _nn.Linear(width, output_dim))
        self.layers[2].weight = self.layers[0].weight

    def forward(self, x: Any) -> Any:
        return self.layers(x)


_TIED = r"'layers\.0' and 'layers\.2' share one Parameter.*use strategy='ddp'.*untie"
TORCH += [  # round 3, N1: a strategy that would train two copies of a tied Parameter
    Case(f"N1-tied-{strategy}", lambda c, p=params: _torch_fit(
        c, model=TiedN1, numWorkers=2, **p), ParamError, f"strategy='{strategy}': {_TIED}")
    for strategy, params in (("tensor", {"strategy": "tensor"}),
                             ("fsdp", {"strategy": "fsdp"}),
                             ("pipeline", {"strategy": "pipeline",
                                           "pipelineSplitPoints": ["layers.2"]}))
]

def _a_file(ctx: Ctx) -> Path:
    path = ctx.inputs / "afile"
    path.write_text("not a model")
    return path


def _loop(ctx: Ctx, stage: Any, where: str) -> Any:
    """Save ``stage``, replace ``where`` in it (relative to the model; '{v}' is its version)
    by a symlink to itself (a loop), load it again."""
    import json
    import os
    import shutil

    from sparkdist.persist import DATA_KEY, RECORD, load_model

    path = ctx.inputs / "model"
    stage.write().save(str(path))
    target = path / where.format(v=json.loads((path / RECORD).read_text())[DATA_KEY])
    shutil.rmtree(target)
    os.symlink(target.name, target)
    return load_model(str(path))


def _jvm_class_swapped(ctx: Ctx) -> Any:
    """Save MLlib's own LR model, make its version's JVM metadata name another class."""
    import json

    from sparkdist.persist import DATA_KEY, RECORD, load_model, save_model

    path = ctx.inputs / "model"
    save_model(_lr_model(ctx).mllib_model, str(path))
    version = path / json.loads((path / RECORD).read_text())[DATA_KEY]
    jvm = next((version / "metadata").glob("part-00000*"))
    (jvm.parent / f".{jvm.name}.crc").unlink()  # else Hadoop refuses the edit as damage
    jvm.write_text(jvm.read_text().replace("classification.LogisticRegressionModel",
                                           "regression.LinearRegressionModel"))
    return load_model(str(path))


def _read_only(ctx: Ctx) -> None:
    import os

    if os.access("/proc/sys", os.W_OK):
        pytest.skip("no read-only filesystem here (/proc/sys is writable)")
    _assemble(ctx, numericCols=["x"]).write().save("/proc/sys/sparkdist-model")


def _loaded(path: Any) -> Any:
    from sparkdist.persist import load_model

    return load_model(str(path))


PERSISTENCE += [  # round 3, N16: malformed paths; N18: paths Spark reads elsewhere
    Case("N16-load-a-file", lambda c: _loaded(_a_file(c)), ModelLoadError,
         r"afile' is not a saved sparkdist model: it is a file"),
    Case("N16-load-under-a-file", lambda c: _loaded(_a_file(c) / "m"), ModelLoadError,
         r"afile/m' is not a saved sparkdist model: it has no metadata"),
    Case("N16-save-over-a-file", lambda c: _assemble(c, numericCols=["x"]).write()
         .overwrite().save(str(_a_file(c))), ParamError, r"afile' exists and is not a saved"),
    Case("N16-save-under-a-file", lambda c: _assemble(c, numericCols=["x"]).write()
         .save(str(_a_file(c) / "m")), ParamError,
         r"afile/m' lies under '.*afile', which is not a directory.*choose a path"),
    Case("N16-symlink-loop-metadata", lambda c: _loop(c, _lr_model(c), "metadata"),
         ModelLoadError, r"model' could not be read \(StoreError: .*metadata.*\)\. Check"),
    Case("N16-symlink-loop-stages", lambda c: _loop(
        c, _assemble(c, numericCols=["x"]), "{v}/stages"), ModelLoadError,
         r"model/v-\d+-[0-9a-f]+/stages' could not be read \(StoreError: .*Check"),
    Case("N16-jvm-metadata-class", _jvm_class_swapped, ModelLoadError,
         r"model' could not be read \(IllegalArgumentException: .*LinearRegressionModel"),
    Case("N16-read-only-filesystem", _read_only, ParamError,
         r"sparkdist-model'.*'/proc/sys' is not writable.*choose a directory"),
    Case("N18-relative-file-url", lambda c: _assemble(c, numericCols=["x"]).write()
         .save("file:relmodel"), ParamError,
         r"'file:relmodel' is a relative file: URL.*'relmodel'.*file:///abs/path"),
    Case("N18-glob-characters", lambda c: _assemble(c, numericCols=["x"]).write()
         .save(str(c.tmp / "m{a,b}")), ParamError,
         r"m\{a,b\}'.* contains '\{'.*choose a path without"),
]


def _one_feature_int8(ctx: Ctx) -> Any:
    """N13: a TorchModel on one feature (its first layer a Linear(1, 64)) scored in int8."""
    from sparkdist.models import TorchModel
    from sparkdist.torchtrain.nets import MLP

    model = TorchModel._fitted(MLP(input_dim=1, output_dim=1).state_dict(),
                               {"input_dim": 1, "output_dim": 1, "num_classes": 2})
    return model.setQuantization("int8").transform(_labelled(ctx))


TORCH += [  # round 3, N13: int8 a network torchao cannot quantize; N14: an infinite timeout
    Case("N13-int8-linear-1", _one_feature_int8, ParamError,
         r"quantization='int8' cannot quantize model='sparkdist.torchtrain.nets.MLP' \(its "
         r"layer\(s\) \['layers.0'\] take a single input feature.*quantization='none'"),
] + [
    Case(f"N14-{name}-inf", lambda c, p={name: float("inf")}: _torch_fit(c, **p), ParamError,
         rf"{name}=inf: use a number of seconds above 0 and at most 31536000 \(one year")
    for name in ("timeoutSeconds", "rendezvousTimeoutSeconds", "slotWaitSeconds")
] + [
    Case("N14-xgboost-slotWaitSeconds-inf", lambda c: _xgboost_fit(
        c, slotWaitSeconds=float("inf")), ParamError,
         r"slotWaitSeconds=inf: use a number of seconds above 0 and at most 31536000"),
]


def _tampered_torch(ctx: Ctx, kwargs: dict | None = None, weights: Any = None) -> Any:
    """N17: a saved TorchModel (2 features) whose metadata gets ``kwargs`` as modelKwargs, or
    whose weights.pt is replaced by ``weights``; then loaded."""
    import json

    import torch

    from sparkdist.models import TorchModel
    from sparkdist.persist import DATA_KEY, RECORD

    path = ctx.inputs / "model"
    _torch_model().write().save(str(path))
    record = json.loads((path / RECORD).read_text())
    if kwargs is not None:
        record["paramMap"]["modelKwargs"] = kwargs
        (path / RECORD).write_text(json.dumps(record) + "\n")
    if weights is not None:
        torch.save(weights, path / record[DATA_KEY] / "weights.pt")
    return TorchModel.load(str(path))


def _foreign_weights() -> Any:
    from sparkdist.torchtrain.nets import MLP

    return MLP(input_dim=2, output_dim=1, hidden=[8, 8]).state_dict()


PERSISTENCE += [  # round 3, N17: metadata and weights that cannot work together
    Case("N17-huge-modelKwargs", lambda c: _tampered_torch(c, {"hidden": [200000, 200000]}),
         ModelLoadError, r"model'.*weights do not fit model='sparkdist.torchtrain.nets.MLP' "
         r"with modelKwargs=\{'hidden': \[200000, 200000\]\}: the network has 40001000001 "
         r"values.*'layers.0.weight' is \(64, 2\), not \(200000, 2\).*save the model again"),
    Case("N17-foreign-weights", lambda c: _tampered_torch(c, weights=_foreign_weights()),
         ModelLoadError, r"model'.*weights do not fit.*the network has 257 values in 4 "
         r"tensors, the weights 105 in 6 .*'layers.4.weight' unexpected"),
    Case("N17-not-a-state-dict", lambda c: _tampered_torch(c, weights=[1.0, 2.0]),
         ModelLoadError, r"weights.pt is not a state dict.*save the model again"),
]

def _special_file(path: Path, kind: str) -> None:
    """At ``path``: a FIFO (a read would block for ever) or a link to /dev/zero (a read would
    never end)."""
    import os

    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)


def _memory_capped(action: Callable[[], Any]) -> Any:
    """Run ``action`` with this process's address space capped at its size + 2 GiB: a
    regression that reads /dev/zero ends in a MemoryError, not in the OOM killer."""
    import os
    import resource

    pages = int(Path("/proc/self/statm").read_text().split()[0])
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (pages * os.sysconf("SC_PAGE_SIZE") + 2**31, hard))
    try:
        return action()
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _special_metadata(ctx: Ctx, kind: str) -> Any:
    """Save a stage, make its metadata record a FIFO or a link to /dev/zero, load it."""
    path = ctx.inputs / "model"
    _assemble(ctx, numericCols=["x"]).write().save(str(path))
    _special_file(path / "metadata" / "part-00000", kind)
    return _memory_capped(lambda: _loaded(path))


def _run_file(ctx: Ctx, name: str, text: str = "", kind: str = "") -> Any:
    """A TorchEstimator fit of runId 'r' whose ``name`` (lock.json, run.json) is ``text``,
    or a FIFO or a link to /dev/zero (``kind``)."""
    run = ctx.inputs / "ckpt" / "r"
    run.mkdir(parents=True)
    if kind:
        _special_file(run / name, kind)
    else:
        (run / name).write_text(text)
    return _memory_capped(lambda: _torch_fit(ctx, checkpointDir=str(ctx.inputs / "ckpt"),
                                             runId="r", batchSize=20))


PERSISTENCE += [  # round 3, N6: tampered run files; N7: control files that are no files
    Case("N6-lock-expires-inf", lambda c: _run_file(
        c, "lock.json", '{"fit_id": "x", "expires": "inf"}'), ParamError,
         r"lock.json is not a lock sparkdist wrote.*If no fit of runId='r' is running, "
         r"delete it"),
    Case("N6-lock-a-list", lambda c: _run_file(c, "lock.json", "[1, 2]"), ParamError,
         r"lock.json is not a lock sparkdist wrote \(a JSON list.*delete it"),
    Case("N6-lock-far-future", lambda c: _run_file(
        c, "lock.json", '{"fit_id": "x", "expires": 1e300}'), ParamError,
         r"runId='r' is in use by another fit \(fit x .*expires at \d\d:\d\d:\d\d"),
    Case("N6-run-an-int", lambda c: _run_file(c, "run.json", "5"), ParamError,
         r"run.json is not a run record sparkdist wrote \(a JSON int.*resume='never'"),
    Case("N6-run-fingerprint-list", lambda c: _run_file(
        c, "run.json", '{"fingerprint": [1], "state": "running"}'), ParamError,
         r"run.json is not a run record sparkdist wrote.*'fingerprint' object.*"
         r"resume='never'"),
    Case("N7-run-dev-zero", lambda c: _run_file(c, "run.json", kind="zero"), ParamError,
         r"run.json' is not a regular file.*Remove it"),
    Case("N7-lock-fifo", lambda c: _run_file(c, "lock.json", kind="fifo"), ParamError,
         r"lock.json' is not a regular file.*Remove it"),
    Case("N7-metadata-dev-zero", lambda c: _special_metadata(c, "zero"), ModelLoadError,
         r"part-00000' is not a regular file.*Remove it"),
    Case("N7-metadata-fifo", lambda c: _special_metadata(c, "fifo"), ModelLoadError,
         r"part-00000' is not a regular file.*Remove it"),
]

def _files_of(path: str) -> dict[str, bytes]:
    import os

    return {os.path.join(d, f): Path(d, f).read_bytes()
            for d, _, names in os.walk(path) for f in names}


def _predict_over_input(ctx: Ctx, pattern: str, output: str) -> None:
    """N3: predict with a saved model, the input named by a Hadoop glob that Python's glob
    reads otherwise, the output over (or inside) the input; the input must stay unchanged."""
    model = str(ctx.inputs / "model")
    _assemble(ctx, numericCols=["x"]).write().save(model)
    data = _parquet(ctx)
    before = _files_of(data)
    try:
        _cli("predict", model, str(ctx.inputs / pattern), str(ctx.inputs / output),
             "--overwrite")
    finally:
        assert _files_of(data) == before, "the input changed"


def _predict_fails_writing(ctx: Ctx) -> None:
    """N15 (F7): the model's assembler (nullPolicy='error') meets nulls while writing."""
    from pyspark.sql import functions as F

    model = str(ctx.inputs / "model")
    _assemble(ctx, numericCols=["x"]).write().save(model)
    data = str(ctx.inputs / "holes.parquet")
    ctx.frame.withColumn("x", F.when(F.col("x") > 5, None).otherwise(F.col("x"))).write.parquet(
        data)
    _cli("predict", model, data, str(ctx.tmp / "preds_null"))


def _train_with(ctx: Ctx, *options: str, **changes: Any) -> None:
    """`sparkdist train` of a config whose data exists (so that only the change is wrong)."""
    import json

    config = {"name": "c", "data": {"path": _parquet(ctx)},
              "features": {"numericCols": ["x"]}, "tracking": {"enabled": False},
              "models": [{"type": "LogisticRegression", "params": {"maxIter": 2}}], **changes}
    path = ctx.inputs / "config.json"
    path.write_text(json.dumps(config))
    _cli("train", str(path), *options)


def _a_file_in(ctx: Ctx) -> Path:
    (ctx.inputs / "afile").write_text("not a directory")
    return ctx.inputs / "afile"


def _not_utf8(ctx: Ctx) -> None:
    (ctx.inputs / "bad.yaml").write_bytes(b"name: x\n\xff\xfe\n")
    _cli("train", str(ctx.inputs / "bad.yaml"))


CLI += [  # round 3, N3: input globs Hadoop expands; N15: the CLI's six tracebacks
    Case("N3-predict-brace-glob-over-input", lambda c: _predict_over_input(
        c, "{data,zz}.parquet", "data.parquet"), CliError,
         r"output '.*data\.parquet' is, contains or lies inside the input "
         r"'.*\{data,zz\}\.parquet' \(which resolves to .*data\.parquet\).*another output"),
    Case("N3-predict-brace-glob-into-input", lambda c: _predict_over_input(
        c, "{data,zz}.parquet", "data.parquet/preds"), CliError,
         r"lies inside the input '.*\{data,zz\}\.parquet'"),
    Case("N3-predict-negated-class-over-input", lambda c: _predict_over_input(
        c, "[^x]ata.parquet", "data.parquet"), CliError,
         r"lies inside the input '.*\[\^x\]ata\.parquet'"),
    Case("N3-predict-escape-over-input", lambda c: _predict_over_input(
        c, "d\\ata.parquet", "data.parquet"), CliError,
         r"lies inside the input '.*d\\ata\.parquet'"),
    Case("N15-train-config-not-utf8", _not_utf8, CliError,
         r"sparkdist train: config '.*bad\.yaml' is not UTF-8 text.*save it as UTF-8"),
    Case("N15-doctor-bogus-master", lambda c: _cli("doctor", "--master", "bogus://nowhere"),
         CliError, r"sparkdist doctor: --master 'bogus://nowhere' is not a Spark master URL; "
                   r"use local\[N\]"),
    Case("N15-evaluate-model-is-a-file", lambda c: _cli(
        "evaluate", str(_a_file_in(c)), _parquet(c)), CliError,
         r"sparkdist evaluate: .*afile.*[Pp]oint at the directory that save"),
    Case("N15-predict-fails-while-writing", _predict_fails_writing, CliError,
         r"sparkdist predict: writing the predictions to '.*preds_null' failed, and nothing "
         r"was written: Encountered null while assembling"),
    Case("N15-train-modelDir-a-file", lambda c: _train_with(
        c, output={"modelDir": str(_a_file_in(c))}), CliError,
         r"sparkdist train: output\.modelDir: '.*afile' is or lies under the file"),
    Case("N15-train-modelDir-under-a-file", lambda c: _train_with(
        c, output={"modelDir": str(_a_file_in(c) / "models")}), CliError,
         r"output\.modelDir: '.*afile/models' is or lies under the file '.*afile'"),
    Case("N15-train-bad-tracking-uri", lambda c: _train_with(
        c, tracking={"uri": "bogus://x"}, output={"modelDir": str(c.tmp / "models")}),
         CliError, r"sparkdist train: tracking\.uri: MLflow cannot use 'bogus://x' .*"
                   r"tracking\.enabled: false"),
]

CLI += [  # round 3, issue 25 item 3: modules the user names (config imports, --import)
    Case("I3-import-not-a-name", lambda c: _train_with(c, "--import", "1bad"), CliError,
         r"sparkdist train: --import: '1bad' is not a module name"),
    Case("I3-import-missing", lambda c: _cli(
        "evaluate", str(c.inputs / "model"), _parquet(c), "--import", "no_such_mod_r3"),
         CliError, r"--import: cannot import module 'no_such_mod_r3' \(ModuleNotFoundError"),
    Case("I3-config-imports-not-a-name", lambda c: _train_with(c, imports=["os", "a-b"]),
         CliError, r"sparkdist train: imports: 'a-b' is not a module name"),
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
