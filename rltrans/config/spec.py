"""Typed specs of config values: what one key accepts (type, range, choices, null), how to
check a value against it, and the one-line reports of a bad value or an unknown key.

A spec is inferred from a YAML default where the default says enough (``dim: 64`` takes
integers) and from a ``Literal`` annotation where code declares the choices; the rest is
written out in :mod:`rltrans.config.schema`. Nothing here knows rltrans's keys.

>>> integer(1).check(0)
(False, 0)
>>> bad_value("total_steps", "abc", integer(1))
'total_steps=abc: expected an integer >= 1'
"""

from __future__ import annotations

import math
import re
import types
import typing
from collections.abc import Iterable
from dataclasses import dataclass, replace
from typing import Any, Literal, get_args, get_origin

SEED_MAX = 2**32 - 1  # NumPy seeds are 32-bit
_DEVICE = re.compile(r"auto|cpu|cuda(:\d+)?")


@dataclass(frozen=True)
class Spec:
    """What one config key accepts."""

    type: str  # int | float | bool | str | choice | device | numbers | list | mapping | any
    low: float | None = None
    high: float | None = None
    open_low: bool = False  # the bound itself is invalid (lr > 0)
    open_high: bool = False
    choices: tuple[str, ...] = ()
    nullable: bool = False
    # Words accepted besides the type only when the YAML default is one of them: a mode such
    # as torch_threads: auto is valid once the YAML (and so the code) offers it.
    default_words: tuple[str, ...] = ()
    words: tuple[str, ...] = ()
    item_keys: tuple[str, ...] = ()  # list items: mappings with these keys, the first required
    nonempty: bool = False  # strings: '' is invalid (run_dir= would mean the working directory)

    def describe(self) -> str:
        """What is valid, in words (``an integer >= 1``, ``one of: pre, post``)."""
        text = {
            "int": "an integer" + self._range(),
            "float": "a number" + self._range(),
            "bool": "true or false",
            "str": "a non-empty string" if self.nonempty else "a string",
            "choice": "one of: " + ", ".join(self.choices),
            "device": "auto, cpu, cuda or cuda:<index>",
            "numbers": f"a number{self._range()} or a non-empty list of them",
            "list": "a list",
            "mapping": "a mapping {key: value}",
            "any": "any value",
        }[self.type]
        if self.item_keys:
            text = f"a list of mappings with keys {', '.join(self.item_keys)}"
        words = " or ".join(("null",) * self.nullable + self.words)
        return f"{words} or {text}" if words else text

    def _range(self) -> str:
        """`` >= 1``, `` in (0, 1]`` or nothing."""
        lo, hi = (None if b is None else _bound(b) for b in (self.low, self.high))
        if lo is not None and hi is not None:
            return f" in {'(' if self.open_low else '['}{lo}, {hi}{')' if self.open_high else ']'}"
        if lo is not None:
            return f" {'>' if self.open_low else '>='} {lo}"
        if hi is not None:
            return f" {'<' if self.open_high else '<='} {hi}"
        return ""

    def check(self, value: Any) -> tuple[bool, Any]:
        """(valid, the value in its canonical type: 1e5 -> 100000 for integers, 3 -> 3.0)."""
        if value is None:
            return self.nullable, value
        if isinstance(value, str) and value in self.words:
            return True, value
        kind = self.type
        if kind in ("int", "float"):
            number = _number(value, integer=kind == "int")
            return (number is not None and self._in_range(number)), number
        if kind == "numbers":
            items = value if isinstance(value, list) else [value]
            numbers = [_number(v, integer=False) for v in items]
            ok = bool(numbers) and all(n is not None and self._in_range(n) for n in numbers)
            return ok, numbers if isinstance(value, list) else numbers[0]
        if kind == "str":  # names and paths: a number such as run_dir=2024 is a name too
            ok = isinstance(value, str) or (_is_number(value) and math.isfinite(value))
            ok = ok and not (self.nonempty and value == "")
            return ok, str(value) if ok else value
        if kind == "list" and self.item_keys:
            return isinstance(value, list) and all(self._item_ok(v) for v in value), value
        valid = {
            "bool": lambda v: isinstance(v, bool),
            "choice": lambda v: isinstance(v, str) and v in self.choices,
            "device": lambda v: isinstance(v, str) and _DEVICE.fullmatch(v) is not None,
            "list": lambda v: isinstance(v, list),
            "mapping": lambda v: isinstance(v, dict),
            "any": lambda v: True,
        }[kind]
        return valid(value), value

    def _in_range(self, x: float) -> bool:
        """Within [low, high] (bounds excluded where open)."""
        if self.low is not None and (x < self.low or (self.open_low and x == self.low)):
            return False
        return not (
            self.high is not None and (x > self.high or (self.open_high and x == self.high))
        )

    def _item_ok(self, item: Any) -> bool:
        """A list item: a mapping with the first item key and no others than item_keys."""
        return (
            isinstance(item, dict)
            and self.item_keys[0] in item
            and set(item) <= set(self.item_keys)
        )


