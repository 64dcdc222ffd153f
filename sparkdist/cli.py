"""The ``sparkdist`` command: ``train CONFIG``, ``evaluate MODEL DATA``, ``predict MODEL DATA OUT``,
``doctor`` (is this cluster ready for distributed training?).

Errors sparkdist raises on purpose (bad config, bad column, existing path) print one line and
exit with status 2; anything else is a bug and keeps its traceback. ``doctor`` exits 1 when it
finds an error in the cluster's configuration.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import urllib.parse
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

from sparkdist.exceptions import (
    ClusterConfigError,
    ModelLoadError,
    ParamError,
    SchemaError,
    SparkdistError,
)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkdist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a workflow config: split, fit, evaluate, track")
    train.add_argument("config", help="YAML or JSON workflow config")
    train.add_argument("--no-tracking", action="store_true", help="skip MLflow")
    _import_option(train)
    for name, text in (("evaluate", "metrics of a saved model on a dataset"),
                       ("predict", "write a saved model's predictions")):
        cmd = sub.add_parser(name, help=text)
        _import_option(cmd)
        cmd.add_argument("model", help="directory of a saved model (e.g. output.modelDir/NAME)")
        cmd.add_argument("data", help="input data path")
        cmd.add_argument("--format", default="parquet", help="input format (default parquet)")
        if name == "evaluate":
            cmd.add_argument("--k", type=int, default=10, help="k of ranking metrics")
        else:
            cmd.add_argument("output", help="output Parquet path")
            cmd.add_argument("--overwrite", action="store_true", help="replace the output")
    _doctor_parser(sub)
    return parser


def _import_option(cmd: argparse.ArgumentParser) -> None:
    cmd.add_argument("--import", dest="imports", action="append", default=[], metavar="MODULE",
                     help="import MODULE first (repeatable), so that Params may name its "
                     "classes, e.g. a TorchEstimator model 'mypkg.nets.Net'")


def _doctor_parser(sub: argparse._SubParsersAction) -> None:
    doctor = sub.add_parser(
        "doctor", help="check the cluster for distributed training: task slots, dynamic "
        "allocation, GPUs, security; exit 1 on an error")
    doctor.add_argument("--num-workers", type=_positive_int, metavar="N",
                        help="barrier tasks you plan to run (numWorkers); default: just report "
                        "the task slots")
    doctor.add_argument("--gpu", action="store_true", help="GPUs are required (useGpu=True)")
    doctor.add_argument("--allow-unencrypted", action="store_true",
                        help="accept unencrypted training traffic on a secured cluster")
    doctor.add_argument("--master", help="Spark master (default: the active session, else "
                        "$SPARKDIST_MASTER, else local[*])")
    doctor.add_argument("--json", action="store_true", help="print the findings as JSON")


def _positive_int(text: str) -> int:
    # argparse turns this into "argument --num-workers: ..." and exit status 2.
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: use 1 or more (the number of barrier tasks)")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return {"train": _train, "evaluate": _evaluate, "predict": _predict,
                "doctor": _doctor}[args.command](args)
    except SparkdistError as err:
        print(f"sparkdist {args.command}: {err}", file=sys.stderr)
        return 2


def _train(args: argparse.Namespace) -> int:
    from sparkdist.config import import_modules, load_config
    from sparkdist.workflows import run

    config = load_config(args.config)
    import_modules(args.imports, "--import")  # then run() imports the config's own imports
    if args.no_tracking:
        config.tracking.enabled = False
    result = run(config)
    print(result.table())
    print(json.dumps({"split": result.split, "run_id": result.run_id,
                      "metrics": {r.name: r.metrics for r in result.models}}))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from sparkdist.evaluation import evaluate
    from sparkdist.workflows import read_data

    spark = _session(args, "sparkdist-evaluate")
    model = _load_model(args.model, spark)
    data = read_data(lambda: spark.read.format(args.format).load(args.data), "data")
    print(json.dumps(evaluate(model, data, k=args.k)))
    return 0


def _predict(args: argparse.Namespace) -> int:
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    from sparkdist import store
    from sparkdist.workflows import read_data

    store.check_target(args.output, "output")  # never "", "/", the working directory
    if store.exists(args.output) and not args.overwrite:
        raise store.PathExistsError(f"'{args.output}' already exists; pass --overwrite to "
                                    "replace it.")
    spark = _session(args, "sparkdist-predict")
    output = _Output(spark, args.output)
    output.refuse_pattern(args.data)  # before the model is loaded
    model = _load_model(args.model, spark)
    data = read_data(lambda: spark.read.format(args.format).load(args.data), "data")
    output.refuse_overlap(args.data, data.inputFiles())
    _require_every_row_predicted(model, data)
    out = model.transform(data)
    # Vectors become arrays so any Parquet reader can use the output.
    out = out.select(*[vector_to_array(f.name).alias(f.name) if isinstance(f.dataType, VectorUDT)
                       else f.name for f in out.schema.fields])
    output.write(out, args.overwrite)
    print(args.output)
    return 0


def _session(args: argparse.Namespace, app_name: str) -> Any:
    """The SparkSession, after the modules of ``--import`` (a saved model may name their
    classes; nothing read from a model is imported)."""
    from sparkdist.config import import_modules
    from sparkdist.session import get_spark

    import_modules(args.imports, "--import")
    return get_spark(app_name=app_name)


def _load_model(path: str, spark: Any) -> Any:
    from sparkdist.persist import load_model

    try:
        return load_model(path, spark)
    except OSError as err:  # a file, or a path under one, where a model directory should be
        raise ModelLoadError(f"model: cannot read '{path}' ({err.strerror or err}); point at "
                             "the directory that save wrote.") from None


def _require_every_row_predicted(model: Any, data: Any) -> None:
    """``predict`` writes one row per input row: refuse input that the model's assembler
    (``nullPolicy="drop"``) would leave out, before anything is written."""
    from sparkdist.features import FeatureAssemblerModel

    first = model.stages[0] if hasattr(model, "stages") and model.stages else model
    if isinstance(first, FeatureAssemblerModel) and (dropped := first.rows_dropped(data)):
        raise SchemaError(f"{dropped} input rows have a missing value in the model's feature "
                          f"columns, and its FeatureAssembler (nullPolicy='drop') would leave "
                          f"them out of the predictions; fill them, or refit the model with "
                          f"nullPolicy='impute'.")


class _Output:
    """``predict``'s output as Spark sees it: paths resolved and moved by Hadoop's FileSystem
    through the JVM, or (Spark Connect: no JVM here) by sparkdist's store."""

    def __init__(self, spark: Any, url: str) -> None:
        from sparkdist import _internals
        from sparkdist.session import is_connect

        self.url, self.spark = url, spark
        self.jvm = None if is_connect(spark) else _internals.jvm(spark)
        if self.jvm is None:
            self.path = url
            return
        from py4j.protocol import Py4JJavaError

        from sparkdist.workflows import reason

        try:
            path = self.jvm.org.apache.hadoop.fs.Path(url)
            self.fs = path.getFileSystem(_internals.hadoop_conf(spark))
            self.qualified = self.fs.makeQualified(path)
        except Py4JJavaError as err:  # "Relative path in absolute URI", no such filesystem
            raise ParamError(f"output '{url}': Spark cannot write there ({reason(err)}); "
                             "choose another output path.") from None
        self.path = str(self.qualified.toString())  # as Spark would write it

    def refuse_pattern(self, pattern: str) -> None:
        """Refuse an output that is, contains or lies inside a path Spark's reader expands the
        input ``pattern`` to (Hadoop's globStatus, which knows every form: {a,b} * ? [ab] [^a]
        and escapes), or that the pattern would match (Hadoop's GlobPattern), so that the
        predictions never become part of the input. Spark Connect (no JVM here): the read
        DataFrame's files only (:meth:`refuse_overlap`)."""
        from py4j.protocol import Py4JJavaError

        if self.jvm is None:
            return
        try:
            path = self.jvm.org.apache.hadoop.fs.Path(pattern)
            fs = path.getFileSystem(self.fs.getConf())
            found = fs.globStatus(path)
            glob = self.jvm.org.apache.hadoop.fs.GlobPattern(fs.makeQualified(path).toString())
        except Py4JJavaError:  # not a path Spark can read either: reading it says why
            return
        self.refuse_overlap(pattern, [str(s.getPath().toUri().toString()) for s in found or []])
        here = self.qualified
        while here is not None:
            if glob.matches(here.toString()):
                raise self._overlap(pattern, f"which matches {here.toString()}")
            here = here.getParent()

    def refuse_overlap(self, pattern: str, inputs: Sequence[str]) -> None:
        """Refuse an output that is, contains or lies inside any of ``inputs``, URIs Spark
        reads for ``pattern`` (the paths it expands to, the read DataFrame's inputFiles())."""
        target = self._key()
        for uri in inputs:
            scheme, path = _key(uri)
            if scheme == target[0] and (path == target[1] or _under(path, target[1])
                                        or _under(target[1], path)):
                raise self._overlap(pattern, f"which resolves to {uri}")

    def _overlap(self, pattern: str, detail: str) -> ParamError:
        return ParamError(f"output '{self.url}' is, contains or lies inside the input "
                          f"'{pattern}' ({detail}); writing it would destroy the input. "
                          "Choose another output path.")

    def write(self, out: Any, overwrite: bool) -> None:
        """Write ``out`` as Parquet into a hidden sibling, then move it into place, removing
        an old output only then: a failed write leaves nothing, and the old output as it was."""
        from py4j.protocol import Py4JJavaError
        from pyspark.errors import PySparkException

        from sparkdist.workflows import reason

        staged = self._sibling("tmp")
        try:
            with self._quiet_jvm():
                out.write.parquet(staged)
        except BaseException as err:
            self._remove(staged)
            if isinstance(err, (PySparkException, Py4JJavaError)):
                raise SchemaError(f"writing the predictions to '{self.url}' failed, and nothing "
                                  f"was written: {reason(err)}. Fix the input data (or the "
                                  "output location) and run again.") from None
            raise
        self._replace(staged, overwrite)

    @contextlib.contextmanager
    def _quiet_jvm(self) -> Iterator[None]:
        """The JVM's log off while writing: a failed task would print its stack trace on the
        console, where the CLI prints one line (its reason) instead."""
        if self.jvm is None:
            yield
            return
        root = self.jvm.org.apache.logging.log4j.LogManager.getRootLogger()
        level = str(root.getLevel().toString())
        self.spark.sparkContext.setLogLevel("OFF")
        try:
            yield
        finally:
            self.spark.sparkContext.setLogLevel(level)

    def _replace(self, staged: str, overwrite: bool) -> None:
        from sparkdist import store

        if not self._exists(self.path):
            self._rename(staged, self.path)
            return
        if not overwrite:  # another writer created it while this one wrote
            self._remove(staged)
            raise store.PathExistsError(f"'{self.url}' already exists; pass --overwrite to "
                                        "replace it.")
        old = self._sibling("old")
        self._rename(self.path, old)
        try:
            self._rename(staged, self.path)
        except BaseException:
            self._rename(old, self.path)
            self._remove(staged)
            raise
        self._remove(old)

    def _sibling(self, kind: str) -> str:
        head, sep, name = self.path.rstrip("/").rpartition("/")
        return f"{head}{sep}.{name}.{kind}-{uuid.uuid4().hex[:8]}"

    def _key(self) -> tuple[str, str]:
        from sparkdist import store

        if self.jvm is not None:
            return _key(str(self.qualified.toUri().toString()))
        where = store.locate(self.url, "output")
        return ("file", os.path.realpath(where.path)) if where.local else _key(self.url)

    def _exists(self, url: str) -> bool:
        from sparkdist import store

        if self.jvm is None:
            return store.exists(url)
        return bool(self.fs.exists(self.jvm.org.apache.hadoop.fs.Path(url)))

    def _rename(self, source: str, target: str) -> None:
        from sparkdist import store

        if self.jvm is None:
            where = store.locate(source, "output")
            where.fs.mv(where.path, store.locate(target, "output").path, recursive=True)
        elif not self.fs.rename(*(self.jvm.org.apache.hadoop.fs.Path(p)
                                  for p in (source, target))):
            raise ParamError(f"output '{self.url}': could not move '{source}' to '{target}'; "
                             "check the permissions of the output's directory.")

    def _remove(self, url: str) -> None:
        from sparkdist import store

        if self.jvm is None:
            store.remove(url)
        else:
            self.fs.delete(self.jvm.org.apache.hadoop.fs.Path(url), True)


