"""The one error the config package raises, and how several problems read as one message."""

from __future__ import annotations


class ConfigError(ValueError):
    """A bad group choice, unknown key, bad value or malformed override, explained for the user."""


def format_problems(problems: list[str]) -> str:
    """One problem as it is; several as a count and one indented line each."""
    if len(problems) == 1:
        return problems[0]
    return f"{len(problems)} config problems:\n  " + "\n  ".join(problems)
