"""The CLI's promise for user errors: one line on stderr and exit status 2, before any work
that could harm the input (report cases C3, C5, C6, C8, C9 in
../shared/reports/bad_input_and_security.md)."""

from __future__ import annotations

import json
import time

import pytest

from sparkdist.cli import main
from sparkdist.models import LogisticRegression
from sparkdist.persist import save_model


@pytest.fixture(scope="module")
def model_and_data(spark, tmp_path_factory):
    """A saved PipelineModel (FeatureAssembler + LR) and the Parquet data it scores."""
    from pyspark.ml import Pipeline

    from sparkdist.features import FeatureAssembler

    root = tmp_path_factory.mktemp("cli")
    df = spark.createDataFrame([(float(i % 5), float(i % 2)) for i in range(40)], ["x", "y"])
    data = str(root / "in.parquet")
    df.write.parquet(data)
    model = Pipeline(stages=[FeatureAssembler(numericCols=["x"], labelCol="y"),
                             LogisticRegression(labelCol="y", maxIter=5)]).fit(df)
    save_model(model, str(root / "model"))
    return str(root / "model"), data


def one_line_error(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


def files(path) -> list[str]:
    import os

    return sorted(os.path.join(d, f) for d, _, names in os.walk(path) for f in names)


@pytest.mark.parametrize("where", ["same", "inside", "parent"])
def test_predict_refuses_an_output_that_overlaps_the_input(model_and_data, capsys, where):
    """C9: `predict MODEL X X --overwrite` deleted X; now refused, X intact."""
    model, data = model_and_data
    before = files(data)
    output = {"same": data, "inside": f"{data}/preds",
              "parent": data.rsplit("/", 1)[0]}[where]
    assert main(["predict", model, data, output, "--overwrite"]) == 2
    err = one_line_error(capsys)
    assert "output" in err and "input" in err and "destroy the input" in err
    assert files(data) == before


def test_predict_refuses_an_output_matching_an_input_glob(model_and_data, capsys):
    model, data = model_and_data
    pattern = data.replace("in.parquet", "*.parquet")
    assert main(["predict", model, pattern, data.replace("in.", "other."), "--overwrite"]) == 2
    assert "destroy the input" in one_line_error(capsys)
    assert main(["predict", model, pattern, data.replace("in.parquet", "preds")]) == 0


@pytest.mark.parametrize("command", ["evaluate", "predict"])
def test_missing_data_path_is_one_line(model_and_data, capsys, tmp_path, command):
    """C8 (and predict): a data path that does not exist."""
    model, _ = model_and_data
    missing = str(tmp_path / "nope.parquet")
    argv = [command, model, missing] + ([str(tmp_path / "out")] if command == "predict" else [])
    assert main(argv) == 2
    err = one_line_error(capsys)
    assert "data: cannot read" in err and "nope.parquet" in err
    assert not (tmp_path / "out").exists()


def _config(tmp_path, params: dict, data: str) -> str:
    config = {"name": "c", "data": {"path": data},
              "features": {"numericCols": ["x"], "labelCol": "y"},
              "models": [{"type": "LogisticRegression", "params": params}],
              "tracking": {"enabled": False}}
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    return str(path)


def test_train_with_a_missing_data_path_is_one_line(capsys, tmp_path, spark):
    """C3."""
    assert main(["train", _config(tmp_path, {}, str(tmp_path / "nope.parquet"))]) == 2
    err = one_line_error(capsys)
    assert "data.path: cannot read" in err and "nope.parquet" in err


@pytest.mark.parametrize("value, match", [
    ("ten", "models[LogisticRegression].params.maxIter: 'ten' is not a valid value"),  # C5
    (-1, "maxIter=-1 is out of range: LogisticRegression needs maxIter >= 0"),  # C6
    (2.5, "models[LogisticRegression].params.maxIter: 2.5 is not a valid value"),
])
def test_bad_param_values_fail_before_the_data_is_read(capsys, tmp_path, spark, value, match):
    """C5, C6: the data path does not exist either, so only a check before reading it can
    name the Param."""
    started = time.monotonic()
    assert main(["train", _config(tmp_path, {"maxIter": value},
                                  str(tmp_path / "nope.parquet"))]) == 2
    assert match in one_line_error(capsys)
    assert time.monotonic() - started < 5


def test_a_failed_predict_keeps_the_old_output_and_leaves_nothing(model_and_data, capsys,
                                                                    tmp_path, spark):
    """N15 (F7), N3: predictions are written to a hidden sibling and moved into place only
    after the write succeeded; a failed write (nulls the model's assembler refuses) leaves
    the previous output as it was, and nothing else."""
    model, data = model_and_data
    holes = str(tmp_path / "holes.parquet")
    spark.createDataFrame([(None, 1.0), (2.0, 0.0)], "x double, y double").write.parquet(holes)
    out = tmp_path / "out"
    assert main(["predict", model, data, str(out)]) == 0
    capsys.readouterr()
    before = files(out)
    assert main(["predict", model, holes, str(out), "--overwrite"]) == 2
    assert "nothing was written: Encountered null" in one_line_error(capsys)
    assert files(out) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["holes.parquet", "out"]
    assert main(["predict", model, data, str(out), "--overwrite"]) == 0  # replaces it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["holes.parquet", "out"]
    assert spark.read.parquet(str(out)).count() == 40
