"""What a barrier task finds on its executor: the executor's id (for the fit's placement) and
a scratch directory of the task's own, cleaned of what killed tasks left there."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile


def executor_id() -> str:
    """This task's Spark executor: ``$SPARK_EXECUTOR_ID`` (set on Kubernetes), else the
    ``--executor-id`` argument of the executor JVM that started this Python worker (its parent
    or the daemon's parent: standalone, YARN, Kubernetes), else "driver" when that JVM has none
    (local mode runs tasks in the driver), else "unknown" (no /proc: not Linux). Spark passes
    the id to neither the Python worker's environment nor its TaskContext."""
    if os.environ.get("SPARK_EXECUTOR_ID"):
        return os.environ["SPARK_EXECUTOR_ID"]
    pid = os.getpid()
    with contextlib.suppress(OSError, IndexError, ValueError):
        for _ in range(3):  # worker -> daemon -> JVM
            with open(f"/proc/{pid}/stat") as stat:
                pid = int(stat.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{pid}/cmdline", "rb") as cmdline:
                args = cmdline.read().split(b"\0")
            if b"--executor-id" in args:
                return args[args.index(b"--executor-id") + 1].decode()
            if args[0].endswith(b"java"):
                return "driver"
    return "unknown"


_SCRATCH = re.compile(r"sparkdist-rank\d+-pid(\d+)-")


def make_scratch(rank: int) -> str:
    """A private directory for a rank's copy of its partition, in Spark's own local
    directory of this executor (``SPARK_LOCAL_DIRS``, which Spark deletes when the
    application ends). A task that Spark kills never runs its cleanup, so first remove what
    earlier ranks whose process is gone left here: no copy of training data outlives its
    task for longer than the next fit on the same executor."""
    root = os.environ.get("SPARK_LOCAL_DIRS", tempfile.gettempdir()).split(",")[0]
    for name in os.listdir(root):
        found = _SCRATCH.match(name)
        if found and not _alive(int(found.group(1))):
            shutil.rmtree(os.path.join(root, name), ignore_errors=True)
    return tempfile.mkdtemp(prefix=f"sparkdist-rank{rank}-pid{os.getpid()}-", dir=root)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive, and not ours to clean
        return True
    return True
