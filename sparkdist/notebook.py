"""Helpers for notebooks: parameters, the session, showing results, and a cell-by-cell runner.

The notebooks in ``notebooks/`` (Databricks source format) run unchanged on Databricks, in
Jupyter, as plain Python files (``python notebooks/01_churn_classification.py``) and in the
tests. Importing this module loads neither Spark nor matplotlib.

- :func:`param` reads a notebook parameter: a ``dbutils`` text widget on Databricks, else the
  ``SPARKDIST_NB_<NAME>`` environment variable, else the default, converted to the default's
  type (a wrong value raises :class:`~sparkdist.exceptions.ParamError` naming the widget).
- :func:`spark_session` returns the notebook's ``spark`` (the active session, or a local one)
  and turns "no Java / no pyspark" into a :class:`~sparkdist.exceptions.ClusterConfigError`
  that says what to install or set.
- :func:`show` uses the notebook's ``display`` where there is one, ``print``/``.show()``
  elsewhere; :func:`find_path` finds a repository-relative file (``data/...``) from any
  working directory.
- :func:`run_notebook` executes a notebook file cell by cell in one namespace; a failing cell
  raises :class:`NotebookError` with its number, its first line and the original error.

Examples
--------
>>> from sparkdist.notebook import param, spark_session, show, find_path
>>> spark = spark_session()
>>> rows = param("rows", 3)                       # widget "rows", or $SPARKDIST_NB_ROWS
>>> df = spark.read.parquet(find_path(param("data_path", "data/churn_sample.parquet")))
>>> show(df.select("customer_id", "plan").limit(rows))
+-----------+--------+
|customer_id|plan    |
+-----------+--------+
|C0000000   |standard|
|C0000001   |basic   |
|C0000002   |basic   |
+-----------+--------+
<BLANKLINE>
"""

from __future__ import annotations

import builtins
import contextlib
import os
import re
import shutil
import sys
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sparkdist.exceptions import ClusterConfigError, NotebookError, ParamError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

ENV_PREFIX = "SPARKDIST_NB_"
#: Where :func:`show` saves figures as PNG when there is no ``display`` (unset: not saved).
ENV_FIGURE_DIR = "SPARKDIST_NB_FIGURE_DIR"
HEADER = "# Databricks notebook source"
SEPARATOR = "# COMMAND ----------"
MAGIC = "# MAGIC"
_TRUE, _FALSE = ("true", "1", "yes", "y", "on"), ("false", "0", "no", "n", "off")
_TYPE_WORDS = {bool: "a boolean (true/false)", int: "an integer", float: "a number",
               str: "a string"}
_REPO = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------ parameters
def param(name: str, default: Any, type: type | None = None, *, label: str | None = None) -> Any:
    """A notebook parameter, converted to ``type`` (default: the type of ``default``).

    On Databricks a text widget ``name`` is created (pre-filled with ``default``) and read;
    elsewhere ``$SPARKDIST_NB_<NAME>`` (upper case, e.g. ``SPARKDIST_NB_ROWS``) or the
    default is used (:func:`run_notebook` passes its ``params`` that way).

    Parameters
    ----------
    name : the widget name (letters, digits, ``_``).
    default : the value when nothing is set; its type is the expected type.
    type : ``bool``, ``int``, ``float`` or ``str``; needed only when ``default`` is None.
    label : the widget's label on Databricks (default: ``name``).

    Raises
    ------
    ParamError
        When the value does not convert, naming the widget, the value and the expected type.

    Examples
    --------
    >>> epochs = param("epochs", 4)                # SPARKDIST_NB_EPOCHS=8 -> 8
    >>> track = param("track", True)               # "false", "0", "no" -> False
    """
    expected = type or (builtins.type(default) if default is not None else str)
    if expected not in _TYPE_WORDS:
        raise ParamError(f"param {name!r}: type {expected.__name__} is not supported; use "
                         "bool, int, float or str.")
    value, source = _raw_value(name, default, label)
    return _convert(value, expected, name, source)


