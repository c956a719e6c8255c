"""The docs stay true: the README's two commands, its links, and every ``trainguard`` command the docs show."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support.paths import ROOT
from trainguard.cli.app import app

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))


def _blocks(text: str) -> list[tuple[str, str]]:
    """The fenced code blocks of a page: ``(language, body)``."""
    blocks, language, body = [], None, []
    for line in text.splitlines():
        if line.startswith("```"):
            if language is None:
                language, body = line[3:].strip(), []
            else:
                blocks.append((language, "\n".join(body)))
                language = None
        elif language is not None:
            body.append(line)
    return blocks


def _commands(path: Path) -> list[str]:
    """Every ``trainguard …`` command in the page: shell code blocks (continuations joined) and inline code."""
    text = path.read_text()
    found = [m.strip() for m in re.findall(r"`trainguard ([^`]+)`", text)]
    for language, body in _blocks(text):
        if language not in ("", "bash", "sh", "console"):
            continue
        for line in body.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip()
            m = re.search(r"(?:^|\s|/)trainguard (\S.*)$", line)
            if m and "pip install" not in line:
                found.append(m[1])
    return found


def test_the_readme_gives_the_ci_test_command_and_the_demo() -> None:
    block = _blocks(README.read_text())[0][1]
    setup, tests = [line for line in block.splitlines() if line.strip()]
    assert setup.endswith("trainguard demo") and "pip install -e ./probe -e" in setup
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # CI runs exactly the README's test command: in its checkout, then in a plain clone with no ../shared.
    assert ci.count(tests) == 2
    assert "test ! -e ../shared" in ci


def test_links_from_the_readme_and_docs_resolve() -> None:
    for page in [README, *DOCS]:
        for target in re.findall(r"\]\(([^)#]+?)(?:#[^)]*)?\)", page.read_text()):
            if target.startswith(("http://", "https://", "mailto:")):
                continue
            assert (page.parent / target).exists(), f"{page.name} links to {target}, which does not exist"


@pytest.mark.parametrize("page", [README, *DOCS], ids=lambda p: p.name)
def test_every_documented_command_and_option_exists(page: Path) -> None:
    runner = CliRunner()
    for command in _commands(page):
        words = shlex.split(command.replace("[", " ").replace("]", " ").replace("|", " "))
        path = []
        for word in words:  # the command and sub-command: words before the first option or argument
            if word.startswith("-") or not re.fullmatch(r"[a-z][a-z-]*", word):
                break
            candidate = [*path, word]
            if runner.invoke(app, [*candidate, "--help"]).exit_code != 0:
                break
            path = candidate
        if not path and words and words[0].startswith("--"):  # an option of trainguard itself
            path = []
            shown = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}, terminal_width=200).output
            assert words[0] in shown, f"{page.name}: trainguard has no {words[0]}"
            continue
        assert path, f"{page.name}: `trainguard {command}` names no command"
        shown = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "200"}, terminal_width=200).output
        for option in re.findall(r"(?<![\w-])(--[a-z][a-z-]*)", command):
            assert option in shown, f"{page.name}: `trainguard {' '.join(path)}` has no {option}"
