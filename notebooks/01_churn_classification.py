# Databricks notebook source
# MAGIC %md
# MAGIC # Churn: logistic regression, random forest and XGBoost side by side
# MAGIC
# MAGIC Which customers cancel within a week? The churn sample (`data/churn_sample.parquet`,
# MAGIC 5,000 synthetic customers, schema in `data/README.md`) goes through sparkdist's shared
# MAGIC data contract — `FeatureAssembler` and a deterministic stratified `split` — into three
# MAGIC model families. `sparkdist.workflows.run` fits, evaluates and tracks them (one MLflow run,
# MAGIC a nested run per model), exactly as `jobs/train.py jobs/configs/churn.yaml` does.
# MAGIC
# MAGIC Parameters are Databricks widgets; elsewhere set `SPARKDIST_NB_<NAME>` (e.g.
# MAGIC `SPARKDIST_NB_NUM_TREES=50`) or keep the defaults.

# COMMAND ----------

from sparkdist import notebook as nb

spark = nb.spark_session()
data_path = nb.find_path(nb.param("data_path", "data/churn_sample.parquet"))
num_trees = nb.param("num_trees", 20)
xgb_rounds = nb.param("xgb_rounds", 50)
seed = nb.param("seed", 42)
track = nb.param("track", True)
experiment = nb.param("experiment", "sparkdist-churn-notebook")
print(f"Spark {spark.version} on {spark.conf.get('spark.master', '?')}; data: {data_path}")

# COMMAND ----------

# MAGIC %md
# MAGIC ## The data

# COMMAND ----------

df = spark.read.parquet(data_path)
nb.show(df.limit(5))
nb.show(df.groupBy("cancelled_within_week").count())

# COMMAND ----------

# MAGIC %md
# MAGIC ## Features and split
# MAGIC
# MAGIC The same settings drive this exploration and the workflow below, so the features and
# MAGIC the test rows shown here are the ones the models see. The split is a pure function of
# MAGIC each row's `customer_id` and the seed: rerunning gives the same test set.

# COMMAND ----------

from sparkdist.config import parse_config
from sparkdist.features import FeatureAssembler, split

config = parse_config({
    "name": "churn-notebook",
    "data": {"path": data_path},
    "features": {"numericCols": ["month_interaction_count", "week_interaction_count",
                                 "day_interaction_count"],
                 "categoricalCols": ["plan", "region"], "labelCol": "cancelled_within_week"},
    "split": {"method": "stratified", "labelCol": "cancelled_within_week",
              "fractions": {"train": 0.8, "test": 0.2}, "keyCols": ["customer_id"],
              "seed": seed},
    "models": [
        {"type": "LogisticRegression", "params": {"maxIter": 10}},
        {"type": "RandomForestClassifier",
         "params": {"numTrees": num_trees, "maxDepth": 6, "seed": seed}},
        {"type": "XGBoostClassifier",
         "params": {"num_workers": 2, "max_depth": 4, "n_estimators": xgb_rounds,
                    "learning_rate": 0.1}},
    ],
    "tracking": {"enabled": track, "experiment": experiment},
})
parts = split(df, **config.split.model_dump(exclude_none=True))
print("split:", parts.metadata["counts"])
assembler = FeatureAssembler(**config.features.model_dump()).fit(parts["train"])
print("features:", assembler.featureNames)
nb.show(assembler.transform(parts["test"]).select("customer_id", "features").limit(3))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Fit, evaluate and track the three models

# COMMAND ----------

from sparkdist import workflows

result = workflows.run(config, spark=spark)
print(result.table())

# COMMAND ----------

# MAGIC %md
# MAGIC ## ROC curves on the test split

# COMMAND ----------

from sparkdist import plots

test = parts["test"].cache()
for model_result in result.models:
    scored = model_result.model.transform(test)
    roc = plots.roc_pr_curves(scored, "cancelled_within_week", "probability")["roc_curve"]
    roc.axes[0].set_title(f"ROC curve: {model_result.name} "
                          f"(AUC {model_result.metrics['auc']:.3f})")
    nb.show(roc)
metrics = {r.name: r.metrics for r in result.models}
test.unpersist()
