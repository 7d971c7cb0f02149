"""MkDocs hooks: pages the site builds from files kept elsewhere, so that none can drift.

* ``reference/configuration.md``: every key of every YAML file under ``configs/``, with its
  default and the comment beside it (:func:`config_reference`);
* ``changelog.md``: ``CHANGELOG.md``;
* ``benchmarks/results/``: ``benchmarks/RESULTS.md`` (the index) and one page per question
  from ``benchmarks/results/*.md``, the measured history, with the pictures of
  ``benchmarks/figures/`` beside them (also linked from the benchmark pages) (:func:`results`).

It also lays out the package as it installs for the API reference: the top-level ``agents/``
and ``envs/`` folders are ``rltrans.agents`` and ``rltrans.envs`` (pyproject.toml's
``package-dir``), so ``build/api-src/rltrans`` links each of them in beside ``rltrans/``'s own
entries, and mkdocstrings reads the sources from there.

Each ```` ```mermaid ```` diagram of a page is shown as the picture of it kept in
``docs/diagrams/`` (drawn by ``docs/render_diagrams.py``), so the site needs no script from a
network to show it; the Markdown keeps the diagram's source, which is what GitHub shows. A
picture names the hash of the source it was drawn from: a diagram edited without drawing it
again stops the build. The functions that write the text import nothing from MkDocs, so
tests can call them.
"""

from __future__ import annotations

import contextlib
import hashlib
import posixpath
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
KEY = re.compile(
    r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(?:#\s?(?P<doc>.*))?$"
)
CONTINUED = re.compile(r"^ *#\s?(?P<doc>.*)$")
GROUP_TITLES = {
    "agent": "agent=<option>: model recipes",
    "env": "env=<option>: environments",
    "algo": "algo=<option>: learning algorithms",
    "runtime": "runtime=<option>: where IMPALA's actors run",
}
API_SOURCE = ROOT / "build" / "api-src"  # mkdocs.yml's mkdocstrings paths
MAPPED = {"agents": "agents", "envs": "envs", "configs": "configs"}  # rltrans.<name>: folder
DIAGRAMS = ROOT / "docs" / "diagrams"  # the pictures of the pages' Mermaid diagrams
MERMAID = re.compile(r"^```mermaid\n(?P<source>.*?)^```$", re.S | re.M)
DRAWN_FROM = re.compile(r"<!-- mermaid source sha256:(?P<hash>[0-9a-f]{64}) ")  # in each SVG
ALT = re.compile(r"^\s*accTitle:\s*(?P<alt>.+?)\s*$", re.M)  # Mermaid's accessible title
DRAW = "python docs/render_diagrams.py --mermaid PATH/mermaid.min.js"
COMMANDS = {
    "train.yaml": "python -m rltrans.train",
    "evaluate.yaml": "python -m rltrans.evaluate",
    "collect.yaml": "python -m rltrans.collect",
    "export.yaml": "python -m rltrans.export",
}


@dataclass
class Knob:
    """One key of a YAML config: its dotted name, default and the comment beside it."""

    key: str
    default: str
    doc: str


def header(text: str) -> str:
    """The comment lines that open a YAML file, as one paragraph."""
    lines = []
    for line in text.splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("#").strip())
    return " ".join(lines)


def knobs(text: str) -> list[Knob]:
    """Every key of a YAML config file (nested ones dotted, Hydra's ``defaults`` list left
    out), with its default and its comment, continuation comment lines included."""
    found: list[Knob] = []
    parents: list[tuple[int, str]] = []  # (indent, key) of the mappings we are inside
    last: Knob | None = None
    in_defaults = False
    item_indent: int | None = None  # the dash of the list item we are in (its keys are values)
    for line in text.splitlines():
        if not line.strip():
            last = None
            continue
        key = KEY.match(line)
        if key is None:
            more = CONTINUED.match(line)
            if more and last is not None and line.startswith(" "):
                last.doc = f"{last.doc} {more['doc'].strip()}".strip()
            elif line.lstrip().startswith("-"):
                item_indent = len(line) - len(line.lstrip())
            else:
                last = None
            continue
        indent = len(key["indent"])
        if item_indent is not None and indent > item_indent:
            continue  # a key inside a list item: part of the list's default
        item_indent = None
        while parents and parents[-1][0] >= indent:
            parents.pop()
        if indent == 0:
            in_defaults = key["key"] == "defaults"
        if in_defaults:
            last = None
            continue
        name = ".".join([*(p for _, p in parents), key["key"]])
        value = key["value"].strip()
        if not value:  # a mapping: its keys follow, indented
            parents.append((indent, key["key"]))
        last = Knob(name, value, (key["doc"] or "").strip())
        found.append(last)
    return found


def escaped(text: str) -> str:
    """Comment text as Markdown that renders it as written: no links, emphasis or table breaks
    outside its `code spans`, and no table breaks inside them."""
    parts = text.split("`")
    for i, part in enumerate(parts):
        if i % 2 == 0:  # outside a code span
            for char in "\\[]<>*_":
                part = part.replace(char, "\\" + char)
        parts[i] = part.replace("|", "\\|")
    return "`".join(parts)


def block_value(loaded: dict, key: str) -> str:
    """A key's default written on the lines below it, from the file as ``loaded`` by YAML:
    its keys follow (a mapping), or the list in flow style."""
    value = loaded
    for part in key.split("."):
        value = value[part]
    if isinstance(value, dict):
        return "(keys below)"
    return f"`{yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()}`"


