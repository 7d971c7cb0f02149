"""A Griffe extension for the API reference: the docstrings' Sphinx roles as cross-references.

The sources write references as Sphinx roles (``:func:`plan```, ``:class:`~rltrans.x.Y```),
which Markdown would show as typed. Once the package is loaded, each role is resolved in the
scope of the object whose docstring holds it (its module's imports, its class's members) and
becomes an autorefs reference to the object's canonical path, shown as code: a link where
the site documents the object, plain code where it does not (a private helper, an external
library). A role naming nothing that exists in the package is a stale reference: it is logged
as a warning, which fails ``mkdocs build --strict``.

mkdocs.yml loads this file as an extension of mkdocstrings' Python handler.
"""

from __future__ import annotations

import builtins
import html
import logging
import re
from collections.abc import Callable, Iterator
from typing import Any

from griffe import AliasResolutionError, CyclicAliasError, Extension, NameResolutionError, Object

PACKAGE = "rltrans"
ROLE = re.compile(r":(?P<role>func|class|mod|meth|attr|data|exc|obj):`(?P<target>[^`]+)`")
log = logging.getLogger("mkdocs.hooks.sphinx_roles")  # a warning here fails --strict


def translate(text: str, resolve: Callable[[str], str | None]) -> tuple[str, list[str]]:
    """``text`` with every Sphinx role replaced, and the targets ``resolve`` found nowhere.

    ``resolve(name)`` gives the canonical path of a name in the package, or None; a name
    outside the package (``torch.nn.Module``) is code with no link, one inside that resolves
    to nothing is returned as stale (and shown as code)."""
    stale: list[str] = []

    def replace(match: re.Match[str]) -> str:
        target = match["target"].strip()
        short = target.startswith("~")  # Sphinx: show only the last component
        name = target.lstrip("~").removesuffix("()")
        shown = name.rsplit(".", 1)[-1] if short else name
        if target.endswith("()"):
            shown += "()"
        code = f"<code>{html.escape(shown)}</code>"
        path = resolve(name)
        if path is None:
            if name.split(".")[0] == PACKAGE or not ("." in name or hasattr(builtins, name)):
                stale.append(match[0])
            return code
        # optional: plain code, not a broken link, when the site does not document the object
        return f'<autoref identifier="{html.escape(path)}" optional>{code}</autoref>'

    return ROLE.sub(replace, text), stale


def resolver(obj: Object) -> Callable[[str], str | None]:
    """The canonical path of a name as written in ``obj``'s docstring, or None."""
    collection = obj.modules_collection

    def resolve(name: str) -> str | None:
        first, _, rest = name.partition(".")
        head = first if first == PACKAGE else in_scope(obj, first)
        if head is None:
            return None
        try:
            return collection[f"{head}.{rest}" if rest else head].canonical_path
        except (KeyError, AliasResolutionError, CyclicAliasError):  # not in the package
            return None

    return resolve


def in_scope(obj: Object, name: str) -> str | None:
    """The path of ``name`` seen from ``obj``: a member (inherited ones too, so a method's
    docstring reaches its class's base methods), an import, or the same in a parent scope."""
    scope: Object | None = obj
    while scope is not None:
        members = scope.all_members if scope.is_class else scope.members
        if name in members:
            return members[name].path
        scope = scope.parent
    try:
        return obj.resolve(name)
    except NameResolutionError:  # not in scope
        return None


def documented(obj: Object) -> Iterator[Object]:
    """``obj`` and every object below it that owns its docstring (aliases left out)."""
    yield obj
    for member in obj.members.values():
        if not member.is_alias:
            yield from documented(member)


class SphinxRoles(Extension):
    """Rewrites the loaded package's docstrings: Sphinx roles become cross-references."""

    def on_package(self, *, pkg: Any, **kwargs: Any) -> None:
        """Translate every docstring of the package once it is fully loaded."""
        if pkg.name != PACKAGE:
            return
        for obj in documented(pkg):
            if obj.docstring is None or ":" not in obj.docstring.value:
                continue
            text, stale = translate(obj.docstring.value, resolver(obj))
            for role in stale:
                log.warning("%s: %s names nothing in the package", obj.path, role)
            obj.docstring.value = text
            obj.docstring.__dict__.pop("parsed", None)  # parsed again from the new text