def _raw_value(name: str, default: Any, label: str | None) -> tuple[Any, str]:
    """The value before conversion, and where it came from (for error messages)."""
    dbutils = _dbutils()
    if dbutils is not None:
        text = "" if default is None else _as_text(default)
        with contextlib.suppress(Exception):  # already created by an earlier run of the cell
            dbutils.widgets.text(name, text, label or name)
        return dbutils.widgets.get(name), "Databricks widget"
    env = ENV_PREFIX + re.sub(r"\W", "_", name).upper()
    if env in os.environ:
        return os.environ[env], f"environment variable {env}"
    return default, "default"


def _convert(value: Any, expected: type, name: str, source: str) -> Any:
    if value is None or (isinstance(value, expected) and not (
            isinstance(value, bool) and expected is not bool)):
        return value
    text = str(value).strip()
    try:
        if expected is bool:
            if text.lower() not in _TRUE + _FALSE:
                raise ValueError(text)
            return text.lower() in _TRUE
        return expected(text)
    except ValueError:
        raise ParamError(f"widget {name!r} ({source}) = {text!r} is not "
                         f"{_TYPE_WORDS[expected]}; set it to {_TYPE_WORDS[expected]}."
                         ) from None


def _as_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def _dbutils() -> Any:
    """Databricks' ``dbutils``: from the notebook's globals, or the runtime."""
    found = _notebook_global("dbutils")
    if found is None and os.environ.get("DATABRICKS_RUNTIME_VERSION"):
        with contextlib.suppress(ImportError):
            from databricks.sdk.runtime import dbutils as found  # type: ignore[no-redef]
    return found


def _notebook_global(name: str) -> Any:
    """A name the notebook environment defines (``__main__``, builtins, IPython's user_ns)."""
    found = getattr(sys.modules.get("__main__"), name, None) or getattr(builtins, name, None)
    ipython = sys.modules.get("IPython")
    if found is None and ipython is not None:
        shell = ipython.get_ipython()
        found = shell.user_ns.get(name) if shell is not None else None
    return found


# --------------------------------------------------------------------------------- session
def spark_session(master: str | None = None, app_name: str = "sparkdist-notebook") -> SparkSession:
    """The notebook's ``spark``: the active session (Databricks, a runner), or a local one.

    Raises
    ------
    ClusterConfigError
        When no session can start because pyspark or Java is missing; the message says
        what to install or set (see :func:`spark_unavailable_message`).

    Examples
    --------
    >>> spark = spark_session()          # on Databricks: the notebook's own session
    """
    try:
        from sparkdist.session import get_spark

        return get_spark(master=master, app_name=app_name)
    except Exception as err:
        if not _is_startup_failure(err):
            raise
        raise ClusterConfigError(spark_unavailable_message(err)) from err


def _is_startup_failure(err: BaseException) -> bool:
    if isinstance(err, ImportError):
        return True
    condition = getattr(err, "getCondition", None)
    return (callable(condition) and condition() == "JAVA_GATEWAY_EXITED") or (
        "Java gateway" in str(err))


def spark_unavailable_message(cause: BaseException | str) -> str:
    """Why no SparkSession could start, and the fix (pyspark, Java, ``JAVA_HOME``).

    Examples
    --------
    >>> print(spark_unavailable_message(ImportError("No module named 'pyspark'")))
    Spark is not available in this Python process (No module named 'pyspark'): ...
    """
    reason = str(cause) or type(cause).__name__
    if isinstance(cause, ImportError):
        fix = ('pyspark is not installed in this Python: pip install "sparkdist" (it brings '
               "pyspark), or attach the notebook to a Databricks cluster.")
    else:
        fix = _java_fix()
    return (f"Spark is not available in this Python process ({reason}): {fix} Then rerun the "
            "cell that calls spark_session().")


def _java_fix() -> str:
    java_home = os.environ.get("JAVA_HOME")
    if java_home and not (Path(java_home) / "bin" / "java").exists():
        return (f"JAVA_HOME={java_home} has no bin/java; point JAVA_HOME at a Java 17+ "
                "installation (or unset it to use java from PATH).")
    on_path = shutil.which("java")
    if not java_home and on_path is None:
        return ("Spark 4 needs Java 17 or newer and there is no java on PATH and no "
                "JAVA_HOME; install it (Debian/Ubuntu: apt-get install "
                "openjdk-17-jre-headless; macOS: brew install openjdk@17) and set JAVA_HOME.")
    return (f"the Java gateway did not start (java: {java_home or on_path}); check that it is "
            "Java 17 or newer (java -version) and that SPARK_LOCAL_IP=127.0.0.1 is set "
            "when the hostname does not resolve.")


