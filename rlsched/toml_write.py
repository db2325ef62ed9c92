"""Writing the TOML files rlsched produces (``recommended.toml``, ``cost.toml``).

The standard library reads TOML but does not write it; the values these files hold are
plain (numbers, strings, booleans, lists, nested tables), so a small writer is enough.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from rlsched.cluster.errors import ConfigError


def toml_value(v: Any, where: str, *, nonfinite: bool = False) -> str:
    """``v`` as a TOML value. ``nonfinite``: write nan/inf (a fit's R² may be nan) instead
    of refusing them (a config a user will load must hold finite numbers)."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        if not math.isfinite(v):
            if not nonfinite:
                raise ConfigError(f"{where}={v!r} is not a finite number")
            return "nan" if math.isnan(v) else ("inf" if v > 0 else "-inf")
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(v, Sequence):
        return "[" + ", ".join(toml_value(x, where, nonfinite=nonfinite) for x in v) + "]"
    raise ConfigError(f"{where}: cannot write a {type(v).__name__} value")


def toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def toml_table(name: str, items: Mapping[str, Any], *, file: str, nonfinite: bool = False) -> list[str]:
    """``[name]`` and its keys; nested mappings follow as ``[name.key]`` tables."""
    lines = [f"[{name}]"]
    nested = []
    for k, v in items.items():
        if isinstance(v, Mapping):
            nested.append((k, v))
        else:
            lines.append(f"{toml_key(k)} = {toml_value(v, f'{file}: [{name}] {k}', nonfinite=nonfinite)}")
    for k, v in nested:
        lines += ["", *toml_table(f"{name}.{toml_key(k)}", v, file=file, nonfinite=nonfinite)]
    return lines