def table(text: str) -> str:
    """A Markdown table of the knobs of one YAML file (``text``)."""
    loaded = yaml.safe_load(text)
    rows = ["| key | default | what it does |", "|---|---|---|"]
    for knob in knobs(text):
        default = f"`{knob.default}`" if knob.default else block_value(loaded, knob.key)
        rows.append(f"| `{knob.key}` | {default} | {escaped(knob.doc)} |")
    return "\n".join(rows)


def config_reference(configs: Path = CONFIGS) -> str:
    """The configuration reference page: every YAML file's keys, defaults and comments."""
    out = [
        "# Configuration reference",
        "",
        "Generated from the comments in `configs/` when the site is built, so it says what "
        "`python -m rltrans.train --help` prints. Set a key with `key=value` "
        "(`agent.memory=64`) and pick a group's file with `group=option` (`agent=gru`); "
        "see [the train command](../guides/train.md).",
        "",
    ]
    for name, command in COMMANDS.items():
        text = (configs / name).read_text()
        out += [f"## `{command}`", "", f"`configs/{name}`: {escaped(header(text))}", ""]
        out += [table(text), ""]
    for group, title in GROUP_TITLES.items():
        out += [f"## {title}", ""]
        for path in sorted((configs / group).glob("*.yaml")):
            text = path.read_text()
            about = f"`configs/{group}/{path.name}`: {escaped(header(text))}"
            out += [f"### `{group}={path.stem}`", "", about, ""]
            out += [table(text), ""]
    return "\n".join(out)


def api_source(root: Path = ROOT, out: Path = API_SOURCE) -> Path:
    """The installed layout of the ``rltrans`` package as links under ``out``: each entry of
    ``rltrans/``, and ``MAPPED``'s folders as its subpackages. Safe to run from two builds at
    once: a link already right stays, a stale one is replaced, one for a removed entry goes."""
    package = out / "rltrans"
    package.mkdir(parents=True, exist_ok=True)
    entries = {p.name: p for p in (root / "rltrans").iterdir() if p.name != "__pycache__"}
    entries.update({name: root / folder for name, folder in MAPPED.items()})
    for link in package.iterdir():
        if link.name not in entries or link.resolve() != entries[link.name].resolve():
            link.unlink(missing_ok=True)
    for name, target in sorted(entries.items()):
        with contextlib.suppress(FileExistsError):  # made by the other build
            (package / name).symlink_to(target)
    return out


def source_hash(source: str) -> str:
    """The hash a diagram's picture names: of its Mermaid source as the page writes it."""
    return hashlib.sha256(source.encode()).hexdigest()


def pictures(folder: Path = DIAGRAMS) -> dict[str, str]:
    """The source hash each SVG under ``folder`` was drawn from: its name under ``docs/``."""
    found = {}
    for svg in sorted(folder.glob("*.svg")):
        drawn = DRAWN_FROM.search(svg.read_text())
        if drawn:
            found[drawn["hash"]] = f"{folder.name}/{svg.name}"
    return found


def with_pictures(markdown: str, page: str, drawn: dict[str, str]) -> str:
    """``markdown`` of the page ``page`` (its path under ``docs/``) with each Mermaid diagram
    replaced by its picture; ValueError names a diagram with no picture of its source."""

    def picture(match: re.Match[str]) -> str:
        source = match["source"]
        name = drawn.get(source_hash(source))
        if name is None:
            line = markdown.count("\n", 0, match.start()) + 1
            raise ValueError(
                f"docs/{page}:{line}: this Mermaid diagram has no picture of its source in "
                f"docs/diagrams/; draw the pages' diagrams again: {DRAW}"
            )
        alt = ALT.search(source)
        target = posixpath.relpath(name, posixpath.dirname(page) or ".")
        image = f"![{alt['alt'] if alt else 'diagram'}]({target}){{ .diagram }}"
        return f"[{image}]({target})"  # a click shows it full size

    return MERMAID.sub(picture, markdown)


def results(folder: Path = ROOT / "benchmarks") -> dict[str, str]:
    """The results pages by their place on the site: ``benchmarks/results/index.md`` from
    ``RESULTS.md`` and each ``results/<topic>.md``, their links between them kept (on the
    site the index sits beside the pages it lists; ``../figures/`` holds as it is)."""
    index = (folder / "RESULTS.md").read_text().replace("](results/", "](")
    pages = {"benchmarks/results/index.md": index}
    for page in sorted((folder / "results").glob("*.md")):
        text = page.read_text().replace("](../RESULTS.md)", "](index.md)")
        pages[f"benchmarks/results/{page.name}"] = text
    return pages


def on_startup(command: str, dirty: bool) -> None:
    """Lay out the package sources for the API reference before mkdocstrings looks for them."""
    api_source()


def on_files(files: Any, config: Any) -> Any:
    """Add the generated pages and the benchmark figures to the site."""
    from mkdocs.structure.files import File

    pages = {
        "reference/configuration.md": config_reference(),
        "changelog.md": (ROOT / "CHANGELOG.md").read_text(),
        **results(),
    }
    for uri, content in pages.items():
        files.append(File.generated(config, uri, content=content))
    for figure in sorted((ROOT / "benchmarks" / "figures").glob("*.png")):
        uri = f"benchmarks/figures/{figure.name}"
        files.append(File.generated(config, uri, abs_src_path=str(figure)))
    return files


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    """Show each Mermaid diagram of a page as its picture (no script from a network)."""
    from mkdocs.exceptions import PluginError

    try:
        return with_pictures(markdown, page.file.src_uri, pictures())
    except ValueError as err:
        raise PluginError(str(err)) from None