def _bound(x: float) -> str:
    """A range bound as written: 0, 1, 0.5, 4294967295, 2^20, 10^15."""
    if not float(x).is_integer():
        return f"{x:g}"
    n = int(x)
    for base in (2, 10):
        power = round(math.log(n, base)) if n > 10**6 else 0
        if power and base**power == n:
            return f"{base}^{power}"
    return str(n)


def _is_number(value: Any) -> bool:
    """int or float, not bool (YAML's true is no count)."""
    return isinstance(value, int | float) and not isinstance(value, bool)


def _number(value: Any, integer: bool) -> float | int | None:
    """The finite number ``value`` holds (an integral float as int when ``integer``), else None."""
    if not _is_number(value) or not math.isfinite(value):
        return None
    if integer:
        return int(value) if float(value).is_integer() else None
    return float(value)


def integer(low: float | None = None, high: float | None = None, *, null: bool = False) -> Spec:
    """An integer in [low, high]; ``null`` also accepts null."""
    return Spec("int", low, high, nullable=null)


def number(
    low: float | None = None,
    high: float | None = None,
    *,
    open_low: bool = False,
    open_high: bool = False,
    null: bool = False,
) -> Spec:
    """A finite number in the range (``open_*`` excludes that bound)."""
    return Spec("float", low, high, open_low, open_high, nullable=null)


def choice(values: Iterable[str], *, null: bool = False) -> Spec:
    """One of ``values``."""
    return Spec("choice", choices=tuple(values), nullable=null)


def string(*, null: bool = False) -> Spec:
    """Any string (a name, id or path)."""
    return Spec("str", nullable=null)


BOOL = Spec("bool")
DEVICE = Spec("device")
POSITIVE = integer(1)
SEED = integer(0, SEED_MAX)


def infer_spec(default: Any) -> Spec | None:
    """The spec a YAML default implies by its type (None for null: it needs a table entry)."""
    if isinstance(default, bool):
        return BOOL
    if isinstance(default, int):
        return integer()
    if isinstance(default, float):
        return number()
    if isinstance(default, str):
        return string()
    if isinstance(default, list):
        return Spec("list")
    if isinstance(default, dict):
        return Spec("mapping")
    return None


def hint_spec(hint: Any) -> Spec | None:
    """The spec of a type annotation: Literal -> choices, int/float/bool/str,
    ``tuple[float, ...]`` -> numbers, ``X | None``, ``X | Literal["auto"]`` (X, or the word
    where the YAML default is it)."""
    if get_origin(hint) in (typing.Union, types.UnionType):
        args = [a for a in get_args(hint) if a is not type(None)]
        words = tuple(w for a in args if get_origin(a) is Literal for w in get_args(a))
        rest = [a for a in args if get_origin(a) is not Literal]
        inner = hint_spec(rest[0]) if len(rest) == 1 else None
        if inner is None:
            return None
        return replace(inner, nullable=len(args) < len(get_args(hint)), default_words=words)
    if get_origin(hint) is Literal:
        return choice(str(a) for a in get_args(hint))
    if (
        get_origin(hint) is tuple
        and get_args(hint)[1:] == (Ellipsis,)
        and hint_spec(get_args(hint)[0]) == number()
    ):
        return Spec("numbers")  # tuple[float, ...]: a number or a list of them
    simple = {bool: BOOL, int: integer(), float: number(), str: string()}
    return simple.get(hint)


def format_value(value: Any) -> str:
    """A value as it would be typed on the command line (null, true, [1, 2], {a: 1})."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    return str(value) if str(value) else "''"


def bad_value(key: str, value: Any, spec: Spec) -> str:
    """The one-line report of a bad value: key, value and what is valid."""
    line = f"{key}={format_value(value)}: expected {spec.describe()}"
    if isinstance(value, bool) and spec.type == "choice":
        line += " (YAML reads unquoted on/off/yes/no as booleans: quote the word)"
    return line


def unknown_key(key: str, valid: Iterable[str], why: str = "") -> str:
    """The one-line report of an unknown key with the keys valid at its place."""
    return f"unknown config key {key!r}{why}; valid keys here: {', '.join(sorted(valid))}"
