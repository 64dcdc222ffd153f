"""One Params surface for every sparkdist stage, from one place.

The ``getX()`` / ``setX(value)`` pair of every Param is source, as pyspark's are: written by
``make accessors`` (:mod:`sparkdist.models._accessors_gen`) into ``_accessors_*.py`` next to
the stage modules wherever no hand-written (or MLlib) accessor exists, so type checkers and
IDEs see them. :class:`StageParams` completes every class that derives from it (every
sparkdist stage does, through :class:`sparkdist.persist.ParamsPersistence`) as the class is
created, with what is the same for every stage:

* a ``Params`` section in the class docstring naming every Param with its doc;
* ``__init__`` and ``setParams`` refuse an unknown keyword with a ParamError that names the
  closest valid name ("unknown parameter 'maxIterr'. Did you mean 'maxIter'?") instead of a
  bare TypeError; a class may add ``_param_aliases`` (other accepted keywords) and
  ``_param_hints`` (a sentence for a name that is wrong on purpose);
* a stage that sets ``_generated_init`` gets its constructor from ``make accessors`` too (a
  typed keyword per Param and alias, in a class the stage lists as its first base), checked
  the same way;
* ``_fit`` returns a model that carries the estimator's uid, as pyspark's JVM-backed models
  do (so a fitted model and its estimator share Param identities).
"""

from __future__ import annotations

import functools
import inspect
import sys
import textwrap
import zlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from pyspark.ml.base import Estimator
from pyspark.ml.param import Param, Params

from sparkdist.columns import suggest
from sparkdist.exceptions import ParamError

#: Marks a class written by ``make accessors`` (its methods are generated, not hand-written).
GENERATED = "_generated_accessors"
_CHECKED = "_sparkdist_checks_keywords"
_KEEPS_UID = "_sparkdist_keeps_uid"
_SECTION = "Params\n------\n"


def stable_seed(name: str) -> int:
    """A seed that is the same in every process (pyspark's default ``hash(name)`` is not)."""
    return zlib.crc32(name.encode())


def user_frame_level() -> int:
    """The ``stacklevel`` (seen from the caller's caller) of the first frame outside
    sparkdist and pyspark: a warning names the user's line, not keyword_only's."""
    frame, level = sys._getframe(2), 2
    while frame.f_back is not None and frame.f_globals.get("__name__", "").partition(".")[0] \
            in ("sparkdist", "pyspark"):
        frame, level = frame.f_back, level + 1
    return level


def accessor_suffix(name: str) -> str:
    """What follows ``get``/``set`` for Param ``name``: ``maxIter`` -> ``MaxIter``,
    ``max_depth`` -> ``MaxDepth``."""
    return "".join(part[:1].upper() + part[1:] for part in name.split("_"))


def class_params(cls: type) -> list[Param[Any]]:
    """The Params a class declares (its own and inherited), by name."""
    found: dict[str, Param[Any]] = {}
    for attr in dir(cls):
        value = inspect.getattr_static(cls, attr, None)
        if isinstance(value, Param):
            found[value.name] = value
    return [found[name] for name in sorted(found)]


def unknown_param(cls: type, name: str, allowed: Iterable[str]) -> ParamError:
    """The error for keyword ``name`` that ``cls`` does not take: a class hint, else the
    setter of a Param the keyword list leaves out, else the closest name, else all names."""
    allowed = sorted(set(allowed))
    params = {p.name for p in class_params(cls)}
    hints: Mapping[str, str] = getattr(cls, "_param_hints", {})
    if name in hints:
        return ParamError(f"{cls.__name__}: parameter {name!r} is not supported: {hints[name]}")
    if name in params:
        return ParamError(f"{cls.__name__}: {name!r} is not a keyword here; set it with "
                          f"set{accessor_suffix(name)}(...).")
    hint = suggest(name, sorted(set(allowed) | params)).strip()
    return ParamError(f"{cls.__name__}: unknown parameter {name!r}. "
                      f"{hint or f'Valid names: {allowed}.'}")


def keywords(cls: type) -> set[str]:
    """The keywords a ``**kwargs`` setter of ``cls`` takes: its Params and their aliases."""
    return {p.name for p in class_params(cls)} | set(getattr(cls, "_param_aliases", {}))


def _checking_keywords(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` (an ``__init__`` or ``setParams``), refusing an unknown keyword with
    :func:`unknown_param` before it runs."""
    signature = inspect.signature(func)  # through keyword_only, to the real signature
    takes_any = any(p.kind is p.VAR_KEYWORD for p in signature.parameters.values())
    named = {n for n, p in list(signature.parameters.items())[1:]
             if p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD)}

    @functools.wraps(func)
    def checked(self: Any, *args: Any, **kwargs: Any) -> Any:
        allowed = keywords(type(self)) if takes_any else named
        for name in kwargs:
            if name not in allowed:
                raise unknown_param(type(self), name, allowed)
        return func(self, *args, **kwargs)

    setattr(checked, _CHECKED, True)
    return checked


def _keeping_uid(fit: Callable[..., Any]) -> Callable[..., Any]:
    """``_fit``, whose model takes the estimator's uid (as pyspark's JVM models do)."""
    @functools.wraps(fit)
    def _fit(self: Any, dataset: Any) -> Any:
        model = fit(self, dataset)
        if isinstance(model, Params) and model.uid != self.uid:
            model._resetUid(self.uid)
        return model

    setattr(_fit, _KEEPS_UID, True)
    return _fit


def _doc_section(params: list[Param[Any]]) -> str:
    lines = [_SECTION.rstrip("\n"),
             *textwrap.wrap("Each Param has a getter and a setter, named after it in camel case; "
                            "``explainParams()`` shows the defaults and the values set.", 88),
             ""]
    for param in params:
        suffix = accessor_suffix(param.name)
        lines.append(f"{param.name} : get{suffix}() / set{suffix}(value)")
        lines += textwrap.wrap(param.doc, 84, initial_indent="    ", subsequent_indent="    ",
                               break_on_hyphens=False)
    return "\n".join(lines)


def _generated_init(cls: type, method: str) -> Any:
    """The constructor ``cls`` inherits from its generated first base, if that is where it
    comes from (it is checked on ``cls`` itself)."""
    owner = next((k for k in cls.__mro__[1:] if method in vars(k)), None)
    if method != "__init__" or owner is None or not getattr(owner, GENERATED, False):
        return None
    return vars(owner)[method]


def complete(cls: type) -> None:
    """Add what :class:`StageParams` promises to ``cls`` (idempotent)."""
    params = class_params(cls)
    for method in ("__init__", "setParams"):
        func = cls.__dict__.get(method) or _generated_init(cls, method)
        if inspect.isfunction(func) and not getattr(func, _CHECKED, False):
            setattr(cls, method, _checking_keywords(func))
    if issubclass(cls, Estimator):
        fit = getattr(cls, "_fit", None)
        if fit is not None and not getattr(fit, "__isabstractmethod__", False) \
                and not getattr(fit, _KEEPS_UID, False):
            setattr(cls, "_fit", _keeping_uid(fit))  # noqa: B010 (a plain type to mypy)
    own = cls.__dict__.get("__doc__")
    if params and not cls.__name__.startswith("_"):
        text = inspect.cleandoc(own) if own else ""
        text = text.split(f"\n\n{_SECTION}")[0] if _SECTION in text else text
        cls.__doc__ = f"{text}\n\n{_doc_section(params)}" if text else _doc_section(params)


class StageParams:
    """Mixin whose subclasses :func:`complete` themselves (see the module docstring)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        complete(cls)
