# Databricks notebook source
# MAGIC %md
# MAGIC # Recommendations with ALS on string ids
# MAGIC
# MAGIC Ratings keyed by string ids (`u00042`, `i0007`) train `sparkdist.models.ALS`, which maps
# MAGIC ids of any type to MLlib's integer indices and back. A cold-start-aware split keeps every
# MAGIC test user and item in training, so no metric is NaN. We report RMSE, ranking@k, and
# MAGIC example recommendations with the original ids.
# MAGIC
# MAGIC Data: `data/ratings_sample.parquet` (300 users x 120 items, see `data/README.md`); set the
# MAGIC `data_path` widget to an empty string to generate ratings with `sparkdist.datasets`.

# COMMAND ----------

from sparkdist import notebook as nb

spark = nb.spark_session()
data_path = nb.param("data_path", "data/ratings_sample.parquet")
rank = nb.param("rank", 8)
max_iter = nb.param("max_iter", 10)
reg_param = nb.param("reg_param", 0.1)
k = nb.param("k", 10)
num_blocks = nb.param("num_blocks", 2)  # user/item blocks: 2 suit a small sample
seed = nb.param("seed", 42)
print(f"Spark {spark.version} on {spark.conf.get('spark.master', '?')}")

# COMMAND ----------

from sparkdist import datasets

if data_path:
    ratings = spark.read.parquet(nb.find_path(data_path))
else:
    ratings = datasets.ratings(spark, string_ids=True, density=0.3, seed=seed)
ratings = ratings.cache()
print(f"{ratings.count()} ratings")
nb.show(ratings.limit(5))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Cold-start-aware split
# MAGIC
# MAGIC Rows whose user or item would appear only in the test side move to training.

# COMMAND ----------

from sparkdist.features import split

parts = split(ratings, {"train": 0.8, "test": 0.2}, method="cold_start", seed=seed,
              userCol="user_id", itemCol="item_id")
print(parts.metadata)
train, test = parts["train"].cache(), parts["test"].cache()

# COMMAND ----------

# MAGIC %md
# MAGIC ## Fit ALS and evaluate: RMSE and ranking@k

# COMMAND ----------

from sparkdist.evaluation import evaluate
from sparkdist.models import ALS

als = ALS(userCol="user_id", itemCol="item_id", ratingCol="rating", rank=rank,
          maxIter=max_iter, regParam=reg_param, numUserBlocks=num_blocks,
          numItemBlocks=num_blocks, seed=seed)
model = als.fit(train)
metrics = evaluate(model, test, k=k)
for name, value in metrics.items():
    print(f"{name:>14}: {value:.4f}")

# COMMAND ----------

from sparkdist import plots

by_k = {kk: model.rankingMetrics(test, k=kk) for kk in {1, 5} - {k}}
by_k[k] = metrics
nb.show(plots.ranking_by_k(by_k))

# COMMAND ----------

# MAGIC %md
# MAGIC ## Recommendations, with the original ids

# COMMAND ----------

recommendations = model.recommendForAllUsers(5)
nb.show(recommendations.orderBy("user_id").limit(5))

first_user = test.select("user_id").orderBy("user_id").first()["user_id"]
print(f"top items for {first_user}:")
nb.show(model.recommendForUserSubset(test.where(test.user_id == first_user), 5))

# COMMAND ----------

train.unpersist()
test.unpersist()
ratings.unpersist()
