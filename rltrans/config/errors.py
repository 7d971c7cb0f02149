"""The one error the config package raises, and how several problems read as one message."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad group choice, unknown key, bad value or malformed override, explained for the user."""


def format_problems(problems: list[str]) -> str:
    """One problem as it is; several as a count and one indented line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} config problems:\n  " + "\n  ".join(problems)


def first_line(err: BaseException, limit: int = 300) -> str:
    """An exception's first line of text (its type's name when it has none), at most
    ``limit`` characters: what one ``error:`` line quotes of a library's error."""
    text = str(err).strip()
    return text.splitlines()[0][:limit] if text else type(err).__name__
