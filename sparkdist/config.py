"""The workflow config: a YAML or JSON file naming data, features, split, models and tracking.

Unknown or misspelt keys are errors that say which key, where, and what was probably meant.

Example (``jobs/configs/churn.yaml``)::

    name: churn
    imports: [mypkg.nets]    # optional: modules that define classes the params name
    data: {path: data/churn_sample.parquet}
    features: {numericCols: [month_interaction_count], labelCol: cancelled_within_week}
    split: {method: random, fractions: {train: 0.8, test: 0.2}, keyCols: [customer_id]}
    models:
      - {type: LogisticRegression, params: {maxIter: 10}}
"""

from __future__ import annotations

import importlib
import json
import keyword
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from sparkdist.columns import suggest
from sparkdist.exceptions import ConfigError
from sparkdist.models import ESTIMATORS


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class GenerateConfig(_Strict):
    dataset: Literal["churn", "ratings"]
    rows: int = Field(10_000, gt=0, description="churn rows (ratings: ignored)")
    seed: int = 0


class DataConfig(_Strict):
    """Exactly one source: a file ``path`` (``format``), a catalog ``table``, or ``generate``."""

    path: str | None = None
    format: str = "parquet"
    table: str | None = None
    generate: GenerateConfig | None = None

    @model_validator(mode="after")
    def _one_source(self) -> DataConfig:
        given = [k for k in ("path", "table", "generate") if getattr(self, k) is not None]
        if len(given) != 1:
            raise ValueError(f"give exactly one of path, table or generate (got {given or 'none'})")
        return self


class FeaturesConfig(_Strict):
    """Arguments of :class:`sparkdist.features.FeatureAssembler`."""

    numericCols: list[str] = []
    categoricalCols: list[str] = []
    vectorCols: list[str] = []
    labelCol: str = "label"
    outputCol: str = "features"
    nullPolicy: str = "error"
    standardize: bool = False


class SplitConfig(_Strict):
    """Arguments of :func:`sparkdist.features.split`."""

    method: str = "random"
    fractions: dict[str, float] = {"train": 0.8, "test": 0.2}
    seed: int = 42
    keyCols: list[str] | None = None
    labelCol: str | None = None
    timeCol: str | None = None
    groupCol: str | None = None
    userCol: str | None = None
    itemCol: str | None = None


class ModelConfig(_Strict):
    type: str
    name: str | None = None
    params: dict[str, Any] = {}

    @model_validator(mode="after")
    def _known_type(self) -> ModelConfig:
        if self.type not in ESTIMATORS:
            raise ValueError(f"unknown model type {self.type!r}; use one of {ESTIMATORS}."
                             f"{suggest(self.type, ESTIMATORS)}")
        self.name = self.name or self.type
        return self


class TrackingConfig(_Strict):
    enabled: bool = True
    experiment: str = "sparkdist"
    uri: str | None = None  # default: $MLFLOW_TRACKING_URI, Databricks, else sqlite:///mlruns.db


class OutputConfig(_Strict):
    modelDir: str | None = None  # each model saved as a PipelineModel under modelDir/<name>
    overwrite: bool = False


class WorkflowConfig(_Strict):
    name: str
    imports: list[str] = []  # modules imported before the models are built (import_modules)
    data: DataConfig
    features: FeaturesConfig | None = None  # None: the models read raw columns (ALS)
    split: SplitConfig = SplitConfig()
    models: list[ModelConfig] = Field(min_length=1)
    evaluation: dict[str, int] = {"k": 10}
    tracking: TrackingConfig = TrackingConfig()
    output: OutputConfig = OutputConfig()

    @model_validator(mode="after")
    def _unique_names(self) -> WorkflowConfig:
        names = [m.name for m in self.models]
        if len(set(names)) != len(names):
            raise ValueError(f"model names must be unique, got {names}; set `name:` on each")
        return self


def load_config(path: str | Path) -> WorkflowConfig:
    """Read and validate a YAML (``.yaml``/``.yml``) or JSON config file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise ConfigError(f"cannot read config {str(path)!r}: {err.strerror}.") from None
    except UnicodeDecodeError as err:  # a ValueError, not an OSError
        raise ConfigError(f"config {str(path)!r} is not UTF-8 text (byte {err.start}: "
                          f"{err.reason}); save it as UTF-8.") from None
    try:
        raw = json.loads(text) if path.suffix == ".json" else _yaml(text)
    except ValueError as err:
        raise ConfigError(f"config {str(path)!r} is not valid {path.suffix[1:] or 'YAML'}: "
                          f"{err}") from None
    return parse_config(raw, source=str(path))


def parse_config(raw: Any, source: str = "config") -> WorkflowConfig:
    try:
        return WorkflowConfig.model_validate(raw)
    except ValidationError as err:
        problems = "; ".join(_explain(e) for e in err.errors())
        raise ConfigError(f"{source}: {problems}") from None


def import_modules(names: Sequence[str], where: str = "imports") -> None:
    """Import each module the user named (config ``imports``, the CLI's ``--import``), so
    that Params may name the classes they define (``model: mypkg.nets.Net``): a Param never
    imports a module itself, and nothing read from a saved model is passed here.

    Raises
    ------
    ConfigError : a name is not a dotted module name, or its import fails (naming it).
    """
    for name in names:
        if not (isinstance(name, str) and name
                and all(p.isidentifier() and not keyword.iskeyword(p) for p in name.split("."))):
            raise ConfigError(f"{where}: {name!r} is not a module name; give a dotted name "
                              "such as 'mypkg.nets'.")
        try:
            importlib.import_module(name)
        except Exception as err:  # its top-level code may raise anything
            detail = (str(err).splitlines() or [""])[0]
            raise ConfigError(f"{where}: cannot import module {name!r} "
                              f"({type(err).__name__}: {detail}); install it or put it on "
                              "PYTHONPATH (executors too: spark-submit --py-files).") from None


def _yaml(text: str) -> Any:
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise ValueError(str(err)) from None


def _explain(error: Any) -> str:
    """One pydantic error as 'key a.b: problem', with a did-you-mean for unknown keys."""
    loc = [str(p) for p in error["loc"]]
    where = ".".join(loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent = ".".join(loc[:-1]) or "the top level"
        return (f"unknown key '{loc[-1]}' in {parent}."
                f"{suggest(loc[-1], _fields_at(loc[:-1]))}")
    if error["type"] == "missing":
        return f"missing required key '{where}'"
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"


def _fields_at(loc: list[str]) -> list[str]:
    """The allowed keys at a config location (for suggestions)."""
    model: Any = WorkflowConfig
    for part in loc:
        if part.isdigit():
            continue
        field = model.model_fields.get(part)
        annotation = getattr(field, "annotation", None)
        candidates = [a for a in getattr(annotation, "__args__", (annotation,))
                      if isinstance(a, type) and issubclass(a, BaseModel)]
        if not candidates:
            return []
        model = candidates[0]
    return list(model.model_fields)
