"""Workflow config validation: every mistake names the key, where it is, and the fix."""

from __future__ import annotations

import json

import pytest

from sparkdist.config import ConfigError, load_config, parse_config
from sparkdist.exceptions import ParamError

BASE = {"name": "x", "data": {"path": "d.parquet"}, "models": [{"type": "LogisticRegression"}]}


def with_(**changes):
    return {**BASE, **changes}


def test_shipped_configs_are_valid():
    churn = load_config("jobs/configs/churn.yaml")
    assert [m.name for m in churn.models] == [
        "LogisticRegression", "RandomForestClassifier", "XGBoostClassifier", "TorchEstimator"]
    assert load_config("jobs/configs/ratings_als.yaml").features is None


def test_defaults():
    config = parse_config(BASE)
    assert config.split.fractions == {"train": 0.8, "test": 0.2}
    assert config.tracking.enabled and config.output.modelDir is None


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (with_(featurs={}), "unknown key 'featurs' in the top level. Did you mean 'features'?"),
        (with_(split={"fractons": {}}),
         "unknown key 'fractons' in split. Did you mean 'fractions'"),
        (with_(models=[{"type": "LogisticRegression", "parms": {}}]),
         "unknown key 'parms' in models.0. Did you mean 'params'?"),
        (with_(models=[{"type": "LogisticRegresion"}]), "Did you mean 'LogisticRegression'?"),
        ({k: v for k, v in BASE.items() if k != "name"}, "missing required key 'name'"),
        (with_(data={}), "data: give exactly one of path, table or generate"),
        (with_(models=[]), "models:"),
        (with_(models=[{"type": "ALS"}, {"type": "ALS"}]), "model names must be unique"),
    ],
)
def test_mistakes_are_named(raw, expected):
    with pytest.raises(ConfigError, match=None) as err:
        parse_config(raw)
    assert expected in str(err.value)
    assert isinstance(err.value, ParamError)


def test_files(tmp_path):
    good = tmp_path / "c.json"
    good.write_text(json.dumps(BASE))
    assert load_config(good).name == "x"
    bad = tmp_path / "c.yaml"
    bad.write_text("name: [unclosed")
    with pytest.raises(ConfigError, match="not valid yaml"):
        load_config(bad)
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "missing.yaml")