def _key(uri: str) -> tuple[str, str]:
    """A URI as (filesystem, path) to compare paths with: local paths with symlinks resolved,
    s3/s3a/s3n (and other aliases) as one filesystem."""
    from sparkdist import store

    parts = urllib.parse.urlsplit(uri)
    scheme = parts.scheme.lower() or "file"
    path = urllib.parse.unquote(parts.path)
    if scheme == "file":
        return "file", os.path.realpath(path)
    return store.SCHEMES.get(scheme, (scheme, ""))[0], f"{parts.netloc}/{path.strip('/')}"


def _under(path: str, parent: str) -> bool:
    return path.startswith(parent.rstrip("/") + "/")


def _doctor(args: argparse.Namespace) -> int:
    from sparkdist.launch.preflight import findings, report

    spark = _doctor_session(args.master)
    found = findings(spark, args.num_workers, use_gpu=True if args.gpu else "auto",
                     allow_unencrypted=args.allow_unencrypted)
    master = spark.conf.get("spark.master", None)
    failed = any(f.severity == "error" for f in found)
    if args.json:
        print(json.dumps({"master": master, "ok": not failed,
                          "findings": [f.as_dict() for f in found]}))
    else:
        print(report(found, master))
    return 1 if failed else 0


#: Master URLs Spark itself accepts (SparkContext.createTaskScheduler, and the cluster
#: managers it ships: YARN, Kubernetes).
_MASTER = re.compile(r"local(\[(\*|\d+)(\s*,\s*\d+)?\])?"
                     r"|local-cluster\[\s*\d+\s*,\s*\d+\s*,\s*\d+\s*\]|spark://.+|yarn|k8s://.+")


def _doctor_session(master: str | None) -> Any:
    """The session ``doctor`` checks; a master URL Spark would refuse, or a session that
    cannot start, is a ClusterConfigError (the JVM's own error text)."""
    from py4j.protocol import Py4JError
    from pyspark.errors import PySparkException

    from sparkdist.session import get_spark
    from sparkdist.workflows import reason

    if master is not None and not _MASTER.fullmatch(master):
        raise ClusterConfigError(f"--master {master!r} is not a Spark master URL; use local[N], "
                                 "local-cluster[N,CORES,MB], spark://HOST:PORT, yarn or "
                                 "k8s://URL.")
    try:
        return get_spark(master=master, app_name="sparkdist-doctor")
    except (Py4JError, PySparkException) as err:
        raise ClusterConfigError(f"--master {master or '(default)'}: Spark did not start: "
                                 f"{reason(err)}") from None


if __name__ == "__main__":
    sys.exit(main())
