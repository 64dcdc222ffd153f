"""Checks that run on the driver before a barrier stage is launched, and ``sparkdist doctor``.

A barrier stage needs all of its tasks running at once. Asked for more tasks than the cluster
has slots, Spark does not fail straight away: it re-checks every 15 s, 40 times by default
(``spark.scheduler.barrier.maxConcurrentTasksCheck.*``), so a typo in ``num_workers`` costs
ten minutes. Other settings make the stage fail late or run unsafely: dynamic allocation (Spark
rejects barrier stages with it), GPUs requested but not scheduled, and Spark security switched on
while sparkdist's own traffic (torch.distributed, Horovod, XGBoost) is plain TCP. These checks
turn each into an immediate, explained error that names the Spark conf key and the value to set.
TorchEstimator and the XGBoost estimators run them first thing in ``fit``.

:func:`findings` is the one implementation; :func:`preflight` raises its first error and
``sparkdist doctor`` prints all of them (:func:`report`).

Examples
--------
>>> task_slots(spark)                      # local[2] -> 2
2
>>> [finding.check for finding in preflight(spark, 2)]
['dynamic-allocation', 'gpu', 'security', 'task-slots']
>>> preflight(spark, 8)
Traceback (most recent call last):
    ...
sparkdist.exceptions.ClusterConfigError: numWorkers=8 exceeds the 2 task slots of this cluster ...
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Literal

from sparkdist.exceptions import ClusterConfigError, ParamError
from sparkdist.session import local_layout

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

_LOG = logging.getLogger(__name__)
#: How long to wait for executors that the configuration promises but have not registered yet
#: (a freshly started local-cluster or standalone application).
REGISTRATION_WAIT_S = 30.0
_POLL_S = 0.5

Severity = Literal["ok", "warning", "error"]
UseGpu = Literal["auto"] | bool
USE_GPU: tuple[UseGpu, ...] = ("auto", True, False)
#: How a user accepts unencrypted training traffic on a secured cluster; quoted in the error.
UNENCRYPTED_OPT_IN = ("allowUnencrypted=True on the estimator (allow_unencrypted=True in "
                      "preflight(), --allow-unencrypted in sparkdist doctor)")

DYNAMIC_ALLOCATION = "spark.dynamicAllocation.enabled"
TASK_GPU = "spark.task.resource.gpu.amount"
EXECUTOR_GPU = "spark.executor.resource.gpu.amount"
GPU_DISCOVERY = "spark.executor.resource.gpu.discoveryScript"
#: Spark security switches, each with what it protects (for the message).
SECURITY_KEYS = {
    "spark.authenticate": "authenticates",
    "spark.network.crypto.enabled": "encrypts (AES)",
    "spark.ssl.enabled": "encrypts (TLS)",
    "spark.ssl.rpc.enabled": "encrypts (TLS)",
}
_CONF_KEYS = ("spark.master", "spark.task.cpus", "spark.executor.instances",
              "spark.executor.cores", "spark.cores.max", DYNAMIC_ALLOCATION, TASK_GPU,
              EXECUTOR_GPU, GPU_DISCOVERY, *SECURITY_KEYS)


@dataclass(frozen=True)
class Finding:
    """One observation about the cluster, as :func:`findings` reports it.

    Attributes
    ----------
    check : what was checked: "task-slots", "dynamic-allocation", "gpu" or "security".
    severity : "ok", "warning" (works, but worth a look) or "error" (training must not start).
    key : the Spark conf key concerned.
    value : its current value (None when unset).
    fix : the setting to change, e.g. "spark.dynamicAllocation.enabled=false"; "" when none.
    message : one readable sentence naming the problem, the key and the fix.
    """

    check: str
    severity: Severity
    key: str
    value: str | None
    fix: str
    message: str

    def as_dict(self) -> dict[str, str | None]:
        return asdict(self)


def preflight(spark: SparkSession, num_workers: int, *, use_gpu: UseGpu = "auto",
              allow_unencrypted: bool = False, param: str = "numWorkers",
              wait_s: float = REGISTRATION_WAIT_S, gpu_checks: bool = True) -> list[Finding]:
    """Check the cluster before a barrier stage; raise the first error, log the warnings.

    On a healthy cluster it is a handful of conf reads and one scheduler call, no job; it only
    waits, up to ``wait_s``, for executors the configuration promises but that have not
    registered yet.

    Parameters
    ----------
    spark : the active SparkSession (classic or Spark Connect).
    num_workers : the number of barrier tasks the caller will launch (1 or more).
    use_gpu : True (GPUs required), False, or "auto" (use them when Spark schedules them).
    allow_unencrypted : accept a secured cluster although sparkdist's traffic is plain TCP.
    param : the name of the parameter that set ``num_workers``, quoted in errors.
    wait_s : the longest wait for promised executors to register.
    gpu_checks : False leaves out the GPU findings (XGBoost: xgboost.spark checks its
        ``device`` against the GPU conf itself).

    Returns
    -------
    list[Finding] : every finding (none of them an error).

    Raises
    ------
    ClusterConfigError : the first error finding; its message names the key and the fix.
    ParamError : ``num_workers`` below 1 or ``use_gpu`` not one of "auto", True, False.

    Examples
    --------
    >>> preflight(spark, 2)[-1].message
    'numWorkers=2 fits the 2 task slot(s).'
    >>> preflight(spark, 2, use_gpu=True)
    Traceback (most recent call last):
        ...
    sparkdist.exceptions.ClusterConfigError: useGpu=True but this Spark application schedules ...
    """
    found = []
    # Lazily, so the first error stops before the slot check's registration wait.
    for finding in _iter_findings(spark, num_workers, use_gpu, allow_unencrypted, param, wait_s,
                                  gpu_checks):
        if finding.severity == "error":
            raise ClusterConfigError(finding.message)
        if finding.severity == "warning":
            _LOG.warning(finding.message)
        found.append(finding)
    return found


def findings(spark: SparkSession, num_workers: int | None = None, use_gpu: UseGpu = "auto", *,
             allow_unencrypted: bool = False, param: str = "numWorkers",
             wait_s: float = REGISTRATION_WAIT_S) -> list[Finding]:
    """Every finding about ``spark``'s cluster, errors included (what ``sparkdist doctor`` shows).

    ``num_workers=None`` reports the task slots without judging them. The other parameters are
    those of :func:`preflight`.

    Examples
    --------
    >>> [f.severity for f in findings(spark, 2)]
    ['ok', 'ok', 'ok', 'ok']
    """
    return list(_iter_findings(spark, num_workers, use_gpu, allow_unencrypted, param, wait_s))


def conf_findings(conf: Mapping[str, str | None], use_gpu: UseGpu = "auto", *,
                  allow_unencrypted: bool = False, gpu_checks: bool = True) -> list[Finding]:
    """The findings that follow from the configuration alone (no scheduler call);
    ``gpu_checks=False`` leaves out the GPU findings.

    Examples
    --------
    >>> conf_findings({"spark.master": "yarn", "spark.dynamicAllocation.enabled": "true"})[0].fix
    'spark.dynamicAllocation.enabled=false'
    """
    if use_gpu not in USE_GPU or not isinstance(use_gpu, (bool, str)):
        raise ParamError(f"useGpu={use_gpu!r}: use 'auto', True or False.")
    gpu = _gpu_findings(conf, use_gpu) if gpu_checks else []
    return [_dynamic_allocation(conf), *gpu, *_security_findings(conf, allow_unencrypted)]


def report(found: Sequence[Finding], master: str | None = None) -> str:
    """The findings as the text ``sparkdist doctor`` prints: one line each, then a summary."""
    lines = [f"sparkdist doctor: {master}"] if master else []
    lines += [f"  {f.severity.upper():<7} {f.check:<18} {f.message}" for f in found]
    errors = sum(f.severity == "error" for f in found)
    warnings = sum(f.severity == "warning" for f in found)
    verdict = "not ready for sparkdist training" if errors else "ready for sparkdist training"
    lines.append(f"{errors} error(s), {warnings} warning(s): {verdict}.")
    return "\n".join(lines)


def _iter_findings(spark: SparkSession, num_workers: int | None, use_gpu: UseGpu,
                   allow_unencrypted: bool, param: str, wait_s: float,
                   gpu_checks: bool = True) -> Iterator[Finding]:
    if num_workers is not None:
        _check_count(num_workers, param)
    conf = _conf(spark)  # read once: on Spark Connect every read is a round trip
    yield from conf_findings(conf, use_gpu, allow_unencrypted=allow_unencrypted,
                             gpu_checks=gpu_checks)
    yield _slots_finding(spark, conf, num_workers, param, wait_s)


def _check_count(num_workers: Any, param: str) -> None:
    # bool is an int to Python, but numWorkers=True is a mistake, not 1.
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ParamError(f"{param}={num_workers!r}: use a whole number, 1 or more.")


# --- the checks -----------------------------------------------------------------------------
def _dynamic_allocation(conf: Mapping[str, str | None]) -> Finding:
    key, value = DYNAMIC_ALLOCATION, conf.get(DYNAMIC_ALLOCATION)
    fix = f"{key}=false"
    if not _is_true(value):
        return Finding("dynamic-allocation", "ok", key, value, "",
                       "dynamic allocation is off, as barrier stages require.")
    if _is_local_master(conf.get("spark.master") or ""):
        # Spark ignores the setting in local[N] (Utils.isDynamicAllocationEnabled), so barrier
        # stages run here; the same conf on a cluster would not.
        return Finding("dynamic-allocation", "warning", key, value, fix,
                       f"{key}=true is ignored by this local master, but on a cluster Spark "
                       f"rejects barrier stages with it; set {fix}.")
    return Finding("dynamic-allocation", "error", key, value, fix,
                   f"{key}=true: Spark rejects barrier stages (sparkdist's training stage) "
                   f"while dynamic allocation is on; set {fix} and a fixed "
                   "spark.executor.instances.")


def _gpu_findings(conf: Mapping[str, str | None], use_gpu: UseGpu) -> list[Finding]:
    task = conf.get(TASK_GPU)
    if not task:
        return [_no_gpus(conf, use_gpu)]
    if use_gpu is False:
        return [Finding("gpu", "warning", TASK_GPU, task, f"unset {TASK_GPU}",
                        f"useGpu=False while each task holds {TASK_GPU}={task} GPU(s), which "
                        f"sit idle; unset {TASK_GPU} or use useGpu='auto'.")]
    found = [_gpu_amount(task)]
    master = conf.get("spark.master") or ""
    # YARN and Kubernetes executors find their GPUs only through this script (a standalone
    # worker hands them its own, so its absence on the driver proves nothing there).
    if (master == "yarn" or master.startswith("k8s://")) and not conf.get(GPU_DISCOVERY):
        found.append(Finding(
            "gpu", "warning", GPU_DISCOVERY, None, f"{GPU_DISCOVERY}=/path/getGpusResources.sh",
            f"{GPU_DISCOVERY} is unset: executors on {master.split(':')[0]} cannot discover "
            f"their GPUs; set it to a script such as Spark's "
            "examples/src/main/scripts/getGpusResources.sh."))
    return found


def _no_gpus(conf: Mapping[str, str | None], use_gpu: UseGpu) -> Finding:
    fix = f"{TASK_GPU}=1"
    if use_gpu is not True:
        return Finding("gpu", "ok", TASK_GPU, None, "",
                       f"no GPUs scheduled ({TASK_GPU} unset): training runs on CPU.")
    return Finding("gpu", "error", TASK_GPU, None, fix,
                   f"useGpu=True but this Spark application schedules no GPUs: set {fix}, "
                   f"{EXECUTOR_GPU}=<GPUs per executor> (now "
                   f"{conf.get(EXECUTOR_GPU) or 'unset'}) and {GPU_DISCOVERY} (or the "
                   "cluster's worker GPU resources), or use useGpu='auto'.")


def _gpu_amount(task: str) -> Finding:
    fix = f"{TASK_GPU}=1"
    amount = float(task)
    if amount < 1:
        # Shared GPUs put two ranks on one device, which NCCL refuses ("Duplicate GPU").
        return Finding("gpu", "error", TASK_GPU, task, fix,
                       f"{TASK_GPU}={task} lets ranks share a GPU, which NCCL refuses; "
                       f"set {fix} (one GPU per barrier task).")
    if amount > 1:
        return Finding("gpu", "warning", TASK_GPU, task, fix,
                       f"{TASK_GPU}={task}: each rank trains on one GPU, the others sit idle; "
                       f"set {fix}.")
    return Finding("gpu", "ok", TASK_GPU, task, "", f"one GPU per task ({TASK_GPU}={task}).")


def _security_findings(conf: Mapping[str, str | None], allow: bool) -> list[Finding]:
    enabled = [key for key in SECURITY_KEYS if _is_true(conf.get(key))]
    if not enabled:
        return [Finding("security", "ok", "spark.authenticate", conf.get("spark.authenticate"),
                        "", "Spark security is off; sparkdist's training traffic is plain "
                        "TCP, as Spark's own is.")]
    return [_unencrypted(key, allow) for key in enabled]


def _unencrypted(key: str, allow: bool) -> Finding:
    what = (f"{key}=true: this cluster {SECURITY_KEYS[key]} Spark's own traffic, but sparkdist's "
            "training traffic between executors (torch.distributed gloo/NCCL, Horovod, "
            "XGBoost's collective) is neither authenticated nor encrypted")
    if allow:
        return Finding("security", "warning", key, "true", "",
                       f"{what}; allowed by the explicit opt-in (allow_unencrypted).")
    return Finding("security", "error", key, "true", UNENCRYPTED_OPT_IN,
                   f"{what}. Training is refused unless you opt in explicitly, on a network "
                   f"you trust: {UNENCRYPTED_OPT_IN}.")


def _slots_finding(spark: SparkSession, conf: Mapping[str, str | None], num_workers: int | None,
                   param: str, wait_s: float) -> Finding:
    local = (conf.get("spark.master") or "").startswith("local")  # local-cluster too
    key = "spark.master" if local else "spark.executor.instances"
    try:
        slots = task_slots(spark)
    except ClusterConfigError as err:
        return Finding("task-slots", "warning", key, conf.get(key), "",
                       f"skipping the {param} check: {err}")
    promised = configured_slots(conf) or 0
    wanted = promised if num_workers is None else num_workers
    if slots < wanted <= promised:  # executors still registering: give them a moment
        slots = _wait_for_slots(spark, wanted, wait_s)
    if num_workers is None:
        return Finding("task-slots", "ok", key, conf.get(key), "",
                       f"{slots} task slot(s): up to {param}={slots} barrier tasks fit.")
    if slots < num_workers:
        return Finding(
            "task-slots", "error", key, conf.get(key),
            f"{param}<={slots}, or more spark.executor.instances / spark.executor.cores",
            f"{param}={num_workers} exceeds the {slots} task slots of this cluster "
            f"(executor cores / spark.task.cpus), so its barrier stage could never start; "
            f"lower {param} or add executors (spark.executor.instances / "
            f"spark.executor.cores).")
    return Finding("task-slots", "ok", key, conf.get(key), "",
                   f"{param}={num_workers} fits the {slots} task slot(s).")


# --- task slots -----------------------------------------------------------------------------
def task_slots(spark: SparkSession) -> int:
    """Number of tasks the cluster can run at once for the default resource profile.

    This is the figure Spark's barrier scheduler checks a stage against: the cores of the
    registered executors divided by ``spark.task.cpus``, and by the GPUs per task where tasks
    take GPUs (tasks already running are not subtracted; a barrier stage waits for them, it
    does not hang). Where the scheduler cannot be asked (Spark Connect), the figure comes from
    the configuration (:func:`configured_slots`).

    Parameters
    ----------
    spark : the active SparkSession.

    Returns
    -------
    int : the number of concurrent task slots (0 while no executor has registered).

    Raises
    ------
    ClusterConfigError : when neither the scheduler nor the configuration tells.

    Examples
    --------
    >>> task_slots(spark)  # local[2]
    2
    """
    slots = _scheduler_slots(spark)
    if slots is None:
        slots = configured_slots(_conf(spark))
    if slots is None:
        raise ClusterConfigError(
            "cannot tell how many task slots this cluster has: the scheduler is not reachable "
            "(Spark Connect?) and spark.executor.instances / spark.executor.cores are unset."
        )
    return slots


def check_num_workers(spark: SparkSession, num_workers: int, param: str = "num_workers",
                      wait_s: float = REGISTRATION_WAIT_S) -> None:
    """Raise :class:`ClusterConfigError` unless ``num_workers`` barrier tasks fit at once.

    The task-slot part of :func:`preflight`. When the configuration promises enough slots but
    executors are still registering, wait up to ``wait_s`` seconds for them; otherwise fail at
    once. When the slot count cannot be determined at all, log a warning and let Spark decide.

    Examples
    --------
    >>> check_num_workers(spark, 2)                          # local[2]: fine
    >>> check_num_workers(spark, 8, param="numWorkers")
    Traceback (most recent call last):
        ...
    sparkdist.exceptions.ClusterConfigError: numWorkers=8 exceeds the 2 task slots of this ...
    """
    _check_count(num_workers, param)
    finding = _slots_finding(spark, _conf(spark), num_workers, param, wait_s)
    if finding.severity == "error":
        raise ClusterConfigError(finding.message)
    if finding.severity == "warning":
        _LOG.warning(finding.message)


def configured_slots(conf: Mapping[str, str | None]) -> int | None:
    """Task slots implied by the configuration alone, or None when it does not say.

    Per executor, the slots are its cores // ``spark.task.cpus`` and, where tasks take GPUs,
    at most its GPUs // ``spark.task.resource.gpu.amount`` (as Spark's scheduler counts them).

    Examples
    --------
    >>> configured_slots({"spark.master": "local-cluster[2,2,1024]"})
    4
    >>> configured_slots({"spark.master": "spark://h:7077", "spark.executor.instances": "3",
    ...                   "spark.executor.cores": "4", "spark.task.cpus": "2"})
    6
    """
    task_cpus = max(1, int(conf.get("spark.task.cpus") or 1))
    master = conf.get("spark.master") or ""
    layout = _executor_layout(conf, master)
    if layout is None:
        cap = conf.get("spark.cores.max")  # standalone: a total, executor sizes unknown
        return int(cap) // task_cpus if cap else None
    executors, cores = layout
    per_executor = cores // task_cpus
    gpus, task_gpus = conf.get(EXECUTOR_GPU), conf.get(TASK_GPU)
    if gpus and task_gpus and float(task_gpus) > 0 and not _is_local_master(master):
        per_executor = min(per_executor, int(float(gpus) / float(task_gpus)))
    return executors * per_executor


def _executor_layout(conf: Mapping[str, str | None], master: str) -> tuple[int, int] | None:
    """(executors, cores each) where the configuration says, else None."""
    if master.startswith("local"):
        return local_layout(master)
    instances, cores = conf.get("spark.executor.instances"), conf.get("spark.executor.cores")
    if instances and cores:
        return int(instances), int(cores)
    cap = conf.get("spark.cores.max")
    if cap and cores:  # standalone hands out executors of `cores` until the cap
        return int(cap) // int(cores), int(cores)
    return None


def _is_local_master(master: str) -> bool:
    """Spark's Utils.isLocalMaster: "local" or "local[...]" (not local-cluster)."""
    return master == "local" or master.startswith("local[")


