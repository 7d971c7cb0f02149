"""The documentation site says what the code does: the configuration reference holds every key
of every YAML file with its comment, every example a page marks ``<!-- runs -->`` runs as
written, the README stays a front door (short, its links alive) and every section that moved
from it to the site is still there. ``.ci/run`` also builds the site with ``mkdocs build
--strict`` (broken links, pages missing from the navigation, API symbols that no longer exist).

A page marks an example that runs in seconds with an HTML comment on the line before its
fence (invisible on the site):

* ``<!-- runs -->`` before a ```` ```bash ```` block: its commands run in order in bash
  (``set -euo pipefail``); before a ```` ```python ```` block: the block runs as a script;
* ``<!-- runs: file=NAME -->``: the block is written to the file NAME (a module the next
  blocks import, such as a user's env).

A page's examples run in order, in one fresh folder (the current directory, also on
``PYTHONPATH``), with ``python`` the interpreter running the tests and Minari's datasets in
that folder. They take minutes, so they are marked ``docs``: ``python -m pytest -m docs`` runs
them, as ``.ci/run`` does after the default tests.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
README = ROOT / "README.md"
MARKED = re.compile(
    r"^<!-- runs(?:: file=(?P<file>[\w./-]+))? -->\n```(?P<lang>\w+)[^\n]*\n(?P<body>.*?)^```",
    re.S | re.M,
)
EXAMPLE_TIMEOUT_S = 600
README_MAX_LINES = 200


@functools.cache
def _hooks():
    """docs/hooks.py as a module (it imports nothing from MkDocs at the top)."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def _flat_keys(data: dict, prefix: str = "") -> list[str]:
    """Every key of a loaded YAML mapping, nested ones dotted (``defaults`` left out)."""
    keys = []
    for key, value in data.items():
        if not prefix and key == "defaults":
            continue
        keys.append(prefix + key)
        if isinstance(value, dict) and value:
            keys += _flat_keys(value, f"{prefix}{key}.")
    return keys


YAMLS = sorted(p.relative_to(ROOT / "configs") for p in (ROOT / "configs").rglob("*.yaml"))


@pytest.mark.parametrize("path", YAMLS, ids=str)
def test_every_config_key_is_in_the_reference_with_its_comment(path):
    hooks = _hooks()
    text = (ROOT / "configs" / path).read_text()
    knobs = {k.key: k for k in hooks.knobs(text)}
    keys = _flat_keys(yaml.safe_load(text) or {})
    assert keys, path
    assert sorted(knobs) == sorted(keys), f"{path}: the parser and YAML disagree"
    undocumented = [key for key in keys if not knobs[key].doc]
    assert not undocumented, f"{path}: keys without a comment: {undocumented}"
    reference = hooks.config_reference()
    heading = "### `" + f"{path.parent}={path.stem}`" if str(path.parent) != "." else None
    section = reference.split(heading, 1)[1] if heading else reference
    for key in keys:
        assert f"| `{key}` |" in section, f"{path}: {key} missing from the reference"


def test_the_reference_parser_reads_nested_keys_and_continued_comments():
    knobs = _hooks().knobs(
        "# header\ndefaults:\n  - ppo\n  - _self_\n"
        "a: 1      # first\n          #   more\nb:        # a mapping\n  c: x    # nested\n"
    )
    assert [(k.key, k.default, k.doc) for k in knobs] == [
        ("a", "1", "first more"),
        ("b", "", "a mapping"),
        ("b.c", "x", "nested"),
    ]


def test_the_api_source_maps_the_folders_that_install_under_rltrans():
    text = (ROOT / "pyproject.toml").read_text()
    mapped = dict(re.findall(r'"rltrans\.(\w+)" = "(\w+)"', text))
    assert mapped == _hooks().MAPPED


def _pages_with_examples() -> list[Path]:
    pages = [README, *DOCS.rglob("*.md")]  # the README's examples run as written too
    return sorted(p for p in pages if MARKED.search(p.read_text()))


@pytest.mark.docs
@pytest.mark.parametrize("page", _pages_with_examples(), ids=lambda p: str(p.relative_to(ROOT)))
def test_a_pages_marked_examples_run_as_written(page, tmp_path):
    bin_dir = tmp_path / ".bin"
    bin_dir.mkdir()
    shim = bin_dir / "python"  # a script, not a link: a venv's python finds its venv by its path
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    shim.chmod(0o755)
    env = {
        **os.environ,
        "PATH": os.pathsep.join(
            [str(bin_dir), str(Path(sys.executable).parent), os.environ["PATH"]]
        ),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")])),
        "MINARI_DATASETS_PATH": str(tmp_path / "minari"),
        "OMP_NUM_THREADS": "1",
    }
    for i, match in enumerate(MARKED.finditer(page.read_text())):
        body, lang = match["body"], match["lang"]
        if match["file"]:
            (tmp_path / match["file"]).write_text(body)
            continue
        if lang == "bash":
            command = ["bash", "-euo", "pipefail", "-c", body]
        elif lang == "python":
            script = tmp_path / f".example_{i}.py"
            script.write_text(body)
            command = [sys.executable, str(script)]
        else:
            raise AssertionError(f"{page}: a runnable block must be bash or python, not {lang}")
        done = subprocess.run(
            command,
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=EXAMPLE_TIMEOUT_S,
        )
        assert done.returncode == 0, f"{page} example {i}:\n{body}\n{done.stdout}\n{done.stderr}"


