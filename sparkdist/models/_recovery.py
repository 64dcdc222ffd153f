"""Params for fits that survive failures: checkpoints, a run id to resume, bounded retries."""

from __future__ import annotations

import uuid
from typing import Any

from pyspark.ml.param import Param, Params, TypeConverters

from sparkdist.exceptions import ClusterConfigError, ParamError
from sparkdist.store import Checkpoints

#: Spark's default for spark.stage.maxConsecutiveAttempts: a stage runs at most this often.
SPARK_STAGE_ATTEMPTS = 4


class HasRecovery(Params):
    """checkpointDir, checkpointEvery, keepCheckpoints, runId and maxRetries."""

    checkpointDir: Param[str] = Param(
        Params._dummy(), "checkpointDir",
        "directory for checkpoints (local path, file://, hdfs://, s3://, dbfs:/, /Volumes/...) "
        "that the driver and every executor can reach; unset: no checkpoints",
        typeConverter=TypeConverters.toString)
    checkpointEvery: Param[int] = Param(
        Params._dummy(), "checkpointEvery", "checkpoint interval (epochs or rounds), >= 1",
        typeConverter=TypeConverters.toInt)
    keepCheckpoints: Param[int] = Param(
        Params._dummy(), "keepCheckpoints", "newest checkpoints kept per run, >= 1",
        typeConverter=TypeConverters.toInt)
    runId: Param[str] = Param(
        Params._dummy(), "runId",
        "names the run's checkpoints: a fit with the runId of an earlier one resumes it; "
        "unset: a new id per fit", typeConverter=TypeConverters.toString)
    maxRetries: Param[int] = Param(
        Params._dummy(), "maxRetries", "retries of a failed training stage, >= 0",
        typeConverter=TypeConverters.toInt)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._setDefault(checkpointEvery=1, keepCheckpoints=3, maxRetries=3)

    def checkpoint_location(self, spark: Any,
                            spark_retries: bool = True) -> tuple[str | None, str]:
        """Check the recovery Params against the cluster and return (this run's checkpoint
        directory or None, run id). Raises before anything is launched.

        ``spark_retries``: True when the retries are Spark's own stage retries, so maxRetries
        must fit in spark.stage.maxConsecutiveAttempts; False for an estimator that retries
        on the driver (XGBoost), where that Spark setting does not apply."""
        get = self.getOrDefault
        for name, low in (("checkpointEvery", 1), ("keepCheckpoints", 1), ("maxRetries", 0)):
            if get(name) < low:
                raise ParamError(f"{name}={get(name)}: use {low} or more.")
        attempts = int(spark.conf.get("spark.stage.maxConsecutiveAttempts",
                                      str(SPARK_STAGE_ATTEMPTS)))
        if spark_retries and get("maxRetries") + 1 > attempts:
            raise ClusterConfigError(
                f"maxRetries={get('maxRetries')} needs {get('maxRetries') + 1} stage attempts "
                f"but Spark allows {attempts}; set spark.stage.maxConsecutiveAttempts="
                f"{get('maxRetries') + 1} when the session starts, or lower maxRetries.")
        run_id = get("runId") if self.isDefined("runId") and get("runId") else \
            uuid.uuid4().hex[:16]
        if not (self.isDefined("checkpointDir") and get("checkpointDir")):
            return None, run_id
        location = f"{get('checkpointDir').rstrip('/')}/{run_id}"
        Checkpoints(location).check_writable("checkpointDir")
        return location, run_id
