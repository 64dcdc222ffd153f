"""``strategy="tensor"``: not built yet."""

from __future__ import annotations

from typing import Any

from sparkdist.exceptions import ParamError
from sparkdist.torchtrain import strategies


def check(spec: dict[str, Any], module: Any) -> None:
    raise ParamError("strategy='tensor' is not available yet; use strategy='ddp'.")


class Strategy(strategies.Strategy):
    name = "tensor"
