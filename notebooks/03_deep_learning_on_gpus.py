# Databricks notebook source
# MAGIC %md
# MAGIC # Deep learning on Spark: `TorchEstimator`, on GPUs when the cluster has them
# MAGIC
# MAGIC An MLP learns churn from the assembled features (settings of
# MAGIC `jobs/configs/churn_torch.yaml`). `fit` starts one Spark barrier stage of `numWorkers`
# MAGIC tasks that train data-parallel (torch DistributedDataParallel: gloo on CPU, NCCL on GPU).
# MAGIC With `useGpu="auto"` each task trains on the GPU Spark assigned to it
# MAGIC (`spark.task.resource.gpu.amount=1`), on the CPU otherwise. Then: loss curves,
# MAGIC distributed inference with `transform`, a learning-rate search whose trials are
# MAGIC distributed fits, and checkpoint/resume by running it.

# COMMAND ----------

from sparkdist import notebook as nb

spark = nb.spark_session()
data_path = nb.find_path(nb.param("data_path", "data/churn_sample.parquet"))
num_workers = nb.param("num_workers", 2)
epochs = nb.param("epochs", 4)
batch_size = nb.param("batch_size", 128)
learning_rate = nb.param("learning_rate", 0.005)
checkpoint_dir = nb.param("checkpoint_dir", "")  # empty: a fresh temporary directory
seed = nb.param("seed", 42)
big_width = nb.param("big_width", 512)  # the "too big" network's layer width (fsdp section)
worker_budget_mb = nb.param("worker_budget_mb", 0.0)  # 0: 3/4 of its whole training state
tuning_trials = nb.param("tuning_trials", 4)
print(f"Spark {spark.version} on {spark.conf.get('spark.master', '?')}; data: {data_path}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Where will it train?
# MAGIC
# MAGIC The same check `sparkdist doctor --gpu` runs: whether this application schedules GPUs.

# COMMAND ----------

from sparkdist.launch.preflight import findings

for finding in findings(spark, num_workers, use_gpu="auto"):
    print(f"{finding.severity:>7}  {finding.check}: {finding.message}")
gpu_scheduled = bool(spark.conf.get("spark.task.resource.gpu.amount", None))
print("training on:", "GPU executors (useGpu='auto')" if gpu_scheduled else
      "CPU (no GPUs scheduled; useGpu='auto' falls back to the CPU)")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Features and split (the shared data contract)

# COMMAND ----------

from sparkdist.features import FeatureAssembler, split

df = spark.read.parquet(data_path)
parts = split(df, {"train": 0.8, "test": 0.2}, method="stratified",
              labelCol="cancelled_within_week", keyCols=["customer_id"], seed=seed)
assembler = FeatureAssembler(
    numericCols=["month_interaction_count", "week_interaction_count", "day_interaction_count"],
    categoricalCols=["plan", "region"], labelCol="cancelled_within_week",
    standardize=True).fit(parts["train"])
# One partition per worker, so that every rank trains on its share of the rows.
train = assembler.transform(parts["train"]).repartition(num_workers).cache()
test = assembler.transform(parts["test"]).cache()
print("split:", parts.metadata["counts"], "features:", len(assembler.featureNames))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Train (a progress bar per epoch)

# COMMAND ----------

from sparkdist.models import TorchEstimator

settings = dict(model="sparkdist.torchtrain.nets.MLP", modelKwargs={"hidden": [32, 16]},
                labelCol="cancelled_within_week", loss="bce", learningRate=learning_rate,
                batchSize=batch_size, numWorkers=num_workers, useGpu="auto", seed=seed,
                progress=True)
estimator = TorchEstimator(epochs=epochs, validationFraction=0.1, **settings)
model = estimator.fit(train)
print(model.trainingSummary)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Loss curves

# COMMAND ----------

import pandas as pd

history = pd.DataFrame(model.history).set_index("epoch")
nb.show(history)
curves = history[[c for c in ("loss", "val_loss") if c in history]].plot(
    title="Loss by epoch", marker="o").figure
nb.show(curves)

# COMMAND ----------

# MAGIC %md
# MAGIC ## Distributed inference
# MAGIC
# MAGIC `transform` scores on the executors (on their GPUs when assigned) and adds MLlib's
# MAGIC `prediction`, `probability` and `rawPrediction` columns, so evaluators work as is.

# COMMAND ----------

from sparkdist.evaluation import evaluate

predictions = model.transform(test)
nb.show(predictions.select("customer_id", "cancelled_within_week", "probability",
                           "prediction").limit(5))
metrics = evaluate(model, test)
print({name: round(value, 4) for name, value in metrics.items()})

# COMMAND ----------

# MAGIC %md
# MAGIC ## The same fit with a Keras 3 model: `KerasEstimator`
# MAGIC
# MAGIC A function builds the uncompiled `keras.Model` (here sparkdist's Keras MLP); the loss
# MAGIC and optimizer are Keras' own.
# MAGIC Keras runs on its torch backend (`KERAS_BACKEND=torch`, set by sparkdist where unset),
# MAGIC so the same barrier stage, DDP, checkpoints and `transform` train and score it. The
# MAGIC fitted model saves as its JSON config plus weights; `keras_model()` returns the trained
# MAGIC `keras.Model`.

# COMMAND ----------

from sparkdist.models import KerasEstimator

# sparkdist's Keras MLP (any function that builds an uncompiled keras.Model will do)
keras_model = KerasEstimator(
    model="sparkdist.torchtrain.keras_net.mlp", modelKwargs={"hidden": [32, 16]},
    loss="binary_crossentropy", optimizer="adam", epochs=epochs,
    labelCol="cancelled_within_week", learningRate=learning_rate, batchSize=batch_size,
    numWorkers=num_workers, useGpu="auto", seed=seed, progress=True).fit(train)
keras_metrics = evaluate(keras_model, test)
print("Keras:", {name: round(value, 4) for name, value in keras_metrics.items()})
keras_model.keras_model().summary()

# COMMAND ----------

# MAGIC %md
# MAGIC ## A model too big for one worker: `strategy="fsdp"`
# MAGIC
# MAGIC Under `ddp` every worker holds the whole network, its gradients and Adam's two moments:
# MAGIC four times the weights. `strategy="fsdp"` shards all of it over the workers (FSDP2), so
# MAGIC each holds `1/numWorkers` of it, and the fitted model is still the whole network. On a
# MAGIC cluster whose Python workers have a memory cap (`spark.executor.pyspark.memory`), a
# MAGIC network whose training state is over the cap fails under `ddp` and trains under `fsdp`
# MAGIC (docs/deep-models.md "Models larger than one device" has the measured case). Here the budget
# MAGIC is `worker_budget_mb` (default: three quarters of the whole training state), compared
# MAGIC with what each rank reports holding; set the cap on the cluster to have it enforced.

# COMMAND ----------

big = {"hidden": [big_width] * 3}
widths = [len(assembler.featureNames), *big["hidden"], 1]
# float32 parameters, their gradients and Adam's two moments: four copies of the weights
whole_mb = 4 * 4 * sum(a * b + b for a, b in zip(widths, widths[1:])) / 2**20
budget_mb = worker_budget_mb or 0.75 * whole_mb
sharded = TorchEstimator(epochs=1, strategy="fsdp",
                         **{**settings, "modelKwargs": big}).fit(train)
held = [rank["state_mb"] for rank in sharded.trainingSummary["ranks"]]
print(f"whole training state {whole_mb:.1f} MiB > budget {budget_mb:.1f} MiB per worker; "
      f"each fsdp rank holds {held} MiB")
print("loss:", [round(h["loss"], 4) for h in sharded.history],
      "| the fitted network:", sum(v.numel() for v in sharded.module().state_dict().values()),
      "values")

# COMMAND ----------

# MAGIC %md
# MAGIC ## Tune the learning rate: each trial a distributed fit, pruned while it runs
# MAGIC
# MAGIC `Tuner` samples `learningRate` with Optuna (TPE). Each trial is an ordinary fit of the
# MAGIC estimator on its `numWorkers` task slots; trials wait for free slots instead of
# MAGIC deadlocking. The Tuner holds out validation rows, the fit reports its validation accuracy
# MAGIC after each epoch, and the median pruner cancels the barrier job of a trial that falls
# MAGIC behind the others (state PRUNED, with the seconds until its slots were free).

# COMMAND ----------

from optuna.distributions import FloatDistribution

from sparkdist.tuning import Tuner

tuner = Tuner(estimator=TorchEstimator(epochs=epochs, **{**settings, "progress": False}),
              space={"learningRate": FloatDistribution(1e-3, 1e-1, log=True)},
              evaluator="auc", numTrials=tuning_trials, parallelism=2, pruner="median",
              refit=False, seed=seed)
tuned = tuner.fit(train)
nb.show(tuned.trials.toPandas())
print("best:", tuned.bestParams, "validation auc:", round(tuned.bestValue, 4))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Checkpoints and resume
# MAGIC
# MAGIC With `checkpointDir`, rank 0 saves weights, optimizer state and history every
# MAGIC `checkpointEvery` epochs under `checkpointDir/runId`. A failed task makes Spark retry the
# MAGIC stage, which resumes from the latest checkpoint. Fitting again with the same `runId`
# MAGIC continues an interrupted run with the same settings and data; a completed run is
# MAGIC continued only when asked (`resume="required"`). Here: 2 epochs, then the same run
# MAGIC continued to 2 more.

# COMMAND ----------

import tempfile

checkpoints = checkpoint_dir or tempfile.mkdtemp(prefix="sparkdist-notebook-ckpt-")
first = TorchEstimator(epochs=2, checkpointDir=checkpoints, runId="demo", **settings).fit(train)
print("first fit: resumed_from_epoch =", first.trainingSummary["resumed_from_epoch"],
      "| epochs trained:", [h["epoch"] for h in first.history])
resumed = TorchEstimator(epochs=4, checkpointDir=checkpoints, runId="demo", resume="required",
                         **settings).fit(train)
print("second fit: resumed_from_epoch =", resumed.trainingSummary["resumed_from_epoch"],
      "| epochs in its history:", [h["epoch"] for h in resumed.history])
print(f"checkpoints of run 'demo' are under {checkpoints}")

# COMMAND ----------

train.unpersist()
test.unpersist()
