"""The package's floors hold: no import circles (imports inside functions count), the import
contract in ``.importlinter`` passes, and a package module imports another inside a function
only to keep an optional heavy dependency out of module import."""
import ast
import os
import subprocess
import sys

import grimp

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PACKAGE = os.path.join(ROOT, "tfsyncmodes")

# (importing module, imported module): in-function imports that are kept, each with its reason.
IN_FUNCTION_ALLOWED = {
    # tf_keras is an optional dependency: its loop is imported only when it is in use.
    ("tfsyncmodes.strategies.parameter_server", "tfsyncmodes.keras.legacy_async"),
}


def _cycles(graph) -> list:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in graph.find_modules_directly_imported_by(module):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == module:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10000))
    for module in sorted(graph.modules):
        if module not in index:
            visit(module)
    return out


def _in_function_imports() -> set:
    """(module, imported package module) for every import of the package inside a function."""
    found = set()
    for directory, _, files in os.walk(PACKAGE):
        for name in files:
            if not name.endswith(".py"):
                continue
            path = os.path.join(directory, name)
            module = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".").removesuffix(".__init__")
            tree = ast.parse(open(path, encoding="utf-8").read(), path)
            for function in ast.walk(tree):
                if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
                    continue
                for node in ast.walk(function):
                    if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("tfsyncmodes"):
                        found.add((module, node.module))
                    elif isinstance(node, ast.Import):
                        found.update((module, a.name) for a in node.names if a.name.startswith("tfsyncmodes"))
    return found


def test_no_import_circles_counting_imports_inside_functions():
    graph = grimp.build_graph("tfsyncmodes", include_external_packages=False)
    assert _cycles(graph) == []


def test_the_cycle_finder_finds_a_circle(tmp_path):
    """The check above can fail: a two-module circle made through a function-level import."""
    package = tmp_path / "circled"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("from circled import b\n")
    (package / "b.py").write_text("def f():\n    from circled import a\n")
    sys.path.insert(0, str(tmp_path))
    try:
        graph = grimp.build_graph("circled", include_external_packages=False)
        assert _cycles(graph) == [["circled.a", "circled.b"]]
    finally:
        sys.path.remove(str(tmp_path))


def test_the_import_contract_passes():
    lint = os.path.join(os.path.dirname(sys.executable), "lint-imports")
    result = subprocess.run([lint, "--config", os.path.join(ROOT, ".importlinter")], cwd=ROOT,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 kept, 0 broken" in result.stdout


def test_package_modules_are_imported_inside_functions_only_for_optional_dependencies():
    assert _in_function_imports() <= IN_FUNCTION_ALLOWED


def test_every_top_level_module_has_its_floor_in_the_contract():
    """A module left out of the layers would escape the contract."""
    text = open(os.path.join(ROOT, ".importlinter"), encoding="utf-8").read()
    named = set(text.replace("|", " ").replace(":", " ").split())
    top = {name[:-3] if name.endswith(".py") else name for name in os.listdir(PACKAGE)
           if (name.endswith(".py") and name != "__init__.py")
           or os.path.isfile(os.path.join(PACKAGE, name, "__init__.py"))}
    assert {f"tfsyncmodes.{t}" for t in top} - named == set()
