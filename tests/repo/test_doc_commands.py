"""The commands the README and the docs show, read as a user pastes them: a command that
evaluates or resumes a run of a user's own env (``env.id=module:EnvId``) carries
``trust_env_code=true``, which such a run needs, and an offline training command names its
``train_steps`` (the default is the DT paper's 100,000 gradient steps: hours on a CPU)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
BASH = re.compile(r"^```(?:bash|sh|console)\n(?P<body>.*?)^```", re.S | re.M)


def commands(page: Path) -> list[str]:
    """The shell commands of a page's bash blocks, continuation lines joined, comments cut."""
    out = []
    for block in BASH.finditer(page.read_text()):
        body = block["body"].replace("\\\n", " ")
        for line in body.splitlines():
            line = re.sub(r"\s+#.*$", "", line).strip()
            if line.startswith("python -m rltrans."):
                out.append(line)
    return out


def _arg(command: str, key: str) -> str | None:
    found = re.search(rf"(?:^|\s){re.escape(key)}=(\S+)", command)
    return found[1].strip("'\"") if found else None


def test_the_pages_have_commands_to_check():
    assert sum(len(commands(p)) for p in PAGES) > 40
    readme = commands(ROOT / "README.md")
    assert any("env.id=my_pkg.envs:MyEnv-v0" in c for c in readme)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_a_run_of_a_users_env_is_evaluated_and_resumed_with_trust(page):
    """A train command with ``env.id=module:EnvId`` and a ``run_dir``: every later command of
    the page that reads that run (``checkpoint=``, ``resume=true run_dir=``) trusts its code."""
    own: set[str] = set()
    for command in commands(page):
        env_id, run_dir = _arg(command, "env.id"), _arg(command, "run_dir")
        reads = _arg(command, "checkpoint") or (
            run_dir if _arg(command, "resume") == "true" else None
        )
        # A placeholder (runs/<run>) after such a run may be read as that run: trust it too.
        placeholder = reads is not None and "<" in reads and bool(own)
        if placeholder or (reads and any(reads.rstrip("/").startswith(r) for r in own)):
            assert _arg(command, "trust_env_code") == "true", f"{page.name}: {command}"
        trains = command.startswith("python -m rltrans.train") and _arg(command, "resume") is None
        if trains and env_id and ":" in env_id:
            own.add(run_dir.rstrip("/") if run_dir else "<its default folder>")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_an_offline_training_command_names_its_budget(page):
    for command in commands(page):
        offline = re.search(r"\bagent=(dt|bc)\b", command) and "dataset=" in command
        if command.startswith("python -m rltrans.train") and offline:
            if _arg(command, "resume") == "true":
                continue
            assert _arg(command, "train_steps") is not None, f"{page.name}: {command}"
