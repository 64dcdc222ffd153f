"""The ``sparkdist`` command: ``train CONFIG``, ``evaluate MODEL DATA``, ``predict MODEL DATA OUT``,
``doctor`` (is this cluster ready for distributed training?).

Errors sparkdist raises on purpose (bad config, bad column, existing path) print one line and
exit with status 2; anything else is a bug and keeps its traceback. ``doctor`` exits 1 when it
finds an error in the cluster's configuration.
"""

from __future__ import annotations

import argparse
import fnmatch
import glob
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from sparkdist.exceptions import ParamError, SchemaError, SparkdistError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sparkdist", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    train = sub.add_parser("train", help="run a workflow config: split, fit, evaluate, track")
    train.add_argument("config", help="YAML or JSON workflow config")
    train.add_argument("--no-tracking", action="store_true", help="skip MLflow")
    for name, text in (("evaluate", "metrics of a saved model on a dataset"),
                       ("predict", "write a saved model's predictions")):
        cmd = sub.add_parser(name, help=text)
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
    from sparkdist.config import load_config
    from sparkdist.workflows import run

    config = load_config(args.config)
    if args.no_tracking:
        config.tracking.enabled = False
    result = run(config)
    print(result.table())
    print(json.dumps({"split": result.split, "run_id": result.run_id,
                      "metrics": {r.name: r.metrics for r in result.models}}))
    return 0


def _evaluate(args: argparse.Namespace) -> int:
    from sparkdist.evaluation import evaluate
    from sparkdist.persist import load_model
    from sparkdist.session import get_spark
    from sparkdist.workflows import read_data

    spark = get_spark(app_name="sparkdist-evaluate")
    model = load_model(args.model, spark)
    data = read_data(lambda: spark.read.format(args.format).load(args.data), "data")
    print(json.dumps(evaluate(model, data, k=args.k)))
    return 0


def _predict(args: argparse.Namespace) -> int:
    from pyspark.ml.functions import vector_to_array
    from pyspark.ml.linalg import VectorUDT

    from sparkdist import store
    from sparkdist.persist import load_model
    from sparkdist.session import get_spark
    from sparkdist.workflows import read_data

    store.check_target(args.output, "output")  # never "", "/", the working directory
    if _overlaps(args.data, args.output):  # Spark empties the output before it reads
        raise ParamError(f"output '{args.output}' is, contains or lies inside the input "
                         f"'{args.data}'; writing it would destroy the input. Choose another "
                         "output path.")
    if store.exists(args.output) and not args.overwrite:
        raise store.PathExistsError(f"'{args.output}' already exists; pass --overwrite to "
                                    "replace it.")
    spark = get_spark(app_name="sparkdist-predict")
    model = load_model(args.model, spark)
    data = read_data(lambda: spark.read.format(args.format).load(args.data), "data")
    _require_every_row_predicted(model, data)
    out = model.transform(data)
    # Vectors become arrays so any Parquet reader can use the output.
    out = out.select(*[vector_to_array(f.name).alias(f.name) if isinstance(f.dataType, VectorUDT)
                       else f.name for f in out.schema.fields])
    out.write.mode("overwrite" if args.overwrite else "errorifexists").parquet(args.output)
    print(args.output)
    return 0


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


def _overlaps(data: str, output: str) -> bool:
    """Whether ``output`` is, contains or lies inside the input ``data`` (a path or a glob)."""
    from sparkdist import store

    try:
        source, target = store.locate(data, "data"), store.locate(output, "output")
    except ParamError:  # an input scheme sparkdist does not write: not the output's store
        return False
    if type(source.fs) is not type(target.fs):
        return False
    clean = os.path.realpath if source.local else (lambda p: p.rstrip("/"))
    pattern, out = clean(source.path), clean(target.path)
    parts = pattern.split("/")
    static = "/".join(parts[:next((i for i, p in enumerate(parts) if glob.has_magic(p)),
                                  len(parts))])
    ancestors = [out] + [out[:i] for i in range(len(out)) if out[i] == "/" and i > 0]
    return static == out or static.startswith(out + "/") or any(
        fnmatch.fnmatchcase(a, pattern) for a in ancestors)


def _doctor(args: argparse.Namespace) -> int:
    from sparkdist.launch.preflight import findings, report
    from sparkdist.session import get_spark

    spark = get_spark(master=args.master, app_name="sparkdist-doctor")
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


if __name__ == "__main__":
    sys.exit(main())