def test_the_readme_is_a_front_door():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"


def test_the_readmes_links_resolve():
    text = README.read_text()
    for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
        if "://" in target or target.startswith("mailto:"):
            continue
        assert (ROOT / target).exists(), f"README.md links to a missing {target}"


# Every README section that moved to the site, where it lives now and a phrase that carries
# its claim (the phrase must be on that page).
MOVED = {
    "Install": ("getting-started.md", "torch==2.13.0"),
    "Quickstart": ("getting-started.md", "python -m rltrans.train"),
    "Training: python -m rltrans.train": ("guides/train.md", "exits with code 2"),
    "Environments": ("guides/own-env.md", "env.wrappers"),
    "Evaluation: python -m rltrans.evaluate": ("guides/evaluate.md", "video=true"),
    "Offline: Decision Transformer and behaviour cloning": ("guides/offline.md", "dqn_replay"),
    "IMPALA: algo=impala": ("guides/impala.md", "torchrun"),
    "Universal Transformer with ACT": ("concepts/attention-core.md", "ut_act"),
    "Memory: how far back an agent remembers": ("concepts/memory.md", "agent.horizon"),
    "The memory suite: benchmarks/memory_suite.py": ("benchmarks/memory.md", "memory_suite.py"),
    "POPGym's own envs: memory_suite.py --suite popgym": ("benchmarks/memory.md", "--suite popgym"),
    "Speed": ("guides/speed.md", "torch_threads"),
    "Run folders, metrics, summary line": ("concepts/run-folder.md", "config.yaml"),
    "Learning curves: python -m rltrans.plot": ("guides/plot.md", "bootstrap"),
    "Reproducibility and safety": ("guides/resume-safety.md", "trust_env_code"),
    "Python API": ("guides/evaluate.md", "load_policy"),
    "Results": ("benchmarks/index.md", "RESULTS.md"),
}


@pytest.mark.parametrize("section", sorted(MOVED))
def test_a_section_that_left_the_readme_is_on_the_site(section):
    page, phrase = MOVED[section]
    assert phrase in (DOCS / page).read_text(), f"{section!r}: {phrase!r} not in docs/{page}"


# The built site (``mkdocs build --strict``, as CI builds it), read as a person's browser would.
RAW_ROLE = re.compile(r":(?:func|class|mod|meth|attr|data|exc|obj):(?:`|<code>)")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """The site built strict into a fresh folder (skipped without the ``docs`` extra)."""
    for module in ("mkdocs", "material", "mkdocstrings_handlers.python"):
        pytest.importorskip(
            module, reason='the site needs the docs extra: pip install -e ".[docs]"'
        )
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=EXAMPLE_TIMEOUT_S,
    )
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return out


def _page(site: Path, page: str) -> str:
    return (site / page / "index.html").read_text()


def _toc(html: str) -> list[tuple[str, str]]:
    """(anchor, label) of each entry of a page's table of contents."""
    nav = html[html.find("md-nav--secondary") : html.find('<div class="md-content"')]
    entries = re.findall(
        r'<a href="#([^"]+)" class="md-nav__link">\s*<span class="md-ellipsis">(.*?)</span>',
        nav,
        re.S,
    )
    return [(anchor, re.sub(r"<[^>]+>|\s+", "", label)) for anchor, label in entries]


def test_the_built_site_shows_no_raw_sphinx_role(site):
    raw = {
        str(page.relative_to(site)): len(RAW_ROLE.findall(page.read_text()))
        for page in site.rglob("*.html")
    }
    assert not {page: n for page, n in raw.items() if n}, "raw :role:`...` text on the site"
    # the roles became links: the core page links to the backbones page, by canonical path
    core = _page(site, "reference/api/core")
    assert 'class="autorefs autorefs-internal"' in core
    assert re.search(
        r'href="\.\./backbones/#rltrans\.backbones\.[\w.]+"', _page(site, "reference/api/agents")
    )


def test_runplan_is_documented_once(site):
    headings = [
        anchor
        for page in site.rglob("*.html")
        for anchor in re.findall(r'<h\d id="([\w.]*\bRunPlan)"', page.read_text())
    ]
    assert headings == ["rltrans.RunPlan"]


def test_the_toc_names_each_commands_main_in_full(site):
    toc = dict(_toc(_page(site, "reference/api/rltrans")))
    assert "main" not in toc.values(), toc
    for tool in ("train", "evaluate", "collect", "plot"):
        assert toc[f"rltrans.{tool}.main"] == f"rltrans.{tool}.main"


