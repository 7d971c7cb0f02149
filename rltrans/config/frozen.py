"""A resolved config as read-only plain data: what a :class:`~rltrans.config.plan.RunPlan`
holds in place of the composed (mutable, interpolating) OmegaConf tree.

``freeze`` turns mappings into :class:`Frozen` and lists into tuples, all the way down;
``thaw`` gives back plain dicts and lists (for a YAML file, a checkpoint, a builder that
takes plain data). A ``Frozen`` reads as a mapping and by attribute (``config.env.kind``),
refuses every assignment, pickles as plain data and equals any mapping with the same items.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, NoReturn


class Frozen(Mapping[str, Any]):
    """A read-only config section; keys read as items or attributes."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, Any] = ()) -> None:
        """Freeze a copy of ``items`` (nested mappings and lists included)."""
        object.__setattr__(self, "_items", {str(k): freeze(v) for k, v in dict(items).items()})

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._items[name]
        except KeyError:
            keys = ", ".join(self._items)
            raise AttributeError(f"config has no key {name!r}; its keys: {keys}") from None

    def __setattr__(self, name: str, value: Any) -> NoReturn:
        raise TypeError(f"a resolved config is read-only ({name}={value!r}); build a new plan")

    __delattr__ = __setattr__

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Mapping) and thaw(self) == thaw(other)

    __hash__ = None  # type: ignore[assignment]  (equal to mutable mappings)

    def __reduce__(self) -> tuple[type, tuple[dict[str, Any]]]:
        return (Frozen, (thaw(self),))

    def __repr__(self) -> str:
        return f"Frozen({thaw(self)!r})"

    def replace(self, **changes: Any) -> Frozen:
        """A copy with ``changes`` to its top-level keys."""
        return Frozen({**self._items, **changes})


def freeze(value: Any) -> Any:
    """``value`` with every mapping a :class:`Frozen` and every list a tuple."""
    if isinstance(value, Frozen):
        return value
    if isinstance(value, Mapping):
        return Frozen(value)
    if isinstance(value, list | tuple):
        return tuple(freeze(v) for v in value)
    return value


def thaw(value: Any) -> Any:
    """``value`` as plain, mutable data: dicts and lists (a copy)."""
    if isinstance(value, Mapping):
        return {k: thaw(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [thaw(v) for v in value]
    return value


__all__ = ["Frozen", "freeze", "thaw"]
