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

from sparkdist.exceptions import ParamError, SchemaError


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
def _assemble(ctx: Ctx, **params: Any) -> Any:
    from sparkdist.features import FeatureAssembler

    return FeatureAssembler(**params).fit(ctx.frame)


FEATURES = [
    Case("F-unknown-column", lambda c: _assemble(c, numericCols=["nope"]), SchemaError,
         r"nope"),
    Case("F-null-policy", lambda c: _assemble(c, numericCols=["x"], nullPolicy="zero"),
         ParamError, r"nullPolicy"),
]

# ------------------------------------------------------------------------ classical models
MODELS: list[Case] = []


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

# ------------------------------------------------------------------------------- the CLI
CLI: list[Case] = []

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
