"""The README and docs/ as a reader follows them: every link lands, every command exists.

Relative links (files, folders and ``#anchors``, with GitHub's heading slugs)
resolve inside the clone. Every ``ctxproxy ...`` (or ``python -m proxy ...``)
and ``make ...`` command shown in a code block or an inline code span names a
subcommand and flags the CLI's argparse parser has, and a target the Makefile
defines; a repository path it reads exists in a plain clone. The README's
config snippet is a config the proxy accepts.
"""

from __future__ import annotations

import argparse
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from proxy.__main__ import _parser
from proxy.config.loader import parse_config

REPO = Path(__file__).resolve().parents[1]

FENCE = re.compile(r"^(```|~~~)")
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
INLINE_CODE = re.compile(r"(`+)(.+?)\1")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
SHELL_LANGS = {"", "sh", "bash", "shell", "console", "shell-session"}


def doc_files(root: Path = REPO) -> list[Path]:
    return [root / "README.md", *sorted((root / "docs").rglob("*.md"))]


@dataclass(frozen=True)
class Block:
    lang: str
    lines: tuple[str, ...]


def split(text: str) -> tuple[list[str], list[Block]]:
    """The prose lines (code fences left out) and the fenced code blocks of a page."""
    prose: list[str] = []
    blocks: list[Block] = []
    lang: str | None = None
    body: list[str] = []
    for line in text.splitlines():
        if FENCE.match(line.strip()):
            if lang is None:
                lang = line.strip()[3:].strip().lower()
                body = []
            else:
                blocks.append(Block(lang, tuple(body)))
                lang = None
            continue
        (body if lang is not None else prose).append(line)
    return prose, blocks


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: markup dropped, lower case, punctuation out, spaces to -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link: its text
    text = text.replace("`", "").lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in ("L", "N", "M"))
    return kept.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    prose, _ = split(path.read_text())
    seen: dict[str, int] = {}
    found: set[str] = set()
    for line in prose:
        m = HEADING.match(line)
        if not m:
            continue
        base = slug(m.group(2))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


def links(path: Path) -> list[str]:
    prose, _ = split(path.read_text())
    out: list[str] = []
    for line in prose:
        out += REFERENCE.findall(line)  # [name]: target
        line = INLINE_CODE.sub("", line)
        out += LINK.findall(line)
    return out


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """``file: target (why)`` for every relative link that does not land."""
    problems: list[str] = []
    for path in files:
        for target in links(path):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, mailto:, ...
                continue
            where, _, anchor = target.partition("#")
            dest = (path.parent / where).resolve() if where else path
            name = f"{path.relative_to(root)}: {target}"
            if not dest.is_relative_to(root.resolve()):
                problems.append(f"{name} (outside the repository)")
            elif not dest.exists():
                problems.append(f"{name} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{name} (no heading with this anchor)")
    return problems


# -- commands --------------------------------------------------------------------


def commands(path: Path) -> list[str]:
    """Command lines shown in the page: shell code blocks and inline code spans."""
    prose, blocks = split(path.read_text())
    shown: list[str] = []
    for block in blocks:
        if block.lang not in SHELL_LANGS:
            continue
        for line in block.lines:
            line = line.strip()
            if block.lang in ("console", "shell-session"):
                if not line.startswith("$ "):
                    continue  # output
                line = line[2:]
            shown.append(line.rstrip("\\").strip())
    paragraphs = " ".join(line.strip() or "\n" for line in prose).split("\n")
    for paragraph in paragraphs:  # an inline span may wrap across lines
        shown += [m.group(2).strip() for m in INLINE_CODE.finditer(paragraph)]
    out: list[str] = []
    for line in shown:
        line = line.split(" #", 1)[0].strip()
        for part in re.split(r"\s(?:&&|\|\||\||;)\s", line):
            part = part.strip()
            if re.match(r"^(ctxproxy|\.venv/bin/ctxproxy|python -m proxy|make)(\s|$)", part):
                out.append(part)
    return out


def make_targets(root: Path = REPO) -> set[str]:
    text = (root / "Makefile").read_text()
    return set(re.findall(r"^([A-Za-z0-9_.-]+)\s*:(?!=)", text, re.M))


def subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def takes_value(parser: argparse.ArgumentParser, option: str) -> bool:
    return parser._option_string_actions[option].nargs != 0


def is_placeholder(token: str) -> bool:
    return token.isupper() or "..." in token or token.startswith("$")


def cli_problems(args: list[str], root: argparse.ArgumentParser) -> list[str]:
    """What in ``ctxproxy ARGS`` the parser does not have (placeholders like PATH pass)."""
    if args and args[0].startswith("-") and args[0] not in ("-h", "--help"):
        args = ["serve", *args]  # `ctxproxy --config PATH` is `ctxproxy serve --config PATH`
    parsers = [root]
    problems: list[str] = []
    skip = False
    chosen = False  # past the last subcommand level
    for token in args:
        if skip:
            skip = False
            continue
        token = token.strip("[]")
        if not token or token == "|":
            continue
        if token.startswith("-"):
            if not parsers:
                continue  # after a COMMAND placeholder: any command's options
            option = token.split("=", 1)[0]
            missing = [p.prog for p in parsers if option not in p._option_string_actions]
            if missing:
                problems.append(f"{option}: no such option of {', '.join(missing)}")
            else:
                skip = "=" not in token and takes_value(parsers[0], option)
            continue
        subs = subcommands(parsers[0]) if not chosen else {}
        if not subs:
            chosen = True
            continue  # a positional argument
        if is_placeholder(token):
            chosen = True  # `ctxproxy COMMAND --help`: any command
            parsers = []
            continue
        names = token.split("|")
        unknown = [n for n in names if n not in subs]
        if unknown:
            problems.append(f"{' '.join(unknown)}: no such command of {parsers[0].prog}")
            return problems
        parsers = [subs[n] for n in names]
    return problems


def file_arguments(args: list[str]) -> list[str]:
    """Arguments that are paths into the repository."""
    return [
        a
        for a in args
        if "/" in a
        and not a.startswith(("/", "$", "-"))
        and not re.match(r"^[a-z]+://", a)
        and not is_placeholder(a)
    ]


def command_problems(files: list[Path], root: Path = REPO) -> list[str]:
    targets = make_targets(root)
    parser = _parser()
    problems: list[str] = []
    for path in files:
        for command in commands(path):
            where = f"{path.relative_to(root)}: `{command}`"
            try:
                words = shlex.split(command)
            except ValueError as exc:
                problems.append(f"{where} ({exc})")
                continue
            if words[0] == "make":
                for target in words[1:]:
                    if "=" in target or target.startswith("-"):
                        continue
                    if target not in targets:
                        problems.append(f"{where} (no make target {target!r})")
                continue
            args = words[3:] if words[0] == "python" else words[1:]
            problems += [f"{where} ({p})" for p in cli_problems(args, parser)]
            for arg in file_arguments(args):
                if not (root / arg).exists():
                    problems.append(f"{where} ({arg} is not in the repository)")
    return problems


# -- the repository's own pages ---------------------------------------------------


def test_every_relative_link_in_the_readme_and_docs_lands():
    files = doc_files()
    assert len(files) > 10, files  # the docs/ tree is there
    assert broken_links(files) == []


def test_every_command_the_docs_show_exists():
    shown = [c for f in doc_files() for c in commands(f)]
    assert any(c.startswith("make serve") for c in shown)
    assert any(c.startswith(("ctxproxy replay", "python -m proxy replay")) for c in shown)
    assert command_problems(doc_files()) == []


def test_every_metric_and_command_has_its_reference_entry():
    source = "\n".join(p.read_text() for p in (REPO / "proxy").rglob("*.py"))
    metrics = set(re.findall(r'(?:Counter|Gauge|Histogram)\(\s*"(ctxproxy_\w+)"', source))
    assert len(metrics) > 20, metrics
    page = (REPO / "docs" / "reference" / "metrics.md").read_text()
    assert sorted(m for m in metrics if f"`{m}`" not in page) == []
    cli = (REPO / "docs" / "reference" / "cli.md").read_text()
    leaves = [
        f"ctxproxy {name} {action}".strip()
        for name, sub in subcommands(_parser()).items()
        for action in (subcommands(sub) or {"": sub})
    ]
    assert [c for c in leaves if f"`{c}" not in cli] == []