def _is_true(value: str | None) -> bool:
    return (value or "").strip().lower() == "true"


def live_slots(spark: SparkSession) -> int | None:
    """The task slots of the executors registered right now, as the barrier scheduler counts
    them (no wait, no fallback to the configuration); None where the scheduler cannot be
    asked (Spark Connect). What an elastic fit re-plans on."""
    return _scheduler_slots(spark)


def _scheduler_slots(spark: SparkSession) -> int | None:
    """Ask the scheduler (classic Spark only), as its barrier check does; None elsewhere."""
    try:
        from sparkdist._internals import java_spark_context

        jsc: Any = java_spark_context(spark.sparkContext)
        profile = jsc.resourceProfileManager().defaultResourceProfile()
        return int(jsc.maxNumConcurrentTasks(profile))
    except Exception:  # Spark Connect has no SparkContext; old JVMs lack the method
        return None


def _conf(spark: SparkSession) -> dict[str, str | None]:
    conf: dict[str, str | None] = {}
    for key in _CONF_KEYS:
        try:
            conf[key] = spark.conf.get(key, None)
        except Exception:  # a static key Connect refuses to show
            conf[key] = None
    return conf


def _wait_for_slots(spark: SparkSession, wanted: int, wait_s: float) -> int:
    deadline = time.monotonic() + wait_s
    slots = task_slots(spark)
    while slots < wanted and time.monotonic() < deadline:
        time.sleep(_POLL_S)
        slots = task_slots(spark)
    return slots
