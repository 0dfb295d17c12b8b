"""The repository's modules as an import graph: the teaching file stands alone, and nothing imports in a circle."""
import ast
import os

from conftest import ROOT

MODULES = {f[:-3] for f in os.listdir(ROOT) if f.endswith(".py")}


def imports_of(module):
    """The repository's modules that module imports, at its top or inside a function alike."""
    with open(os.path.join(ROOT, module + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names & MODULES - {module}


def test_model_py_imports_nothing_of_ours():
    assert imports_of("model") == set()  # torch alone: what the course reads is all there is


def test_no_module_imports_in_a_circle():
    graph = {m: imports_of(m) for m in MODULES}
    done, path = set(), []

    def visit(module):
        assert module not in path, f"import circle: {' -> '.join(path[path.index(module):] + [module])}"
        if module in done:
            return
        path.append(module)
        for dep in sorted(graph[module]):
            visit(dep)
        path.pop()
        done.add(module)
    for module in sorted(graph):
        visit(module)


def test_the_graph_is_read_from_the_files(tmp_path):
    """The checker sees function-level imports too: hf.py's own import of checkpoint is in the graph."""
    assert "checkpoint" in imports_of("hf") and "model" in imports_of("fused_step")


def is_script(module):
    """A module run as a program: it has an `if __name__ == "__main__":` entry."""
    with open(os.path.join(ROOT, module + ".py"), encoding="utf-8") as f:
        tree = ast.parse(f.read())
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in tree.body)


SCRIPTS = {m for m in MODULES if is_script(m)}


def test_the_scripts_are_read_from_the_files():
    assert {"train", "sample", "serve", "trace", "export", "bench", "chat", "eval", "fsdp", "plot"} <= SCRIPTS
    assert not SCRIPTS & {"model", "checkpoint", "source", "generate", "tracing", "configurator"}


def test_no_module_imports_a_script():
    """Scripts are leaves: what a script shares with another script or a library lives in a library module,
    so importing anything runs nothing of a program."""
    found = sorted(f"{m} imports {s}" for m in MODULES for s in imports_of(m) & SCRIPTS)
    assert found == [], found
