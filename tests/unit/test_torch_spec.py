"""TorchEstimator's Params turned into the typed spec (issue 26 items 1, 2, 4, 11), without
Spark: each group's spec part checks itself and names the Param; the resume fingerprint of
today's Params equals the one a run checkpointed at 15970eb recorded; validationCol, renamed
validationIndicatorCol, is still taken from keywords, setParams and saved metadata."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest

from sparkdist.exceptions import ModelLoadError, ParamError
from sparkdist.models import TorchEstimator
from sparkdist.persist import restore_params

LEGACY = Path(__file__).resolve().parents[1] / "data" / "legacy_15970eb"
#: The settings make_legacy.py trained the checkpointed run with.
LEGACY_TORCH = {"numWorkers": 2, "epochs": 1, "batchSize": 50, "learningRate": 0.01,
                "seed": 5, "modelKwargs": {"hidden": [8]}, "progress": False,
                "rendezvousTimeoutSeconds": 60}


def test_the_default_parts_carry_the_param_defaults():
    parts = TorchEstimator(numWorkers=3)._spec_parts()
    assert parts["strategy"].pipeline_stages == 3  # pipelineStages 0: numWorkers
    assert parts["launch"].min_workers == 3  # minWorkers 0: numWorkers
    assert (parts["optim"].optimizer, parts["optim"].batch_size) == ("adam", 256)
    assert parts["comm"].backend == "torch" and parts["rules"].nan_policy == "error"


@pytest.mark.parametrize("params, match", [
    ({"epochs": 0}, "epochs=0: use 1 or more"),
    ({"learningRate": 0.0}, "learningRate=0.0: use a positive number"),
    ({"weightDecay": -1.0}, "weightDecay=-1.0"),
    ({"microBatches": 0}, "microBatches=0: use 1 or more"),
    ({"pipelineStages": -1}, "pipelineStages=-1: use 0 or more"),
    ({"pipelineSchedule": "zigzag"}, "pipelineSchedule='zigzag'"),
    ({"syncEvery": 0}, "syncEvery=0: use 1 or more"),
    ({"maxStaleness": -1}, "maxStaleness=-1: use 0 or more"),
    ({"numWorkers": 2, "minWorkers": 3}, r"minWorkers=3: use 0 \(all numWorkers\) to "
                                         "numWorkers=2"),
    ({"useGpu": "maybe"}, "useGpu='maybe'"),
    ({"nanPolicy": "ignore"}, "nanPolicy='ignore'"),
    ({"numClasses": -1}, "numClasses=-1"),
    ({"validationFraction": 1.0}, r"validationFraction=1.0: use a fraction in \[0, 1\)"),
    ({"optimizer": "adma"}, "Did you mean 'adam'"),
    ({"quantization": "int4"}, "quantization='int4'"),
    ({"earlyStoppingPatience": 2}, "earlyStoppingPatience needs validation rows"),
])
def test_a_bad_param_is_refused_by_name_before_any_data_is_read(params, match):
    with pytest.raises(ParamError, match=match):
        TorchEstimator(**params)._spec_parts()


def test_the_fingerprint_params_match_a_run_checkpointed_before_the_groups():
    record = json.loads((LEGACY / "torch_checkpoints" / "legacy" / "run.json").read_text())
    legacy = {k: v for k, v in record["fingerprint"].items() if not k.startswith("data ")}
    now = json.loads(json.dumps(TorchEstimator(**LEGACY_TORCH)._fingerprint_params()))
    assert now == legacy


def test_validation_col_is_accepted_with_a_future_warning():
    with pytest.warns(FutureWarning, match="validationCol is deprecated.*validationIndicatorCol"
                      ) as record:
        est = TorchEstimator(validationCol="is_val")
    assert record[0].filename == __file__  # the user's line, not pyspark's keyword_only
    assert est.getValidationIndicatorCol() == "is_val"
    assert est._fingerprint_params()["validationCol"] == "is_val"
    with pytest.warns(FutureWarning):
        est.setParams(validationCol="other")
    assert est.getValidationIndicatorCol() == "other"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TorchEstimator(validationIndicatorCol="v").validation_column() == "v"


def test_saved_metadata_with_validation_col_loads_under_the_new_name():
    est = TorchEstimator()
    with pytest.warns(FutureWarning):
        restore_params(est, {"paramMap": {"validationCol": "is_val", "epochs": 2}}, "p")
    assert (est.getValidationIndicatorCol(), est.getEpochs()) == ("is_val", 2)
    with pytest.raises(ModelLoadError, match=r"holds \['validationColumn'\]"):
        restore_params(TorchEstimator(), {"paramMap": {"validationColumn": "x"}}, "p")
