"""The action bridge's field handling: a call's arguments converted to a ROS message's field
types (`coerce`), goal templates filled or checked (`fill`), and result paths such as
`pose.position.x` or `sequence[-1]` parsed, checked and read (`parse_path`, `extract`).
Errors are `FieldError`s; action_bridge_config.py prefixes the skill's name.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from timelyllm_ros.core.skills.values import format_value

PLACEHOLDER = re.compile(r"\$(\d*)")
_PATH_PART = re.compile(r"\.?([A-Za-z_]\w*)|\[(-?\d+)\]")
_INTS = {"int8": (-2**7, 2**7), "uint8": (0, 2**8), "char": (0, 2**8), "int16": (-2**15, 2**15),
         "uint16": (0, 2**16), "int32": (-2**31, 2**31), "uint32": (0, 2**32),
         "int64": (-2**63, 2**63), "uint64": (0, 2**64)}
_FLOATS = {"float", "double", "long double"}


class FieldError(ValueError):
    """A template, value or path that does not fit the message."""


def coerce(value: Any, ftype: str) -> Any:
    """`value` converted to a ROS field type string (get_fields_and_field_types)."""
    seq = re.fullmatch(r"sequence<(.+?)(?:, ?\d+)?>|(.+?)\[(\d+)\]", ftype)
    if seq:
        elem = seq.group(1) or seq.group(2)
        if not isinstance(value, (list, tuple)):
            raise FieldError(f"a list is needed for {ftype}, got {format_value(value)}")
        if seq.group(3) and len(value) != int(seq.group(3)):
            raise FieldError(f"{ftype} needs {seq.group(3)} elements, got {len(value)}")
        return [coerce(v, elem) for v in value]
    if ftype == "boolean":
        if isinstance(value, bool):
            return value
        if isinstance(value, int) and value in (0, 1):
            return bool(value)
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        raise FieldError(f"{format_value(value)} is not a boolean")
    if ftype in _INTS:
        lo, hi = _INTS[ftype]
        try:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError
            v = float(value) if not isinstance(value, int) else value
            if isinstance(v, float):
                if not v.is_integer():
                    raise ValueError
                v = int(str(value).strip()) if isinstance(value, str) and \
                    str(value).strip().lstrip("+-").isdigit() else int(v)
        except (TypeError, ValueError):
            raise FieldError(f"{format_value(value)} is not an integer ({ftype})") from None
        if not lo <= v < hi:
            raise FieldError(f"{v} out of range for {ftype}")
        return v
    if ftype in _FLOATS:
        try:
            if isinstance(value, bool):
                raise TypeError
            return float(value)
        except (TypeError, ValueError):
            raise FieldError(f"{format_value(value)} is not a number ({ftype})") from None
    if ftype in ("string", "wstring") or ftype.startswith(("string<=", "wstring<=")):
        text = value if isinstance(value, str) else format_value(value)
        bound = re.search(r"<=(\d+)", ftype)
        if bound and len(text) > int(bound.group(1)):
            raise FieldError(f"text longer than {bound.group(1)} characters")
        return text
    raise FieldError(f"fields of type {ftype} cannot be set from a template")


def _substitute(value: Any, args: tuple | None, ftype: str, where: str):
    """A template leaf with `$N` replaced; with args None only checks the placeholders and
    returns None for a leaf that needs arguments."""
    if not isinstance(value, str) or "$" not in value:
        return value
    for m in PLACEHOLDER.finditer(value):
        if not m.group(1) or int(m.group(1)) < 1:
            raise FieldError(f"bad placeholder {value!r}: `$` must be followed by an argument "
                       "number, $1 for the first")
    whole = re.fullmatch(r"\$(\d+)", value)
    if not whole and not (ftype in ("string", "wstring") or ftype.startswith(("string<=",
                                                                           "wstring<="))):
        raise FieldError(f"{value!r}: text around a placeholder only fits a string field, "
                   f"this one is {ftype}")
    if args is None:
        return None
    if whole:
        return args[int(whole.group(1)) - 1]
    return PLACEHOLDER.sub(lambda m: (lambda a: a if isinstance(a, str) else format_value(a))(
        args[int(m.group(1)) - 1]), value)


def fill(msg: Any, template: Mapping, args: tuple | None, where: str) -> None:
    if not isinstance(template, Mapping):
        raise FieldError(f"{where}: must be a mapping of field names, got {template!r}")
    fields = type(msg).get_fields_and_field_types()
    for key, value in template.items():
        path = f"{where}.{key}"
        if key not in fields:
            raise FieldError(f"{path}: {type(msg).__name__} has no field {key!r} "
                       f"(fields: {', '.join(fields)})")
        ftype = fields[key]
        if isinstance(value, Mapping):
            if "/" not in ftype or "sequence" in ftype or "[" in ftype:
                raise FieldError(f"{path}: a mapping fits only a message field, this one is {ftype}")
            fill(getattr(msg, key), value, args, path)
            continue
        try:
            leaf = _substitute(value, args, ftype, path)
            if leaf is None and args is None:
                continue
            setattr(msg, key, coerce(leaf, ftype))
        except FieldError as err:
            raise FieldError(f"{path}: {err}") from None


def placeholders(template: Any) -> set[int]:
    if isinstance(template, Mapping):
        return set().union(*(placeholders(v) for v in template.values())) if template else set()
    if isinstance(template, (list, tuple)):
        return set().union(*(placeholders(v) for v in template)) if template else set()
    if isinstance(template, str):
        return {int(m.group(1)) for m in PLACEHOLDER.finditer(template) if m.group(1)}
    return set()


def parse_path(text: str) -> tuple:
    parts, pos = [], 0
    text = str(text).strip()
    while pos < len(text):
        m = _PATH_PART.match(text, pos)
        if not m or (m.group(1) and pos and text[pos] != "."):
            raise FieldError(f"{text!r} is not a field path like `a.b[0]`")
        parts.append(m.group(1) if m.group(1) else int(m.group(2)))
        pos = m.end()
    if not parts or not isinstance(parts[0], str):
        raise FieldError(f"{text!r} is not a field path like `a.b[0]`")
    return tuple(parts)


def check_path(cls: Any, path: tuple, text: str) -> None:
    obj = cls()
    for part in path:
        if isinstance(part, int):
            return              # sequences are empty in a default message: checked at run time
        fields = type(obj).get_fields_and_field_types()
        if part not in fields:
            raise FieldError(f"{text!r}: {type(obj).__name__} has no field {part!r} "
                       f"(fields: {', '.join(fields)})")
        obj = getattr(obj, part)


def extract(msg: Any, path: tuple) -> Any:
    """The value at `path` in a message, as a plain Python value (numpy scalars unwrapped)."""
    obj = msg
    for part in path:
        obj = obj[part] if isinstance(part, int) else getattr(obj, part)
    if hasattr(obj, "item") and not hasattr(obj, "get_fields_and_field_types"):
        try:
            obj = obj.item()
        except (ValueError, TypeError):
            pass
    return obj