# --------------------------------------------------------------------------- show and paths
def show(obj: Any, n: int = 20) -> None:
    """Show a DataFrame, figure or table: ``display`` on Databricks, text elsewhere.

    A Spark DataFrame is printed with ``.show(n)``, a pandas one with ``to_string``, a
    matplotlib figure as its title (saved as PNG when ``$SPARKDIST_NB_FIGURE_DIR`` is set).

    Examples
    --------
    >>> show(spark.range(3))
    +---+
    |id |
    +---+
    |0  |
    |1  |
    |2  |
    +---+
    <BLANKLINE>
    """
    display = _notebook_global("display")
    spark_frame = hasattr(obj, "schema") and hasattr(obj, "show")
    if callable(display) and (not spark_frame or os.environ.get("DATABRICKS_RUNTIME_VERSION")):
        display(obj)
    elif spark_frame:
        obj.show(n, truncate=False)
    elif hasattr(obj, "savefig"):
        print(_figure_text(obj))
    elif hasattr(obj, "to_string"):
        print(obj.to_string(max_rows=n))
    else:
        print(obj)


def _figure_text(fig: Any) -> str:
    titles = [ax.get_title() for ax in fig.get_axes() if ax.get_title()]
    title = " / ".join(titles) or "figure"
    folder = os.environ.get(ENV_FIGURE_DIR)
    if not folder:
        return f"[figure: {title}; set {ENV_FIGURE_DIR} to save figures as PNG]"
    Path(folder).mkdir(parents=True, exist_ok=True)
    path = Path(folder) / (re.sub(r"\W+", "_", title).strip("_").lower() + ".png")
    fig.savefig(path)
    return f"[figure: {title}, saved to {path}]"


def find_path(path: str) -> str:
    """``path`` as given when it is absolute or a URI, else the first existing match under
    the working directory, its parents, or the repository sparkdist was installed from.

    Raises
    ------
    ParamError
        When no such file exists, naming the places searched.

    Examples
    --------
    >>> find_path("data/churn_sample.parquet")   # from the repo root, notebooks/ or tests/
    '/.../data/churn_sample.parquet'
    """
    if re.match(r"^[a-zA-Z][\w+.-]*:", path) or Path(path).is_absolute():
        return path
    cwd = Path.cwd()
    for base in (cwd, *cwd.parents, _REPO):
        if (base / path).exists():
            return str(base / path)
    raise ParamError(f"{path!r} exists neither under the working directory {cwd} (or its "
                     f"parents) nor under {_REPO}; give an absolute path or a URI.")


# ---------------------------------------------------------------------------------- runner
@dataclass(frozen=True)
class Cell:
    """One notebook cell: its 1-based number, its source and the file line it starts on."""

    number: int
    source: str
    line: int  # of the cell's first line in the file

    @property
    def first_line(self) -> str:
        return next((s.strip() for s in self.source.splitlines() if s.strip()), "")

    @property
    def is_markdown(self) -> bool:
        lines = [s for s in self.source.splitlines() if s.strip()]
        return all(s.startswith(MAGIC) for s in lines)


def read_cells(path: str | Path) -> list[Cell]:
    """The cells of a Databricks source-format notebook (``# COMMAND ----------`` between
    cells), numbered from 1 as Databricks shows them.

    Examples
    --------
    >>> [c.first_line for c in read_cells("notebooks/01_churn_classification.py")][:1]
    ['# MAGIC %md']
    """
    lines = Path(path).read_text().splitlines(keepends=True)
    if not lines or lines[0].strip() != HEADER:
        raise NotebookError(f"{path}: the first line must be {HEADER!r} (a Databricks "
                            "source-format notebook).")
    cells: list[Cell] = []
    chunk: list[str] = []
    start = 2
    for number, text in enumerate(lines[1:], start=2):
        if text.strip() == SEPARATOR:
            cells.append(Cell(len(cells) + 1, "".join(chunk), start))
            start, chunk = number + 1, []
        else:
            chunk.append(text)
    cells.append(Cell(len(cells) + 1, "".join(chunk), start))
    return [_trimmed(c) for c in cells if c.source.strip()]


