"""Values that skills return, and how MiniSpec conditionals compare them (TypeFly's semantics,
minispec_interpreter.py, plus one rule of ours for "unknown"):

- numbers compare as numbers; True and False count as 1 and 0 (as in TypeFly, whose Python
  comparisons treat bools as ints), so `?_1>0.5` works on whatever a vision skill returned;
- `==` / `!=` between values of different kinds (a string and a number) are False / True;
  `<` / `>` between them are an error that fails the segment;
- UNKNOWN (a skill that cannot observe, e.g. a Tello vision skill without a vision source)
  makes every comparison False, `!=` included. So neither `?_1==True{...}` nor
  `?_1==False{...}` nor `?_1!=False{...}` runs: a robot never acts on what it could not see.
"""

from __future__ import annotations

from typing import Union


class Unknown:
    """The single "don't know" value; prints as `unknown`."""

    _instance: "Unknown | None" = None

    def __new__(cls) -> "Unknown":
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "unknown"

    __str__ = __repr__

    def __reduce__(self):
        return (Unknown, ())


UNKNOWN = Unknown()
Value = Union[bool, int, float, str, None, Unknown]


class ComparisonError(ValueError):
    """An ordering comparison between values of different kinds."""


def _is_number(v: Value) -> bool:
    return isinstance(v, (bool, int, float))


def compare(left: Value, op: str, right: Value) -> bool:
    if left is UNKNOWN or right is UNKNOWN:
        return False
    if _is_number(left) and _is_number(right):
        a, b = float(left), float(right)
    elif type(left) is type(right):
        a, b = left, right
    else:
        if op == "==":
            return False
        if op == "!=":
            return True
        raise ComparisonError(f"cannot compare {format_value(left)} {op} {format_value(right)}")
    if op == "==":
        return a == b
    if op == "!=":
        return a != b
    if a is None or b is None:
        raise ComparisonError(f"cannot compare {format_value(left)} {op} {format_value(right)}")
    return a < b if op == "<" else a > b


def format_value(v: Value) -> str:
    """A value as MiniSpec would write it (strings quoted)."""
    if isinstance(v, str):
        return "'" + v + "'"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1e4 else repr(v)
    return repr(v) if v is not None else "None"
