"""Issue 25 item 3: a job config (``imports: [mod]``) or the command line (``--import mod``)
names the user's own modules, so that a Param may name a class they define (a TorchEstimator
``model: mod.Net``). They are imported before the Params are resolved; nothing read from a
saved model is ever imported."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from sparkdist.cli import main as cli

ROOT = Path(__file__).resolve().parents[2]
MODULE = "sparkdist_r3_user_nets"  # a name no other test uses
NETS = """
import torch


class Net(torch.nn.Module):
    def __init__(self, input_dim, output_dim):
        super().__init__()
        self.linear = torch.nn.Linear(input_dim, output_dim)

    def forward(self, x):
        return self.linear(x)
"""


@pytest.fixture(scope="module")
def user_module(spark, tmp_path_factory):
    """The user's module on the driver's sys.path and shipped to the executors (as
    spark-submit --py-files does), imported by nobody yet; and Parquet data to fit on."""
    root = tmp_path_factory.mktemp("user")
    (root / f"{MODULE}.py").write_text(NETS)
    sys.path.insert(0, str(root))
    spark.sparkContext.addPyFile(str(root / f"{MODULE}.py"))
    rows = [(float(i % 7), float(i % 3), float(i % 2)) for i in range(60)]
    spark.createDataFrame(rows, ["x1", "x2", "label"]).write.parquet(str(root / "data.parquet"))
    yield root
    sys.path.remove(str(root))
    sys.modules.pop(MODULE, None)


def _config(root: Path, name: str, **changes) -> str:
    config = {"name": name, "data": {"path": str(root / "data.parquet")},
              "features": {"numericCols": ["x1", "x2"]},
              "models": [{"type": "TorchEstimator", "params": {
                  "model": f"{MODULE}.Net", "epochs": 1, "numWorkers": 1, "batchSize": 16}}],
              "tracking": {"enabled": False},
              "output": {"modelDir": str(root / name)}, **changes}
    path = root / f"{name}.json"
    path.write_text(json.dumps(config))
    return str(path)


def _one_line(capsys) -> str:
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def trained(user_module):
    """jobs/train.py (the spark-submit entry point) on a config with ``imports``."""
    spec = importlib.util.spec_from_file_location("sparkdist_jobs_train", ROOT / "jobs/train.py")
    assert spec is not None and spec.loader is not None
    job = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(job)
    sys.modules.pop(MODULE, None)
    code = job.main([_config(user_module, "job", imports=[MODULE])])
    return code, user_module / "job" / "TorchEstimator"


@pytest.mark.slow
def test_a_job_config_imports_the_users_network(trained):
    code, model = trained
    assert code == 0
    assert MODULE in sys.modules
    from sparkdist.persist import load_model

    assert load_model(str(model)).stages[-1].getOrDefault("model") == f"{MODULE}.Net"


@pytest.mark.slow
def test_train_import_option(user_module, capsys):
    sys.modules.pop(MODULE, None)
    config = _config(user_module, "cli")
    assert cli(["train", config]) == 2  # a Param never imports a module
    assert f"model='{MODULE}.Net' cannot be imported" in _one_line(capsys)
    assert MODULE not in sys.modules and not (user_module / "cli").exists()
    assert cli(["train", config, "--import", MODULE]) == 0
    assert "TorchEstimator" in capsys.readouterr().out
    assert (user_module / "cli" / "TorchEstimator" / "metadata").is_dir()


@pytest.mark.slow
def test_a_saved_model_imports_nothing_evaluate_and_predict_import_what_they_are_told(
        trained, user_module, capsys):
    code, model = trained
    assert code == 0
    data = str(user_module / "data.parquet")
    sys.modules.pop(MODULE, None)
    assert cli(["evaluate", str(model), data]) == 2
    assert MODULE in _one_line(capsys)
    assert MODULE not in sys.modules  # the saved model names it; nothing imported it
    assert cli(["evaluate", str(model), data, "--import", MODULE]) == 0
    assert "accuracy" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    out = user_module / "preds"
    assert cli(["predict", str(model), data, str(out), "--import", MODULE]) == 0
    assert (out / "_SUCCESS").exists()
