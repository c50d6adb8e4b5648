"""Package layout, read from the source (every module, not a list of them):

* the client package (``triton_embed``) never imports the server package, at any depth,
  lazy imports inside functions included: a client-only install has none of the server's
  dependencies (transformers, vLLM, Triton's Python backend);
* no import cycle among the project's modules (lazy imports included, imports under
  ``if TYPE_CHECKING:`` aside, since they never run);
* at most :data:`MAX_LOOSE_MODULES` modules at the top of the server package, none of the
  project's modules over :data:`MAX_LINES` lines.

Each rule is also run on a small package written to a temporary folder, to show that it
fails when broken.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
#: Folders whose modules are the project's: (folder, its import root). perf and scripts are
#: imported as ``perf.x`` / ``scripts.x`` from the repository root.
SOURCE_ROOTS = (
    (REPO_ROOT / "client", REPO_ROOT / "client"),
    (REPO_ROOT / "server", REPO_ROOT / "server"),
    (REPO_ROOT / "perf", REPO_ROOT),
    (REPO_ROOT / "scripts", REPO_ROOT),
)
#: The limits of issue 21 ("rooms by job").
MAX_LOOSE_MODULES = 8
MAX_LINES = 500


def project_files(folder: Path) -> Iterator[Path]:
    """The ``.py`` files under ``folder`` that are the project's: not under a hidden folder
    (``perf/.infinity``, a peer's virtualenv) and not through a link (the stubs' links to the
    packages, ``model_repository/*/1/``)."""
    for path in sorted(folder.rglob("*.py")):
        inside = path.relative_to(folder).parts
        if any(part.startswith(".") for part in inside):
            continue
        if any(p.is_symlink() for p in (path, *path.parents) if p.is_relative_to(folder)):
            continue
        yield path


def modules(folder: Path, import_root: Path) -> dict[str, Path]:
    """Every ``.py`` file under ``folder`` by its dotted module name (relative to the root)."""
    found = {}
    for path in project_files(folder):
        parts = list(path.relative_to(import_root).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _under_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _import_nodes(tree: ast.AST) -> Iterator[ast.Import | ast.ImportFrom]:
    """Every import statement, at any depth, except the body of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        if isinstance(node, ast.If) and _under_type_checking(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def imported(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The modules that module ``name`` (file ``path``) imports, as dotted names.

    ``from a import b`` is the module ``a.b`` when that is a module of ``known``, else ``a``.
    """
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = set()
    for node in _import_nodes(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
            continue
        base = node.module or ""
        if node.level:
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            base = ".".join([*anchor, base] if base else anchor)
        for alias in node.names:
            full = f"{base}.{alias.name}"
            out.add(full if full in known else base)
    return out


def import_graph(roots) -> dict[str, set[str]]:
    """Module -> the project's modules it imports (edges outside the project left out)."""
    known: dict[str, Path] = {}
    for folder, import_root in roots:
        known.update(modules(folder, import_root))
    return {
        name: {m for m in imported(name, path, known) if m in known and m != name}
        for name, path in known.items()
    }


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(10_000, sys.getrecursionlimit()))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def server_imports(client_folder: Path) -> list[str]:
    """``file:line import`` for every import of ``triton_embed_server`` under the client."""
    found = []
    for path in modules(client_folder / "triton_embed", client_folder).values():
        for node in _import_nodes(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and not node.level:
                names = [node.module or ""]
            if any(n.split(".")[0] == "triton_embed_server" for n in names):
                found.append(f"{path.relative_to(client_folder)}:{node.lineno} {ast.unparse(node)}")
    return found


def loose_modules(package: Path) -> list[str]:
    """The modules at the top of ``package`` (``__init__``/``__main__`` aside)."""
    return sorted(
        p.name for p in package.glob("*.py") if p.name not in ("__init__.py", "__main__.py")
    )


def long_modules(folders, max_lines: int) -> list[str]:
    """``path: N lines`` for every module of ``folders`` longer than ``max_lines``."""
    long = []
    for folder in folders:
        for path in project_files(folder):
            lines = len(path.read_text().splitlines())
            if lines > max_lines:
                long.append(f"{path.relative_to(folder.parent)}: {lines} lines")
    return long


# ---- the rules on this repository ----------------------------------------------------------


def test_no_client_module_imports_the_server_package():
    assert server_imports(REPO_ROOT / "client") == []


def test_no_import_cycle_among_the_projects_modules():
    graph = import_graph(SOURCE_ROOTS)
    assert "triton_embed.cli" in graph and "triton_embed_server.gateway.app" in graph
    assert cycles(graph) == []


def test_the_server_package_has_few_loose_modules():
    assert len(loose_modules(REPO_ROOT / "server" / "triton_embed_server")) <= MAX_LOOSE_MODULES


def test_no_module_is_over_the_line_limit():
    folders = [REPO_ROOT / f for f in ("client", "server", "scripts", "model_repository")]
    assert long_modules(folders, MAX_LINES) == []


# ---- the rules fail when broken --------------------------------------------------------------


@pytest.fixture
def fake(tmp_path: Path):
    """Write ``{relative path: source}`` under ``tmp_path``; returns ``tmp_path``."""

    def write(files: dict[str, str]) -> Path:
        for rel, text in files.items():
            path = tmp_path / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        return tmp_path

    return write


def test_a_lazy_server_import_in_a_client_function_is_found(fake):
    root = fake(
        {
            "triton_embed/__init__.py": "",
            "triton_embed/deep/__init__.py": "",
            "triton_embed/deep/x.py": "def f():\n    from triton_embed_server.steps import y\n",
            "triton_embed/ok.py": "from triton_embed import deep\n",
        }
    )
    assert server_imports(root) == [
        "triton_embed/deep/x.py:2 from triton_embed_server.steps import y"
    ]


def test_a_lazy_cycle_is_found_and_a_type_checking_one_is_not(fake):
    root = fake(
        {
            "pkg/__init__.py": "",
            "pkg/a.py": "from pkg.b import g\n",
            "pkg/b.py": "def g():\n    from . import a\n",
            "pkg/c.py": "import typing\nif typing.TYPE_CHECKING:\n    from pkg import d\n",
            "pkg/d.py": "import pkg.c\n",
        }
    )
    assert cycles(import_graph([(root / "pkg", root)])) == [["pkg.a", "pkg.b"]]


def test_loose_and_long_modules_are_counted(fake):
    root = fake(
        {f"p/m{i}.py": "x = 1\n" * (3 if i else 7) for i in range(3)} | {"p/__init__.py": ""}
    )
    assert loose_modules(root / "p") == ["m0.py", "m1.py", "m2.py"]
    assert [line.split(": ")[1] for line in long_modules([root / "p"], 6)] == ["7 lines"]


# ---- at run time -------------------------------------------------------------------------------


def server_modules_after(code: str) -> list[str]:
    """Run ``code`` in a fresh interpreter on this checkout; the server modules it loaded."""
    probe = (
        f"{code}\n"
        "import json, sys\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] == 'triton_embed_server']\n"
        "print(json.dumps(sorted(loaded)))\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(
            [str(REPO_ROOT / "client"), str(REPO_ROOT / "server"), os.environ.get("PYTHONPATH", "")]
        ),
    }
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_importing_every_client_module_loads_no_server_module():
    names = sorted(modules(REPO_ROOT / "client" / "triton_embed", REPO_ROOT / "client"))
    optional = {"triton_embed.bulk.ray_data", "triton_embed.bulk.ray_job"}  # need Ray
    code = "\n".join(f"import {n}" for n in names if n not in optional)
    assert server_modules_after(code) == []


def test_the_cli_finds_the_server_commands_by_entry_point():
    # The server package registers doctor, repository and gateway (pyproject.toml); the CLI
    # loads them from the entry-point group.
    from triton_embed.cli import build_parser

    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert list(sub.choices) == [
        "embed", "verify", "query", "rerank", "usage", "doctor", "gateway", "quantize",
        "repository",
    ]  # fmt: skip
    assert sub.choices["doctor"].get_default("run").__module__ == (
        "triton_embed_server.host.doctor.command"
    )
