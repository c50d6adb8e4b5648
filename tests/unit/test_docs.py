"""README.md and docs/*.md against the code: metric catalogue, links, paths, tests, commands.

The metric catalogue (docs/operations.md, "Metric catalogue") must list exactly the metric
families the serving code registers, with their types. Every relative link must reach an
existing file (and heading), every repository path and test named in the docs must exist,
and every ``triton-embed`` flag shown must be one the CLI accepts.
"""

from __future__ import annotations

import argparse
import ast
import re
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
DOCS = [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").glob("*.md"))]
OPERATIONS = REPO_ROOT / "docs" / "operations.md"
SERVING_CODE = [REPO_ROOT / "server" / "triton_embed_server", REPO_ROOT / "model_repository"]
CATALOGUE_HEADING = "Metric catalogue"
# Calls that create a Prometheus family: pb_utils.MetricFamily(name=..., kind=...) and the
# StepMetrics helpers family(name, ..., kind=) / metric(name, ..., kind=) (default COUNTER).
REGISTER_CALLS = {"MetricFamily", "family", "metric"}
FAMILY = re.compile(r"triton_embed_[a-z0-9_]+")
# Top-level folders whose paths, when the docs name them, must exist in the checkout.
REPO_FOLDERS = ("scripts", "server", "client", "tests", "model_repository", "docs", "perf")
MAX_CELL_CHARS = 120

ids = [str(p.relative_to(REPO_ROOT)) for p in DOCS]


# ---- markdown helpers ---------------------------------------------------------------------


def split_fences(text: str) -> tuple[str, str]:
    """(prose, code): the text outside fenced code blocks, and the text inside them."""
    prose: list[str] = []
    code: list[str] = []
    inside = False
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            inside = not inside
            continue
        (code if inside else prose).append(line)
    return "\n".join(prose), "\n".join(code)


def inline_code(prose: str) -> list[str]:
    """The contents of the `inline code` spans of a text (a span may wrap across lines)."""
    return [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", prose)]


def links(prose: str) -> list[str]:
    """Targets of inline links and images, ``[text](target)``."""
    return re.findall(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)", prose)


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = heading.strip().lower().replace("`", "")
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """The anchors GitHub generates for the headings of a markdown file."""
    prose, _ = split_fences(path.read_text())
    seen: dict[str, int] = {}
    out = set()
    for line in prose.splitlines():
        m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return out


def table_rows(lines: list[str]) -> list[list[str]]:
    """Cells of the body rows of the markdown tables in ``lines`` (header and rule skipped)."""
    rows: list[list[str]] = []
    for line in lines:
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if all(re.fullmatch(r":?-{3,}:?", c) for c in cells):
            rows.pop()  # the header row above the rule
        else:
            rows.append(cells)
    return rows


# ---- metric catalogue ---------------------------------------------------------------------


def catalogue() -> dict[str, str]:
    """{family: type} from the table under the "Metric catalogue" heading of operations.md."""
    lines = OPERATIONS.read_text().splitlines()
    start = next(
        (i for i, line in enumerate(lines) if re.match(rf"#+\s+{CATALOGUE_HEADING}\s*$", line)),
        None,
    )
    assert start is not None, f"{OPERATIONS.name} has no '{CATALOGUE_HEADING}' heading"
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("#")), len(lines))
    out: dict[str, str] = {}
    for cells in table_rows(lines[start + 1 : end]):
        names = FAMILY.findall(cells[0])
        assert len(names) == 1, f"one family per catalogue row, got {cells[0]!r}"
        assert names[0] not in out, f"{names[0]} is listed twice"
        out[names[0]] = cells[1].lower()
    assert out, f"no table under '{CATALOGUE_HEADING}' in {OPERATIONS.name}"
    return out


def serving_sources() -> list[Path]:
    return sorted(p for folder in SERVING_CODE for p in folder.rglob("*.py"))


def callee_name(call: ast.Call) -> str | None:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    if isinstance(func, ast.Name):
        return func.id
    return None


def registered_families() -> dict[str, str]:
    """{family: COUNTER | GAUGE | HISTOGRAM} of every registration call in the serving code."""
    out: dict[str, str] = {}
    for path in serving_sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.Call) or callee_name(node) not in REGISTER_CALLS:
                continue
            keywords = {k.arg: k.value for k in node.keywords}
            name = node.args[0] if node.args else keywords.get("name")
            if not (isinstance(name, ast.Constant) and isinstance(name.value, str)):
                continue
            if not FAMILY.fullmatch(name.value):
                continue
            kind = keywords.get("kind")
            if kind is None:
                value = "COUNTER"
            elif isinstance(kind, ast.Constant):
                value = str(kind.value)
            elif isinstance(kind, ast.Attribute):
                value = kind.attr
            else:
                raise AssertionError(f"{path}:{node.lineno}: cannot read the kind of {name.value}")
            previous = out.setdefault(name.value, value.upper())
            assert previous == value.upper(), f"{name.value} registered as {previous} and {value}"
    return out


def family_literals() -> set[str]:
    """Every string literal in the serving code that is a whole ``triton_embed_*`` name."""
    found = set()
    for path in serving_sources():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                if FAMILY.fullmatch(node.value):
                    found.add(node.value)
    return found