def _roles():
    """docs/sphinx_roles.py as a module (it needs Griffe, from the docs extra)."""
    pytest.importorskip(
        "griffe", reason='the API reference needs the docs extra: pip install -e ".[docs]"'
    )
    spec = importlib.util.spec_from_file_location("sphinx_roles", DOCS / "sphinx_roles.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_sphinx_role_becomes_a_cross_reference_and_a_stale_one_is_named():
    paths = {"RunPlan": "rltrans.config.plan.RunPlan", "rltrans.accel.Accel": "rltrans.accel.Accel"}
    text, stale = _roles().translate(
        "A :class:`RunPlan`, an :class:`~rltrans.accel.Accel`, :func:`rltrans.gone()`, "
        ":class:`torch.nn.Module`, :exc:`ValueError`, :meth:`missing`.",
        paths.get,
    )
    assert text == (
        'A <autoref identifier="rltrans.config.plan.RunPlan" optional><code>RunPlan</code>'
        '</autoref>, an <autoref identifier="rltrans.accel.Accel" optional><code>Accel</code>'
        "</autoref>, <code>rltrans.gone()</code>, <code>torch.nn.Module</code>, "
        "<code>ValueError</code>, <code>missing</code>."
    )
    assert stale == [":func:`rltrans.gone()`", ":meth:`missing`"]


def _diagram_sources() -> dict[str, str]:
    """Each Mermaid source on a page, by its page and line."""
    hooks = _hooks()
    found = {}
    for page in sorted(DOCS.rglob("*.md")):
        text = page.read_text()
        for match in hooks.MERMAID.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found[f"{page.relative_to(DOCS)}:{line}"] = match["source"]
    return found


def test_every_diagram_has_a_picture_of_its_source_and_no_picture_is_left_over():
    hooks = _hooks()
    sources = _diagram_sources()
    assert sources, "no Mermaid diagram found on the pages"
    drawn = hooks.pictures()
    undrawn = [where for where, source in sources.items() if hooks.source_hash(source) not in drawn]
    assert not undrawn, f"diagrams with no picture of their source; run {hooks.DRAW}: {undrawn}"
    wanted = {hooks.source_hash(source) for source in sources.values()}
    assert not set(drawn) - wanted, f"pictures of no diagram: {sorted(set(drawn) - wanted)}"
    assert len(drawn) == len(list(hooks.DIAGRAMS.glob("*.svg"))), "an SVG names no source"


def test_a_diagram_edited_without_drawing_it_again_stops_the_build():
    hooks = _hooks()
    drawn = {
        hooks.source_hash("flowchart LR\n    accTitle: a to b\n    a --> b\n"): "diagrams/x.svg"
    }
    page = "intro\n\n```mermaid\nflowchart LR\n    accTitle: a to b\n    a --> b\n```\n"
    assert hooks.with_pictures(page, "concepts/p.md", drawn) == (
        "intro\n\n[![a to b](../diagrams/x.svg){ .diagram }](../diagrams/x.svg)\n"
    )
    edited = page.replace("a --> b", "a --> c")
    with pytest.raises(ValueError, match=r"^docs/concepts/p\.md:3: .*render_diagrams\.py"):
        hooks.with_pictures(edited, "concepts/p.md", drawn)


def test_the_sites_diagrams_are_pictures_that_need_no_network(site):
    pages = {str(where).split(":")[0] for where in _diagram_sources()}
    for page in sorted(site.rglob("*.html")):
        text = page.read_text()
        assert 'class="mermaid"' not in text, f"{page}: a diagram left for Mermaid's script"
        assert not re.search(
            r"<(?:pre|code)[^>]*>\s*(?:flowchart|graph) (?:LR|RL|TB|BT|TD)", text
        ), page
    for source in pages:
        page = site / Path(source).with_suffix("") / "index.html"
        images = re.findall(
            r'<img alt="([^"]+)" class="diagram" src="([^"]+\.svg)"', page.read_text()
        )
        assert images, f"{source}: no diagram picture on its page"
        for alt, src in images:
            svg = (page.parent / src).resolve()
            assert svg.is_file() and site in svg.parents, f"{source}: {src} is not on the site"
            text = svg.read_text()
            assert alt != "diagram", f"{source}: a diagram without an accTitle (the alt text)"
            links = set(re.findall(r"https?://[^\s\"')]+", text)) - {"http://www.w3.org/2000/svg"}
            assert not links, f"{src} loads {links}"
            assert "<script" not in text and "<foreignObject" not in text, src


def test_the_builds_own_code_is_not_on_the_site(site):
    assert not sorted(site.rglob("*.py")), "Python files copied into the site"


def test_long_code_lines_wrap_inside_the_column(site):
    page = _page(site, "guides/own-env")
    css = re.search(r'<link rel="stylesheet" href="([^"]*extra\.css)"', page)
    assert css, "the site's own stylesheet is not linked"
    text = (site / "guides" / "own-env" / css[1]).resolve().read_text()
    rule = re.search(r"\.md-typeset pre > code \{([^}]*)\}", text)
    assert rule and "white-space: pre-wrap" in rule[1], "code blocks keep lines past the edge"
