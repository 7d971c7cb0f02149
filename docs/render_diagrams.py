"""Draw the pages' Mermaid diagrams as the SVG pictures the site shows (``docs/diagrams/``).

The site shows pictures rather than running Mermaid in the reader's browser, which would load
its script from a network. Run this after editing a diagram (the build stops on a diagram
whose picture was drawn from other source): it needs Mermaid's script and Chromium, neither
of which the site's build or CI needs::

    npm install --prefix /tmp/mermaid mermaid@11
    python docs/render_diagrams.py --mermaid /tmp/mermaid/node_modules/mermaid/dist/mermaid.min.js

Each picture is named after its page and place on it and starts with the hash of its source;
pictures no page draws any more are removed.
"""

from __future__ import annotations

import argparse
import html
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

DOCS = Path(__file__).resolve().parent
# SVG text, not HTML in the SVG: an <img> shows it in every browser, with Arial's widths
# (Liberation Sans has the same), so the boxes fit their labels where it is read.
CONFIG = {
    "startOnLoad": False,
    "theme": "default",
    "securityLevel": "strict",
    "htmlLabels": False,
    "flowchart": {"htmlLabels": False},
    "fontFamily": "Arial, 'Liberation Sans', Helvetica, sans-serif",
}
PAGE = """<!doctype html><html><head><meta charset="utf-8"><script src="mermaid.min.js"></script>
</head><body><pre id="out">pending</pre><script>
mermaid.initialize(CONFIG);
(async () => {
  const out = [];
  for (const [id, source] of SOURCES) {
    try { out.push((await mermaid.render(id, source)).svg); }
    catch (err) { out.push("error: " + err); }
  }
  document.getElementById("out").textContent = JSON.stringify(out);
})();
</script></body></html>"""


def hooks():
    """docs/hooks.py as a module: the fences, hashes and folder the build reads."""
    spec = importlib.util.spec_from_file_location("docs_hooks", DOCS / "hooks.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclass looks itself up there
    spec.loader.exec_module(module)
    return module


def diagrams(docs: Path = DOCS) -> dict[str, str]:
    """Each page's Mermaid sources, by the name of their picture (page and place on it)."""
    found = {}
    for page in sorted(docs.rglob("*.md")):
        for i, match in enumerate(hooks().MERMAID.finditer(page.read_text()), 1):
            stem = "-".join(page.relative_to(docs).with_suffix("").parts)
            found[f"{stem}-{i}"] = match["source"]
    return found


def render(sources: dict[str, str], mermaid_js: Path, chromium: str) -> dict[str, str]:
    """The SVG of each source, drawn by Mermaid in headless Chromium."""
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(mermaid_js, folder / "mermaid.min.js")
        page = PAGE.replace("CONFIG", json.dumps(CONFIG))
        page = page.replace("SOURCES", json.dumps(list(sources.items())))
        (folder / "draw.html").write_text(page)
        done = subprocess.run(
            [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={folder / 'profile'}", "--allow-file-access-from-files",
             "--virtual-time-budget=30000", "--dump-dom", (folder / "draw.html").as_uri()],
            capture_output=True, text=True, timeout=300, check=True,
        )  # fmt: skip
    out = re.search(r'<pre id="out">(.*?)</pre>', done.stdout, re.S)
    if out is None or out[1] == "pending":
        raise SystemExit("error: Mermaid drew nothing (is --mermaid its mermaid.min.js?)")
    svgs = dict(zip(sources, json.loads(html.unescape(out[1])), strict=True))
    failed = {name: svg for name, svg in svgs.items() if svg.startswith("error: ")}
    if failed:
        raise SystemExit("\n".join(f"error: {name}: {svg[7:]}" for name, svg in failed.items()))
    return svgs


def main(argv: list[str] | None = None) -> int:
    """Draw every page's diagrams into docs/diagrams/ and remove the pictures left over."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mermaid", type=Path, required=True, help="Mermaid's mermaid.min.js")
    parser.add_argument("--chromium", default="chromium", help="the Chromium to draw with")
    args = parser.parse_args(argv)
    sources = diagrams()
    out = hooks().DIAGRAMS
    out.mkdir(exist_ok=True)
    for name, svg in render(sources, args.mermaid, args.chromium).items():
        digest = hooks().source_hash(sources[name])
        note = f"<!-- mermaid source sha256:{digest} (docs/render_diagrams.py) -->\n"
        (out / f"{name}.svg").write_text(note + svg + "\n")
        print(f"docs/diagrams/{name}.svg")
    for old in sorted(set(out.glob("*.svg")) - {out / f"{name}.svg" for name in sources}):
        old.unlink()
        print(f"removed docs/diagrams/{old.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