def test_every_family_literal_is_seen_as_a_registration():
    """Guards the scanner below: a family created some other way would escape the check."""
    registered = registered_families()
    unseen = family_literals() - set(registered)
    assert registered, "no metric family registration found in the serving code"
    assert not unseen, (
        f"{sorted(unseen)} appear in the serving code but not as the name of a "
        f"{'/'.join(sorted(REGISTER_CALLS))} call; teach registered_families() the new call"
    )


def test_catalogue_lists_exactly_the_registered_families():
    documented = set(catalogue())
    registered = set(registered_families())
    undocumented, stale = sorted(registered - documented), sorted(documented - registered)
    assert not undocumented, f"registered, missing from docs/operations.md: {undocumented}"
    assert not stale, f"in docs/operations.md, not registered by the code: {stale}"


def test_catalogue_types_match_the_code():
    registered = registered_families()
    wrong = {
        name: (kind, registered[name].lower())
        for name, kind in catalogue().items()
        if name in registered and kind != registered[name].lower()
    }
    assert not wrong, f"catalogue type vs code: {wrong}"


def test_label_values_are_documented():
    from triton_embed_server.steps.metrics import FAILURE_REASONS, NUMA_EVENTS

    documented = set(inline_code(split_fences(OPERATIONS.read_text())[0]))
    missing = [v for v in (*FAILURE_REASONS, *NUMA_EVENTS) if v not in documented]
    assert not missing, f"label values missing from docs/operations.md: {missing}"


# ---- links, paths, tests, commands --------------------------------------------------------


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_relative_links_point_to_existing_files(doc: Path):
    prose, _ = split_fences(doc.read_text())
    broken = []
    for target in links(prose):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
            continue
        path_part, _, fragment = target.partition("#")
        dest = (doc.parent / path_part).resolve() if path_part else doc
        if not dest.exists():
            broken.append(f"{target} (no such file)")
        elif fragment and dest.suffix == ".md" and fragment not in anchors(dest):
            broken.append(f"{target} (no heading #{fragment} in {dest.name})")
    assert not broken, f"{doc.name}: broken links: {broken}"


def named_paths(text: str) -> set[str]:
    """Repository paths a document names (in code spans and code blocks)."""
    prose, code = split_fences(text)
    spans = [*inline_code(prose), code]
    pattern = re.compile(rf"(?<![\w./-])((?:{'|'.join(REPO_FOLDERS)})/[\w./*<>-]*)")
    out = set()
    for span in spans:
        for raw in pattern.findall(span):
            path = raw.split("::")[0].split("#")[0].rstrip(".,:;")
            if "<" in path or "*" in path:
                continue
            out.add(path)
    return out


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_named_repository_paths_exist(doc: Path):
    missing = sorted(p for p in named_paths(doc.read_text()) if not (REPO_ROOT / p).exists())
    assert not missing, f"{doc.name} names paths that do not exist: {missing}"


def defined_test_names() -> set[str]:
    names = set()
    for path in (REPO_ROOT / "tests").rglob("test_*.py"):
        names |= set(re.findall(r"^\s*(?:async\s+)?def (test_\w+)", path.read_text(), re.M))
    return names


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_named_tests_exist(doc: Path):
    prose, _ = split_fences(doc.read_text())
    functions = defined_test_names()
    files = {p.name for p in (REPO_ROOT / "tests").rglob("test_*.py")}
    missing = []
    for span in inline_code(prose):
        for token in re.findall(r"\btest_[\w*]+(?:\.py)?", span):
            if token.endswith(".py"):
                ok = token in files
            elif token.endswith("*"):
                ok = any(f.startswith(token[:-1]) for f in functions)
            else:
                ok = token in functions
            if not ok:
                missing.append(token)
    assert not missing, f"{doc.name} names tests that do not exist: {missing}"


def cli_options() -> dict[str, set[str]]:
    """{subcommand: its option strings} of ``triton-embed``."""
    from triton_embed.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {
        name: {s for action in p._actions for s in action.option_strings}
        for name, p in sub.choices.items()
    }


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_triton_embed_commands_use_real_subcommands_and_flags(doc: Path):
    prose, code = split_fences(doc.read_text())
    options = cli_options()
    wrong = []
    for chunk in [*inline_code(prose), *code.splitlines()]:
        m = re.search(r"\btriton-embed\s+([a-z]+)(.*)", chunk)
        if not m:
            continue
        sub, rest = m.group(1), m.group(2).split(" #")[0]
        if sub not in options:
            wrong.append(f"triton-embed {sub}")
            continue
        wrong += [f"triton-embed {sub} {f}" for f in re.findall(r"(?<!\S)(--?[a-z][\w-]*)", rest)
                  if f not in options[sub]]  # fmt: skip
    assert not wrong, f"{doc.name}: not accepted by the CLI: {wrong}"


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_table_cells_are_short(doc: Path):
    prose, _ = split_fences(doc.read_text())
    long_cells = [
        c for row in table_rows(prose.splitlines()) for c in row if len(c) > MAX_CELL_CHARS
    ]
    assert not long_cells, f"{doc.name}: cells over {MAX_CELL_CHARS} characters: {long_cells}"


@pytest.mark.parametrize("doc", DOCS, ids=ids)
def test_sources_are_public(doc: Path):
    """Cite published articles, issues or commands, not private notes or 'seen here'."""
    text = doc.read_text()
    assert "shared/seeds" not in text and "seen here" not in text.lower(), doc.name