def _trimmed(cell: Cell) -> Cell:
    """The cell without its leading blank lines (so ``line`` is that of its first line)."""
    lines = cell.source.splitlines(keepends=True)
    blank = next(i for i, s in enumerate(lines) if s.strip())
    return Cell(cell.number, "".join(lines[blank:]), cell.line + blank)


def run_notebook(path: str | Path, *, spark: SparkSession | None = None,
                 params: Mapping[str, Any] | None = None,
                 namespace: dict[str, Any] | None = None,
                 on_cell: Callable[[Cell], None] | None = None) -> dict[str, Any]:
    """Execute a notebook cell by cell in one namespace (this process) and return it.

    Parameters
    ----------
    path : a Databricks source-format notebook (``.py``).
    spark : injected as the notebook's ``spark`` (and active, so :func:`spark_session`
        returns it).
    params : values for :func:`param`, by widget name, passed as the ``SPARKDIST_NB_<NAME>``
        environment variables for the run (restored afterwards).
    namespace : the globals to run in (default: a fresh dict); ``dbutils``/``display`` in it
        are used by :func:`param` and :func:`show`. The notebook runs as the ``__main__``
        module, as a notebook or script does, so the helpers find them where they look
        everywhere else.
    on_cell : called before each code cell (e.g. to log progress or time cells).

    Raises
    ------
    NotebookError
        From the first failing cell: notebook, cell number, its first line and the error
        (the original exception is chained as ``__cause__``).

    Examples
    --------
    >>> notebook = Path(tmp, "count.py")
    >>> _ = notebook.write_text("# Databricks notebook source\\n"
    ...                         "from sparkdist.notebook import param\\n"
    ...                         "rows = param('rows', 10)\\n"
    ...                         "# COMMAND ----------\\n"
    ...                         "total = spark.range(rows).count()\\n")
    >>> run_notebook(notebook, spark=spark, params={"rows": 5})["total"]
    5

    The notebooks in ``notebooks/`` run the same way, e.g.
    ``run_notebook("notebooks/02_recommendations_als.py", spark=spark,
    params={"max_iter": 5})["metrics"]["rmse"]``.
    """
    path = Path(path)
    ns = namespace if namespace is not None else {}
    ns.setdefault("__name__", "__main__")
    ns.setdefault("__file__", str(path.resolve()))
    if spark is not None:
        ns["spark"] = spark
    with _running(params or {}, ns) as module_globals:
        for cell in read_cells(path):
            if not cell.is_markdown:
                if on_cell is not None:
                    on_cell(cell)
                _run_cell(cell, path, module_globals)
    return ns


def _run_cell(cell: Cell, path: Path, ns: dict[str, Any]) -> None:
    # Leading newlines keep the file's line numbers in tracebacks.
    code = compile("\n" * (cell.line - 1) + cell.source, str(path.resolve()), "exec")
    try:
        exec(code, ns)
    except Exception as err:
        where = _failing_line(err, code.co_filename)
        at = f" at line {where}" if where is not None else ""
        raise NotebookError(f"{path.name}: cell {cell.number} (line {cell.line}, "
                            f"{cell.first_line!r}) failed{at}: {type(err).__name__}: {err}"
                            ) from err


def _failing_line(err: BaseException, filename: str) -> int | None:
    """The last line of the notebook file in the error's traceback."""
    line, tb = None, err.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == filename:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


@contextlib.contextmanager
def _running(params: Mapping[str, Any], ns: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """The notebook's run: a ``__main__`` module holding ``ns`` (copied back into ``ns`` at the
    end), ``params`` as environment variables; both restored afterwards."""
    import types

    env = {ENV_PREFIX + re.sub(r"\W", "_", name).upper(): _as_text(value)
           for name, value in params.items()}
    saved_env = {key: os.environ.get(key) for key in env}
    main = types.ModuleType("__main__")
    main.__dict__.update(ns)
    saved_main = sys.modules.get("__main__")
    os.environ.update(env)
    sys.modules["__main__"] = main
    try:
        yield main.__dict__
    finally:
        ns.update(main.__dict__)
        if saved_main is not None:
            sys.modules["__main__"] = saved_main
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
