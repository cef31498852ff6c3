"""No import circle among gpu-fence's modules: each module's imports, read with ``ast``, form a graph without cycles.

A circle makes the modules on it one unit that can only be read, tested and moved together, and makes what a
module holds depend on the order the others are first imported in. Every import counts: at the top, inside a
function, or under ``TYPE_CHECKING`` (a type a module names is still a module it needs). Importing a submodule
runs its package's ``__init__`` too; that implicit step is left out, since a package that re-exports its modules
is not a circle of theirs.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

from tests.fakes.processes import run_captured

REPO = Path(__file__).resolve().parents[1]
# Source folder → import name (pyproject.toml's [tool.setuptools.package-dir], and gpu_fence/ itself).
PACKAGES = {
    "gpu_fence": "gpu_fence",
    "webhook": "gpu_fence.webhook",
    "auditor": "gpu_fence.auditor",
    "chargeback": "gpu_fence.chargeback",
}


def module_files() -> dict[str, Path]:
    found = {}
    for folder, name in PACKAGES.items():
        for path in (REPO / folder).rglob("*.py"):
            parts = path.relative_to(REPO / folder).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join((name, *parts))] = path
    return found


def imports_of(module: str, path: Path, modules: set[str]) -> set[str]:
    """The gpu-fence modules ``module`` imports: a name imported from a package is that submodule when it is one."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                source = f"{base}.{node.module}" if node.module else base
            else:
                source = node.module or ""
            named = [f"{source}.{alias.name}" for alias in node.names]
            found.update(named)
            if not all(name in modules for name in named):  # a name of the module itself, not only its submodules
                found.add(source)
    return {name for name in found if name in modules and name != module}


def import_graph() -> dict[str, set[str]]:
    files = module_files()
    return {module: imports_of(module, path, set(files)) for module, path in files.items()}


def cycle_in(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of ``graph`` as the modules on it (the first repeated at the end), or None."""
    done: set[str] = set()
    for root in sorted(graph):
        if root in done:
            continue
        path, on_path, stack = [root], {root}, [iter(sorted(graph[root]))]
        while stack:
            following = next(stack[-1], None)
            if following is None:
                finished = path.pop()
                on_path.discard(finished)
                done.add(finished)
                stack.pop()
                continue
            if following in on_path:
                return [*path[path.index(following) :], following]
            if following not in done:
                path.append(following)
                on_path.add(following)
                stack.append(iter(sorted(graph[following])))
    return None


def test_the_package_has_no_import_cycle() -> None:
    graph = import_graph()
    assert {"gpu_fence.webhook.policy", "gpu_fence.auditor.audit", "gpu_fence.chargeback.ledger"} <= set(graph)
    cycle = cycle_in(graph)
    assert cycle is None, "an import circle: " + " -> ".join(cycle or ())


def test_chargeback_and_the_auditor_meet_only_at_the_command_line() -> None:
    """Chargeback reads Prometheus, not the node: it imports nothing of the auditor, and the auditor imports it only
    to register its subcommand."""
    graph = import_graph()
    reaching = {
        (module, imported)
        for module, imports in graph.items()
        for imported in imports
        for a, b in (("gpu_fence.chargeback", "gpu_fence.auditor"), ("gpu_fence.auditor", "gpu_fence.chargeback"))
        if (module == a or module.startswith(a + ".")) and (imported == b or imported.startswith(b + "."))
    }
    assert reaching == {("gpu_fence.auditor.cli", "gpu_fence.chargeback")}


@pytest.mark.parametrize(
    ("graph", "expected"),
    [
        ({"a": {"b"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b", "c"}, "b": {"c"}, "c": set()}, None),
        ({"a": {"b"}, "b": {"c"}, "c": {"a"}}, ["a", "b", "c", "a"]),
        ({"a": set(), "b": {"c"}, "c": {"d"}, "d": {"c"}}, ["c", "d", "c"]),
    ],
)
def test_the_cycle_search_finds_cycles_and_only_cycles(graph: dict[str, set[str]], expected: list[str] | None) -> None:
    assert cycle_in(graph) == expected


def test_relative_and_submodule_imports_resolve(tmp_path: Path) -> None:
    """``from . import raw`` names the submodule (not its package), ``from .compute import X`` the module."""
    source = tmp_path / "devicemetrics.py"
    source.write_text("from . import raw\nfrom .compute import Bill\nfrom gpu_fence.metric_names import x\n")
    modules = {"p.raw", "p.compute", "p", "gpu_fence.metric_names", "p.devicemetrics"}
    assert imports_of("p.devicemetrics", source, modules) == {"p.raw", "p.compute", "gpu_fence.metric_names"}


def test_the_auditor_loads_no_part_of_the_bill_s_making() -> None:
    """Every ``gpu-fence-auditor`` process builds the chargeback subcommand's parser; the node's daemon must not
    carry Prometheus' client, the renderers and the rest of the bill's making for it (megabytes of RSS on every
    node). Checked in a fresh interpreter, after the imports ``run`` itself makes before its first cycle."""
    probe = (
        "import sys\n"
        "from gpu_fence.auditor import cli, daemon\n"
        "cli.build_parser()\n"
        "print('\\n'.join(sorted(name for name in sys.modules if name.startswith('gpu_fence.chargeback'))))\n"
    )
    result = run_captured([sys.executable, "-c", probe], timeout=120)
    assert result.returncode == 0, result.stderr
    loaded = set(result.stdout.split())
    assert "gpu_fence.chargeback.cli" in loaded  # the probe saw the subcommand registered
    making = {"make", "prometheus", "httpconfig", "raw", "recorded", "render", "html", "focus", "statement", "demo"}
    assert loaded.isdisjoint(f"gpu_fence.chargeback.{name}" for name in making), sorted(loaded)