def test_the_readme_is_a_manual_s_front_page():
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 250
    for concept in ("Trim", "Summarize", "Recall", "Mask", "Store"):
        assert f"**{concept}**" in text


def test_no_page_points_at_the_development_data_folder():
    # ../shared is beside the project's development checkouts, not a user's clone.
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    assert [str(p.relative_to(REPO)) for p in pages if "../shared" in p.read_text()] == []


def test_the_readme_s_minimal_config_is_accepted(tmp_path):
    text = (REPO / "README.md").read_text()
    _, blocks = split(text.partition("## A minimal config")[2])
    data = yaml.safe_load("\n".join(next(b for b in blocks if b.lang == "yaml").lines))
    data["store"]["path"] = str(tmp_path / "ctxproxy.db")
    config = parse_config(data)
    assert [r.policy for r in config.routes] == ["support", "passthrough"]


# -- the checks themselves catch what they are for ----------------------------------


def write(root: Path, name: str, text: str) -> Path:
    path = root / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def test_a_broken_link_or_anchor_is_reported(tmp_path):
    write(tmp_path, "docs/guide.md", "# A guide\n\n## Second `part`: here\n\ntext\n")
    write(tmp_path, "docs/shot.png", "png")
    page = write(
        tmp_path,
        "README.md",
        "[ok](docs/guide.md) [ok](docs/guide.md#second-part-here) ![ok](docs/shot.png)\n"
        "[web](https://example.com/x) `[not a link](nowhere.md)`\n"
        "[gone](docs/missing.md) [bad anchor](docs/guide.md#third)\n"
        "[out](../elsewhere.md) [self](#nope)\n"
        "[ref]: docs/gone.md\n"
        "```\n[in code](ignored.md)\n```\n",
    )
    assert broken_links([page], tmp_path) == [
        "README.md: docs/missing.md (no such file)",
        "README.md: docs/guide.md#third (no heading with this anchor)",
        "README.md: ../elsewhere.md (outside the repository)",
        "README.md: #nope (no heading with this anchor)",
        "README.md: docs/gone.md (no such file)",
    ]


def test_slugs_follow_github_including_repeated_headings(tmp_path):
    page = write(
        tmp_path,
        "a.md",
        "# Start-up, logs and stopping\n## Measured: `bench/x.py`\n## Measured: `bench/x.py`\n",
    )
    assert anchors(page) == {
        "start-up-logs-and-stopping",
        "measured-benchxpy",
        "measured-benchxpy-1",
    }


def test_an_unknown_command_flag_or_target_is_reported(tmp_path):
    write(tmp_path, "Makefile", "VAR := 1\nserve: $(X)\n\tpython -m proxy\nbench:\n")
    page = write(
        tmp_path,
        "README.md",
        "```sh\nmake serve   # starts it\nmake deploy\nctxproxy serve --config PATH --port N\n"
        "ctxproxy --config PATH\nctxproxy sessions list|show --config C\n```\n"
        "```console\n$ ctxproxy check --config x.yaml --strict\nctxproxy output line --nope\n"
        "$ python -m proxy replay tests/data/absent.json --config c.yaml --policy p\n```\n"
        "Run `ctxproxy serv --config PATH` or `make bench UPGRADE=1`.\n",
    )
    assert command_problems([page], tmp_path) == [
        "README.md: `make deploy` (no make target 'deploy')",
        "README.md: `ctxproxy check --config x.yaml --strict` (--strict: no such option of ctxproxy check)",
        "README.md: `python -m proxy replay tests/data/absent.json --config c.yaml --policy p` "
        "(tests/data/absent.json is not in the repository)",
        "README.md: `ctxproxy serv --config PATH` (serv: no such command of ctxproxy)",
    ]


@pytest.mark.parametrize(
    ("command", "problem"),
    [
        ("sessions show demo --bogus", "--bogus: no such option of ctxproxy sessions show"),
        ("sessions list|wipe --db x", "wipe: no such command of ctxproxy sessions"),
        (
            "sessions list|show --json --tenant t",
            "--tenant: no such option of ctxproxy sessions show",
        ),
    ],
)
def test_the_cli_walk_names_what_the_parser_lacks(command, problem):
    assert cli_problems(command.split(), _parser()) == [problem]
