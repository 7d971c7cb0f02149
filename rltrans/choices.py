"""Named options checked where a constructor receives them.

Mutually exclusive choices (a position scheme, a gate, a norm placement, a backbone) are one
named option, a ``Literal``, never a pile of booleans; a value outside it is refused with the
list of valid ones, in the same words from every constructor of the library. The command line
and the files a run reads go through :mod:`rltrans.config` first; this check is the library's
own, for models built from Python.

>>> check_choice("gate", "gru", ("residual", "gru"))
'gru'
"""

from __future__ import annotations


def check_choice(name: str, value: str, valid: tuple[str, ...]) -> str:
    """Return ``value`` if it is one of ``valid``, else raise a ValueError listing them."""
    if value not in valid:
        raise ValueError(f"unknown {name} {value!r}; valid choices: {', '.join(valid)}")
    return value
