"""Fixtures for the whole repository: the tests (tests/) and the docstring examples
(sparkdist/, collected by ``--doctest-modules``) share one local[2] SparkSession.

The examples run in a namespace that holds, besides their module's own names:

- ``spark``: the shared session;
- ``df``: 2,000 churn rows (:func:`sparkdist.datasets.churn`, seed 0), cached;
- ``train``, ``test``: an 80/20 split of ``df`` (:func:`sparkdist.features.split`), cached;
- ``assembled_train``, ``assembled_test``: those with a ``features`` vector (the three
  interaction counts and ``plan`` one-hot) for estimators used without a Pipeline; the label
  is ``cancelled_within_week``;
- ``pipeline_model``: a fitted Pipeline of that FeatureAssembler and a LogisticRegression;
- ``tmp``: an empty directory of this example's own (a string path);

and, for the examples of ``sparkdist.models.als``, what that module's example builds
(``train``, ``test``: ratings; ``model``: the fitted ALSModel). Each is built once, the
first time an example reads it without assigning it first; an example that reads none of
them (and does not mention Spark) runs without starting Spark.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable
from typing import Any

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def spark():
    from sparkdist.session import get_spark

    session = get_spark(
        master="local[2]",
        app_name="sparkdist-tests",
        conf={"spark.ui.enabled": "false", "spark.sql.shuffle.partitions": "2"},
    )
    yield session
    session.stop()


# ------------------------------------------------------------------ docstring examples
Builder = Callable[[Callable[[str], Any]], dict[str, Any]]


def _churn(get: Callable[[str], Any]) -> dict[str, Any]:
    from sparkdist.datasets import churn
    from sparkdist.features import split

    df = churn(get("spark"), n=2000, seed=0, partitions=2).cache()
    parts = split(df, {"train": 0.8, "test": 0.2}, seed=0, keyCols=["customer_id"])
    return {"df": df, "train": parts["train"].cache(), "test": parts["test"].cache()}


def _churn_features() -> Any:
    from sparkdist.datasets import CHURN_COUNTS, CHURN_LABEL
    from sparkdist.features import FeatureAssembler

    return FeatureAssembler(numericCols=CHURN_COUNTS, categoricalCols=["plan"],
                            labelCol=CHURN_LABEL)


def _assembled(get: Callable[[str], Any]) -> dict[str, Any]:
    assembler = _churn_features().fit(get("train"))
    return {"assembled_train": assembler.transform(get("train")).cache(),
            "assembled_test": assembler.transform(get("test")).cache()}


def _pipeline_model(get: Callable[[str], Any]) -> dict[str, Any]:
    from pyspark.ml import Pipeline

    from sparkdist.datasets import CHURN_LABEL
    from sparkdist.models import LogisticRegression

    stages = [_churn_features(), LogisticRegression(labelCol=CHURN_LABEL, maxIter=20)]
    return {"pipeline_model": Pipeline(stages=stages).fit(get("train"))}


def _als(get: Callable[[str], Any]) -> dict[str, Any]:
    from sparkdist.datasets import ratings
    from sparkdist.features import split
    from sparkdist.models import ALS

    parts = split(ratings(get("spark"), seed=0), {"train": 0.8, "test": 0.2},
                  method="cold_start", userCol="user_id", itemCol="item_id", seed=0)
    train, test = parts["train"].cache(), parts["test"].cache()
    model = ALS(userCol="user_id", itemCol="item_id", rank=4, numUserBlocks=2, numItemBlocks=2,
                seed=0).fit(train)
    return {"train": train, "test": test, "model": model}


_SHARED: dict[str, Builder] = {
    "df": _churn, "train": _churn, "test": _churn,
    "assembled_train": _assembled, "assembled_test": _assembled,
    "pipeline_model": _pipeline_model,
}
_BY_MODULE: dict[str, dict[str, Builder]] = {
    "sparkdist.models.als": {"train": _als, "test": _als, "model": _als},
}
# An example that names none of the objects above but one of these words uses Spark too.
_USES_SPARK = re.compile(r"spark(?!dist)", re.IGNORECASE)


def _free_names(examples: list[Any]) -> set[str]:
    """The names the examples read before they assign them (in example order)."""
    assigned: set[str] = set()
    free: set[str] = set()
    for example in examples:
        try:
            names = [n for n in ast.walk(ast.parse(example.source)) if isinstance(n, ast.Name)]
        except SyntaxError:
            continue
        free |= {n.id for n in names if isinstance(n.ctx, ast.Load)} - assigned
        assigned |= {n.id for n in names if not isinstance(n.ctx, ast.Load)}
    return free


@pytest.fixture(scope="session")
def _example_objects() -> dict[Builder, dict[str, Any]]:
    """What each builder made, by builder (filled on first use)."""
    return {}


@pytest.fixture(autouse=True)
def _doctest_names(request: pytest.FixtureRequest) -> None:
    """Put the names a docstring example uses into its namespace (no-op for other tests)."""
    dtest = getattr(request.node, "dtest", None)
    if dtest is None:
        return
    namespace = request.getfixturevalue("doctest_namespace")
    namespace.clear()  # one namespace dict serves every example: start each afresh
    source = "\n".join(example.source for example in dtest.examples)
    used = _free_names(dtest.examples)
    module = next((m for m in _BY_MODULE if dtest.name == m or dtest.name.startswith(m + ".")),
                  None)
    builders = {**_SHARED, **_BY_MODULE.get(module, {})}
    if "tmp" in used:
        namespace["tmp"] = str(request.getfixturevalue("tmp_path"))
    if not (used & set(builders) or _USES_SPARK.search(source)):
        return
    built: dict[Builder, dict[str, Any]] = request.getfixturevalue("_example_objects")

    def get(name: str, table: dict[str, Builder] = _SHARED) -> Any:
        if name == "spark":
            return request.getfixturevalue("spark")
        builder = table[name]
        if builder not in built:
            built[builder] = builder(get)  # what a builder asks for comes from _SHARED
        return built[builder][name]

    namespace["spark"] = get("spark")
    for name in sorted(used & set(builders)):
        namespace[name] = get(name, builders)
