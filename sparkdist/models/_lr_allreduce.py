"""Logistic regression by all-reduce: MLlib's objective, solved in one Spark barrier stage.

MLlib runs one Spark job per L-BFGS iteration (a ``treeAggregate`` through the driver). Here
each barrier task turns its partition into a float64 matrix once, and every rank runs the
same deterministic optimiser (:mod:`sparkdist.models._quasi_newton`) on the loss and gradient
summed across the ranks by one torch.distributed all-reduce per evaluation (gloo on CPU,
NCCL on a GPU Spark assigned). Every rank therefore holds the same coefficients; rank 0
returns them as JSON and the driver builds MLlib's own ``LogisticRegressionModel`` from them.

The objective is MLlib's: ``sum(w * logloss) / sum(w) + regParam * ((1 - a) / 2 ||b||^2 +
a ||b||_1)`` with ``a = elasticNetParam``, trained on features scaled by their (weighted,
unbiased) standard deviation and centred when there is an intercept, the penalty applied in
that scaled space under ``standardization`` (else rescaled to act on the original
coefficients), a constant column's coefficient 0, the intercepts unpenalised, binomial or
multinomial by MLlib's ``family`` rule, Breeze's stopping rules for ``maxIter`` and ``tol``.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
from pyspark.ml.functions import vector_to_array
from pyspark.sql import DataFrame

from sparkdist import _internals
from sparkdist.columns import col
from sparkdist.exceptions import ParamError, SchemaError
from sparkdist.models import _lr_rows
from sparkdist.session import is_connect

if TYPE_CHECKING:
    import pyarrow as pa
    import torch

    from sparkdist.launch.barrier import WorkerContext

_LOG = logging.getLogger(__name__)
SOLVERS = ("auto", "allreduce", "mllib")
#: Rows an evaluation takes at a time on CPU: a block's matrix rows (50 features: 3 MiB) stay
#: in cache from the margins to the gradient.
CPU_BLOCK_ROWS = 8192
_BOUNDS = ("lowerBoundsOnCoefficients", "upperBoundsOnCoefficients",
           "lowerBoundsOnIntercepts", "upperBoundsOnIntercepts")


# -------------------------------------------------------------------------- driver: the plan
@dataclass(frozen=True)
class Plan:
    """What the all-reduce fit needs from the driver."""

    num_workers: int
    partitions: int  # the input's own: the stage keeps them when there are num_workers
    dim: int
    meta_classes: int  # the label's class count from its ML attributes, 0 when it has none
    budget: int  # bytes a rank may hold


def plan(solver: str, dataset: DataFrame, inner: Any, stats: Any) -> Plan | None:
    """The all-reduce plan, or None where MLlib fits (``solver='auto'`` logs why). An
    explicit ``solver='allreduce'`` that cannot run raises :class:`ParamError` instead, except
    for a label with a single class, which MLlib answers without optimising."""
    if solver == "mllib":
        return None
    try:
        found = _plan(dataset, inner, stats)
    except ParamError as err:
        if solver == "allreduce":
            raise
        _LOG.info("LogisticRegression(solver='auto') fits with MLlib: %s", err)
        return None
    if isinstance(found, str):
        _LOG.info("LogisticRegression(solver=%r) fits with MLlib: %s", solver, found)
        return None
    return found


def _plan(dataset: DataFrame, inner: Any, stats: Any) -> Plan | str:
    fix = "or set solver='mllib'"
    if is_connect(dataset):
        raise ParamError("solver='allreduce' needs a classic Spark session (a SparkContext); "
                         f"this is Spark Connect. Use solver='auto' {fix}.")
    if importlib.util.find_spec("torch") is None:
        raise ParamError("solver='allreduce' runs torch.distributed, and torch is not "
                         f"installed: pip install 'sparkdist[torch]', {fix}.")
    bounds = [name for name in _BOUNDS if inner.isSet(inner.getParam(name))]
    if bounds:
        raise ParamError(f"solver='allreduce' does not take bounds ({', '.join(bounds)}); "
                         "MLlib's L-BFGS-B does: set solver='mllib'.")
    if stats["min"] == stats["max"]:
        return "the label has a single class (MLlib's model for it needs no optimisation)"
    from sparkdist.launch.preflight import task_slots

    spark = dataset.sparkSession
    features = inner.getFeaturesCol()
    dim = _num_features(dataset, features)
    rows = int(stats["rows"])
    if dim >= rows and inner.getRegParam() == 0.0:
        raise ParamError(f"regParam=0 with {dim} features and {rows} rows: the fit has no "
                         f"unique optimum. Set regParam > 0 (e.g. 0.01) {fix}.")
    partitions = dataset.rdd.getNumPartitions()
    workers = max(1, min(task_slots(spark), partitions))
    budget, source = memory_budget(spark)
    meta = label_classes(dataset, inner.getLabelCol())
    need = math.ceil(rows / workers) * (dim + max(meta, 2)) * 8 * _lr_rows.COPIES
    if need > budget:
        raise ParamError(
            f"solver='allreduce' would hold about {need / 2**20:.0f} MiB per rank ({rows} rows "
            f"x {dim} features over {workers} ranks, x{_lr_rows.COPIES}), more than {source} = "
            f"{budget / 2**20:.0f} MiB; raise {source}, add executors, {fix}.")
    return Plan(num_workers=workers, partitions=partitions, dim=dim, meta_classes=meta,
                budget=budget)


def _num_features(dataset: DataFrame, features: str) -> int:
    attrs = dataset.schema[features].metadata.get("ml_attr", {})
    if "num_attrs" in attrs:
        return int(attrs["num_attrs"])
    first = dataset.select(col(features)).head()
    if first is None or first[0] is None:
        raise SchemaError(f"featuresCol: the first row of column '{features}' is null; drop "
                          "rows with a null vector before fitting.")
    return int(first[0].size)


def label_classes(dataset: DataFrame, label: str) -> int:
    """The class count the label's ML attributes declare (MLlib's ``getNumClasses``), or 0."""
    attrs = dataset.schema[label].metadata.get("ml_attr", {})
    if attrs.get("type") == "binary":
        return 2
    if attrs.get("type") == "nominal":
        return int(attrs.get("num_vals", len(attrs.get("vals", []))))
    return 0


def memory_budget(spark: Any) -> tuple[int, str]:
    """Bytes a Python task may hold: ``spark.executor.pyspark.memory`` where set (Spark
    enforces it), else ``spark.executor.memory`` (default 1g), and the key it came from."""
    conf = spark.sparkContext.getConf()
    for key in ("spark.executor.pyspark.memory", "spark.executor.memory"):
        value = conf.get(key)
        if value:
            return parse_bytes(value), key
    return 1 << 30, "spark.executor.memory"


def parse_bytes(text: str) -> int:
    """Spark's memory strings: ``'512m'``, ``'2g'``, ``'1024'`` (MiB).

    >>> parse_bytes("2g"), parse_bytes("512"), parse_bytes("64k")
    (2147483648, 536870912, 65536)
    """
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgtp]?)b?\s*", text.lower())
    if not found:
        raise ParamError(f"cannot read the memory size {text!r}; write it as Spark does, "
                         "e.g. '2g' or '512m'.")
    power = "kmgtp".find(found.group(2)) + 1 if found.group(2) else 2
    return int(float(found.group(1)) * 1024 ** power)


# ---------------------------------------------------------------------------- driver: the fit
def fit(dataset: DataFrame, inner: Any, found: Plan, weight_name: str | None,
        solver: str = "allreduce") -> Any:
    """Fit ``inner`` (an MLlib LogisticRegression with the caller's Params) by all-reduce;
    return the pyspark ``LogisticRegressionModel`` MLlib's own fit would have returned, with
    its training summary (:func:`attach_summary`).

    The plan assumes even partitions. Under ``solver='auto'`` a partition over the budget
    (a skewed input the stage kept as it was) makes the fit repartition the rows evenly and
    run again, and where the rows were spread evenly already, fit with MLlib."""
    columns, args = _stage_input(inner, found, weight_name)
    rows = dataset.select(*columns)
    started = time.perf_counter()
    try:
        result = _solve(rows, args, found.num_workers)
    except ParamError as err:
        if solver != "auto" or not str(err).startswith(_lr_rows.OVER_BUDGET):
            raise
        if found.partitions != found.num_workers:  # the stage spread them evenly already
            _LOG.info("LogisticRegression(solver='auto') fits with MLlib: %s", err)
            return inner.fit(dataset)
        _LOG.info("LogisticRegression(solver='auto'): %s; the input's partitions are uneven, "
                  "so its rows are repartitioned evenly over %d ranks.", err, found.num_workers)
        return fit(dataset.repartition(found.num_workers), inner,
                   dataclasses.replace(found, partitions=0), weight_name, solver)
    _LOG.info("LogisticRegression(solver='allreduce'): %d ranks, %d iterations (%s), %.2f s",
              found.num_workers, result["iterations"], result["reason"],
              time.perf_counter() - started)
    model = inner._copyValues(
        _internals.wrap_java_model(inner, java_model(dataset.sparkSession, inner.uid, result)))
    attach_summary(model, dataset, result["objectiveHistory"])
    return model


def _stage_input(inner: Any, found: Plan, weight_name: str | None) -> tuple[list[Any],
                                                                            dict[str, Any]]:
    """The stage's columns and the workers' arguments."""
    weight = inner.getWeightCol() if inner.isDefined("weightCol") else ""
    # as arrays: Spark converts them to Arrow about twice as fast as vector structs (sparse
    # vectors arrive densified)
    columns = [vector_to_array(col(inner.getFeaturesCol())),
               col(inner.getLabelCol()).cast("double")]
    if weight:
        columns.append(col(weight).cast("double"))
    alpha, reg = inner.getElasticNetParam(), inner.getRegParam()
    args = {"dim": found.dim, "meta_classes": found.meta_classes, "budget": found.budget,
            "family": inner.getFamily().lower(), "fit_intercept": inner.getFitIntercept(),
            "standardization": inner.getStandardization(), "reg": reg,
            "l1": alpha * reg, "l2": (1.0 - alpha) * reg, "max_iter": inner.getMaxIter(),
            "tol": inner.getTol(), "weighted": bool(weight),
            "names": {"featuresCol": inner.getFeaturesCol(), "labelCol": inner.getLabelCol(),
                      "weightCol": weight_name or weight}}
    return columns, args


def _solve(rows: DataFrame, args: dict[str, Any], num_workers: int) -> dict[str, Any]:
    """Rank 0's result. Where the ranks' Python workers still hold the rows of the last fit
    of the same cached data (:mod:`._lr_rows`), the stage runs over a placeholder of one
    row per rank instead of reading them again."""
    from sparkdist.launch.barrier import BarrierSettings, run_barrier

    key = _lr_rows.data_key(rows, ranks=num_workers, dim=args["dim"],
                                centred=args["fit_intercept"], weighted=args["weighted"])

    def stage(df: DataFrame, reuse: bool) -> dict[str, Any]:
        payload = run_barrier(df, worker, {**args, "resident": key, "reuse": reuse},
                              num_workers, settings=BarrierSettings(rendezvous_timeout_s=300.0),
                              description="sparkdist LogisticRegression (allreduce)")
        result: dict[str, Any] = json.loads(payload)
        return result

    if key in _lr_rows.REMEMBERED:
        assert key is not None
        placeholder = rows.sparkSession.range(num_workers, numPartitions=num_workers)
        result = stage(placeholder, reuse=True)
        if "missing" not in result:
            _LOG.info("LogisticRegression(solver='allreduce'): the ranks held the rows of the "
                      "last fit of the same cached data, so it read none.")
            return result
        _LOG.info("LogisticRegression(solver='allreduce'): the workers no longer hold every "
                  "piece of the last fit's rows; reading them again.")
    result = stage(rows, reuse=False)
    if key is not None and result.get("held"):
        _lr_rows.REMEMBERED.held(key)
    elif key is not None:
        _lr_rows.REMEMBERED.forget(key)
    return result


def attach_summary(model: Any, dataset: DataFrame, history: list[float]) -> None:
    """MLlib's own training summary on ``model``, built by MLlib's ``createSummary`` as its
    fit builds it: ``objectiveHistory`` (the solver's, the starting point first, MLlib's
    objective), ``totalIterations``, and the metrics on the training rows, computed lazily on
    first use as MLlib's are."""
    _internals.push_params_to_java(model)  # the summary reads the label/features/weight cols
    _internals.java_object(model).createSummary(
        _internals.java_dataframe(dataset),
        _java_doubles(dataset.sparkSession, np.asarray(history, dtype=float)))


def java_model(spark: Any, uid: str, result: dict[str, Any]) -> Any:
    """MLlib's ``LogisticRegressionModel`` (JVM) from the solver's result, built through its
    constructor as MLlib's own fit builds it (both matrices compressed as MLlib does)."""
    jvm = _internals.jvm(spark)
    linalg = jvm.org.apache.spark.ml.linalg
    coefficients = np.asarray(result["coefficients"], dtype=np.float64)
    rows = len(result["intercepts"])
    matrix = linalg.DenseMatrix(rows, coefficients.size // rows,
                                _java_doubles(spark, coefficients), True).compressed()
    intercepts = linalg.DenseVector(_java_doubles(spark, np.asarray(result["intercepts"])))
    return jvm.org.apache.spark.ml.classification.LogisticRegressionModel(
        uid, matrix, intercepts.compressed(), int(result["numClasses"]),
        bool(result["multinomial"]))


def _java_doubles(spark: Any, values: np.ndarray) -> Any:
    """A JVM ``double[]`` from ``values`` in three py4j calls (bytes, not one call a value)."""
    gateway, jvm = _internals.gateway(spark), _internals.jvm(spark)
    array = gateway.new_array(jvm.double, int(values.size))
    buffer = jvm.java.nio.ByteBuffer.wrap(bytearray(values.astype(">f8").tobytes()))
    buffer.asDoubleBuffer().get(array)
    return array


# ----------------------------------------------------------------------- executor: the worker
def worker(context: WorkerContext, batches: Iterator[pa.RecordBatch],
           args: dict[str, Any]) -> bytes | None:
    """Barrier-task entry point: read the partition (or find it held), join the group, solve,
    return JSON."""
    import torch

    from sparkdist.launch import gpus
    from sparkdist.torchtrain.backends import TorchBackend

    torch.set_num_threads(max(1, context.cpus))
    device = gpus.apply(gpus.plan_for_task("auto", context.gpus))
    backend = TorchBackend()
    try:
        if args["reuse"]:
            for _ in batches:  # the placeholder's row
                pass
            piece, prepared = _lr_rows.piece_of(args["resident"])
            backend.init(context, device)
            solver = _Solver(context, backend, device, args)
            if not _lr_rows.complete(piece, context.world_size, solver.sum) or not prepared:
                return b'{"missing": true}' if context.rank == 0 else None
            context.log(f"holds piece {piece} of the rows ({prepared.rows} rows)")
            return solver.solve(prepared)
        _lr_rows.drop()  # before reading: what it holds is not these rows
        started = time.perf_counter()
        part = _lr_rows.read_partition(batches, args)
        context.log(f"read {part.rows} rows in {time.perf_counter() - started:.2f} s")
        backend.init(context, device)
        solver = _Solver(context, backend, device, args)
        prepared = solver.prepare(part)
        held = bool(args["resident"]) and _lr_rows.hold(args["resident"], context.rank,
                                                            prepared)
        all_held = solver.sum(np.array([float(held)]))[0] == context.world_size
        return solver.solve(prepared, held=bool(all_held))
    except Exception as err:
        context.report_failure(err)  # before the shutdown: the peers fail once links close
        raise
    finally:
        backend.shutdown()


class _Solver:
    """One rank's fit: global statistics, standardisation, optimisation, MLlib's layout."""

    def __init__(self, context: WorkerContext, backend: Any, device: torch.device,
                 args: dict[str, Any]) -> None:
        self.context, self.backend, self.device, self.args = context, backend, device, args
        self.evaluations = 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        import torch

        return self.backend.all_reduce_sum(torch.from_numpy(values)).numpy()

    def _max(self, values: np.ndarray) -> np.ndarray:
        import torch
        import torch.distributed as dist

        tensor = torch.from_numpy(values).to(self.device)
        dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return tensor.cpu().numpy()

    def prepare(self, part: _lr_rows.Partition) -> _lr_rows.Prepared:
        """Check every rank's rows (the same error on every rank), then standardise this
        rank's in place: what every later fit of the same rows starts from."""
        import torch

        dim, fit_intercept = self.args["dim"], self.args["fit_intercept"]
        high, low = np.full(dim, -np.inf), np.full(dim, np.inf)
        if part.rows:  # torch's reductions: 2.5x numpy's down the columns; NaN propagates
            high, low = (reduce(torch.from_numpy(part.x), dim=0).numpy()
                         for reduce in (torch.amax, torch.amin))
        # NaN and infinities show in the extremes: count them only where they do
        non_finite = 0 if np.isfinite(high).all() and np.isfinite(low).all() else int(
            (~np.isfinite(part.x)).sum())
        top = self._max(np.concatenate([[part.y.max() if part.rows else -1.0], high, -low]))
        high, low = top[1:dim + 1], -top[dim + 1:]
        classes = max(int(top[0]) + 1, self.args["meta_classes"])
        shift = np.where(np.isfinite(high + low), (high + low) / 2.0, 0.0)
        part.x -= shift  # in place: sums about the middle of each column lose no precision
        w, x = part.w, part.x
        hist = np.bincount(part.y.astype(np.int64), weights=w, minlength=classes)
        totals = self.sum(np.concatenate([
            [w.sum(), (w * w).sum(), part.bad_length, part.null_vectors, part.bad_weights,
             non_finite],
            w @ x, np.einsum("i,ij,ij->j", w, x, x), hist[:classes]]))
        self._check(totals[:6])
        weight_sum, square_sum = totals[0], totals[1]
        first, second = totals[6:6 + dim], totals[6 + dim:6 + 2 * dim]
        mean = shift + first / weight_sum
        denominator = weight_sum - square_sum / weight_sum
        m2 = second - weight_sum * (mean - shift) ** 2
        var = np.maximum(m2 / denominator, 0.0) if denominator > 0 else np.zeros(dim)
        std = np.where(high == low, 0.0, np.sqrt(var))  # a constant column: coefficient 0
        inverse = np.divide(1.0, std, out=np.zeros(dim), where=std != 0)
        x -= (mean - shift) if fit_intercept else -shift  # centred only with an intercept
        x *= inverse
        return _lr_rows.Prepared(
            x=x, y=part.y, w=w, max_label=int(top[0]), weight_sum=float(weight_sum),
            hist=totals[6 + 2 * dim:], mean=mean, std=std, inverse=inverse)

    def solve(self, prepared: _lr_rows.Prepared, held: bool = False) -> bytes | None:
        """Optimise on the prepared rows; rank 0 returns the model as JSON (with whether
        every rank holds its rows for the next fit)."""
        classes = self._classes(prepared.max_label)
        self.prepared = prepared
        theta = self._optimise(classes, prepared.hist[:classes], prepared.std)
        if self.context.rank != 0:
            return None
        model = self._model(theta, classes, prepared.mean, prepared.inverse)
        return json.dumps({**model, "held": held}).encode()

    def _classes(self, max_label: int) -> int:
        args = self.args
        meta, names = args["meta_classes"], args["names"]
        if meta and max_label >= meta:
            raise SchemaError(f"labelCol: column '{names['labelCol']}' holds the label "
                              f"{max_label}, but its metadata declares {meta} classes (0 to "
                              f"{meta - 1}); re-index the label or drop those rows.")
        classes = max(max_label + 1, meta)
        self.multinomial = args["family"] == "multinomial" or (
            args["family"] == "auto" and classes > 2)
        if not self.multinomial and classes > 2:
            raise ParamError(f"family='binomial' fits 2 classes, but labelCol "
                             f"'{names['labelCol']}' holds {classes}; use family='auto'.")
        return classes

    def _check(self, counts: np.ndarray) -> None:
        names = self.args["names"]
        features, weight = names["featuresCol"], names["weightCol"]
        bad_length, nulls, bad_weights, non_finite = (int(c) for c in counts[2:6])
        if nulls:
            raise SchemaError(f"featuresCol: column '{features}' has {nulls} null vectors; "
                              "drop those rows (or assemble with nullPolicy='impute').")
        if bad_length:
            raise SchemaError(f"featuresCol: {bad_length} vectors of column '{features}' do "
                              f"not have {self.args['dim']} values (the length of the first); "
                              "assemble every row the same way.")
        if non_finite:
            raise SchemaError(f"featuresCol: column '{features}' holds {non_finite} NaN or "
                              "infinite values; drop or impute those rows first (e.g. "
                              "FeatureAssembler(nullPolicy='impute')).")
        if bad_weights:
            raise SchemaError(f"weightCol: column '{weight}' holds {bad_weights} null, NaN, "
                              "infinite or negative weights; weights must be finite and >= 0.")
        if counts[0] <= 0:
            raise SchemaError(f"weightCol: the weights of column '{weight}' sum to "
                              f"{counts[0]:g}; at least one row needs a positive weight.")

    def _optimise(self, classes: int, hist: np.ndarray, std: np.ndarray) -> np.ndarray:
        from sparkdist.models._quasi_newton import minimize

        args, dim = self.args, self.args["dim"]
        sets = classes if self.multinomial else 1
        coefficients = sets * dim
        size = coefficients + (sets if args["fit_intercept"] else 0)
        theta = np.zeros(size)
        if args["fit_intercept"] and self.multinomial:
            raw = np.log1p(hist)
            theta[coefficients:] = raw - raw.mean()
        elif args["fit_intercept"] and hist[0] > 0 and hist[1] > 0:
            theta[coefficients] = math.log(hist[1] / hist[0])
        # penalty weights per entry: on the scaled coefficients, or rescaled to act on the
        # original ones (standardization=False); never on the intercepts
        scale = np.ones(dim) if args["standardization"] else np.divide(
            1.0, std, out=np.zeros(dim), where=std != 0)
        per_entry = np.zeros(size)
        per_entry[:coefficients] = np.tile(scale, sets)
        self.l2 = args["l2"] * per_entry ** 2
        l1 = args["l1"] * per_entry
        result = minimize(self._objective(classes), theta, max_iter=args["max_iter"],
                          tol=args["tol"], l1=l1)
        self.result = result
        self.context.log(f"{result.iterations} iterations ({result.reason}), "
                         f"{self.evaluations} evaluations")
        return result.x

    def _objective(self, classes: int) -> Any:
        import torch

        part, device, dim = self.prepared, self.device, self.args["dim"]
        x = torch.from_numpy(part.x).to(device)
        y = torch.from_numpy(part.y).to(device)
        w = torch.from_numpy(part.w).to(device)
        fit_intercept = self.args["fit_intercept"]
        labels = y.long()[:, None]
        minus_one = torch.full_like(y[:, None], -1.0)
        # On CPU, a block of rows stays in cache from the margins to the gradient: one pass
        # over the matrix an evaluation instead of two (about 2x on 450,000 x 50).
        block = max(1, part.rows) if device.type == "cuda" else CPU_BLOCK_ROWS

        def terms(theta: torch.Tensor, rows: slice) -> torch.Tensor:
            """The block's weighted loss sum and gradient sum, as one vector."""
            xb, yb, wb = x[rows], y[rows], w[rows]
            if self.multinomial:  # in place on one (rows, classes) buffer, one exp pass
                coefficients = theta[:classes * dim].view(classes, dim)
                intercepts = theta[classes * dim:] if fit_intercept else theta.new_zeros(classes)
                residual = torch.addmm(intercepts, xb, coefficients.T)  # the margins, first
                residual -= residual.amax(dim=1, keepdim=True)
                own = residual.gather(1, labels[rows])[:, 0]
                residual.exp_()
                total = residual.sum(dim=1, keepdim=True)
                loss = (wb * (torch.log(total[:, 0]) - own)).sum()
                residual /= total  # the probabilities
                residual.scatter_add_(1, labels[rows], minus_one[rows])
                residual *= wb[:, None]
                grads = [(residual.T @ xb).reshape(-1)]
                if fit_intercept:
                    grads.append(residual.sum(dim=0))
            else:
                margin = xb @ theta[:dim]
                if fit_intercept:
                    margin += theta[dim]
                loss = (wb * (torch.logaddexp(margin, torch.zeros_like(margin))
                              - yb * margin)).sum()
                residual = wb * (torch.sigmoid(margin) - yb)
                grads = [residual @ xb] + ([residual.sum().reshape(1)] if fit_intercept else [])
            return torch.cat([loss.reshape(1), *grads])

        def local(theta: torch.Tensor) -> torch.Tensor:
            summed = theta.new_zeros(1 + theta.numel())  # loss, gradient
            for start in range(0, part.rows, block):
                summed += terms(theta, slice(start, start + block))
            return summed

        def objective(theta: np.ndarray) -> tuple[float, np.ndarray]:
            self.evaluations += 1
            with torch.no_grad():
                summed = self.sum(local(torch.from_numpy(theta).to(device)).cpu().numpy())
            value = summed[0] / part.weight_sum + 0.5 * float(self.l2 @ (theta * theta))
            return float(value), summed[1:] / part.weight_sum + self.l2 * theta

        return objective

    def _model(self, theta: np.ndarray, classes: int, mean: np.ndarray,
               inverse: np.ndarray) -> dict[str, Any]:
        """Coefficients and intercepts in the original feature space, as MLlib returns them."""
        args, dim = self.args, self.args["dim"]
        sets = classes if self.multinomial else 1
        scaled = theta[:sets * dim].reshape(sets, dim)
        coefficients = scaled * inverse
        if args["fit_intercept"]:
            intercepts = theta[sets * dim:] - coefficients @ mean
        else:
            intercepts = np.zeros(sets)
        if self.multinomial and args["reg"] == 0.0:  # identifiable: centred across classes
            coefficients -= coefficients.mean(axis=0)
        if self.multinomial and args["fit_intercept"]:
            intercepts -= intercepts.mean()
        return {"numClasses": classes, "multinomial": self.multinomial,
                "coefficients": coefficients.reshape(-1).tolist(),
                "intercepts": intercepts.tolist(), "iterations": self.result.iterations,
                "reason": self.result.reason, "objectiveHistory": self.result.history,
                "evaluations": self.evaluations, "placement": self.context.placement}
