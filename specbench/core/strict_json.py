"""Strict JSON out: NaN and infinities become null, numpy scalars plain numbers.

`json.dumps` writes NaN, which strict parsers (JavaScript's, jq's) reject, and a summary of a
strategy that drafted nothing has undefined ratios."""

from __future__ import annotations

import json
import math
from typing import Any


def json_safe(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    if hasattr(value, "item") and not isinstance(value, (str, bytes)):  # numpy scalars and 0-d arrays
        return json_safe(value.item())
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    return json.dumps(json_safe(value), allow_nan=False, default=str, **kwargs)
