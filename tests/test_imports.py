"""The repository's modules as an import graph: the programs at the top, one library package below them,
the teaching file standing alone, and nothing importing in a circle; and one home for each of a course's concepts."""
import ast
import os

from conftest import ROOT

PACKAGE = "nanogpt"
TOP = {"model", "configurator"}  # the course's model and the config parser: at the top, though not programs


def module_files():
    """{dotted module name: path} for the programs at the top and every module of the package."""
    found = {f[:-3]: os.path.join(ROOT, f) for f in os.listdir(ROOT) if f.endswith(".py")}
    for folder, _, files in os.walk(os.path.join(ROOT, PACKAGE)):
        dotted = os.path.relpath(folder, ROOT).replace(os.sep, ".")
        for f in files:
            if f.endswith(".py"):
                name = dotted if f == "__init__.py" else f"{dotted}.{f[:-3]}"
                found[name] = os.path.join(folder, f)
    return found


FILES = module_files()
MODULES = set(FILES)


def parse(module):
    with open(FILES[module], encoding="utf-8") as f:
        return ast.parse(f.read())


def imported_names(tree):
    """Every dotted name a module's import statements name, at its top or inside a function alike: `from
    nanogpt.cpu import kernels` names nanogpt.cpu and nanogpt.cpu.kernels."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            names |= {f"{node.module}.{alias.name}" for alias in node.names}
    return names


def imports_of(module):
    """The repository's modules that module imports: `from nanogpt.interop import hf` names nanogpt.interop.hf."""
    return {n for n in imported_names(parse(module)) if n in MODULES} - {module}


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


def test_the_graph_is_read_from_the_files():
    """The checker sees the package's modules and function-level imports: hf.py's own import of checkpoint
    is in the graph, and so is the fused step's import of the model at the top."""
    assert "nanogpt.checkpoint" in imports_of("nanogpt.interop.hf") and "model" in imports_of("nanogpt.cpu.fused_step")
    assert "nanogpt.cpu.kernels" in MODULES and "nanogpt.generate" in imports_of("sample")


def is_program(module):
    """A module run as a program: it has an `if __name__ == "__main__":` entry."""
    return any(isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
               and isinstance(node.test.left, ast.Name) and node.test.left.id == "__name__"
               for node in parse(module).body)


PROGRAMS = {m for m in MODULES if is_program(m)}


def test_the_programs_are_read_from_the_files():
    assert {"train", "sample", "serve", "trace", "export", "bench", "chat", "eval", "consolidate", "plot"} <= PROGRAMS
    assert not PROGRAMS & {"model", "configurator", "nanogpt.checkpoint", "nanogpt.source", "nanogpt.generate"}


def test_the_top_is_a_menu_of_programs():
    """Every module at the top is a program a user runs, or the course's model, or the config parser; the
    modules the programs share live in the package."""
    top = {m for m in MODULES if "." not in m and m != PACKAGE}
    assert sorted(top - PROGRAMS - TOP) == []


def test_the_package_holds_no_program():
    assert sorted(m for m in PROGRAMS if m.startswith(PACKAGE)) == []


def test_no_module_imports_a_program():
    """Programs are leaves: what a program shares with another program or a library lives in the package,
    so importing anything runs nothing of a program."""
    found = sorted(f"{m} imports {s}" for m in MODULES for s in imports_of(m) & PROGRAMS)
    assert found == [], found


def test_the_library_imports_no_root_file_but_the_course_model():
    """The package stands under the top: of the root's files it imports only model.py (the course's model it
    serves); configurator.py is an entrance to nanogpt.settings, which the library reads a recipe with."""
    found = sorted(f"{m} imports {s}" for m in MODULES if m.startswith(PACKAGE)
                   for s in imports_of(m) if "." not in s and s not in (PACKAGE, "model"))
    assert found == [], found
    assert "nanogpt.settings" in imports_of("configurator")
    assert "nanogpt.settings" in imports_of("nanogpt.training.notes")


def test_no_library_parses_a_command_line():
    """The package parses no argv: how a program starts and ends is nanogpt.program's, and the most a library
    takes from the settings is a recipe's assignments (read_config_file), to say what train.py would run."""
    found = []
    for m in MODULES:
        if m.startswith(PACKAGE) and m != "nanogpt.settings":
            for node in ast.walk(parse(m)):
                if isinstance(node, ast.ImportFrom) and node.module == "nanogpt.settings":
                    found += [f"{m}: {a.name}" for a in node.names if a.name != "read_config_file"]
    assert found == [], found


def test_the_library_imports_no_dataset_or_course():
    """The package serves every dataset and task, so none of it imports data/: the Tang course registers its
    rewards with nanogpt.rewards (data/tangshi/rewards.py), never the reverse."""
    found = sorted(f"{m} imports {n}" for m in MODULES if m.startswith(PACKAGE)
                   for n in imported_names(parse(m)) if n == "data" or n.startswith("data."))
    assert found == [], found


TANG_POEMS = os.path.join("data", "tangshi", "poems.py")
# the Tang task's concepts: the acrostic request, the 句 (the marks between them), the forms, the acrostic rule
TANG_NAMES = {"ACROSTIC", "CLAUSE_MARKS", "FORMS", "clauses", "score_acrostic"}
TANG_WORDS = ("藏頭詩：", "，", "。", "？", "！", "；", "絕句", "律詩")


def source_files():
    """The repository's Python files but the tests: the programs, the package, data/, tasks/ and config/."""
    found = sorted(f for f in os.listdir(ROOT) if f.endswith(".py"))
    for top in (PACKAGE, "data", "tasks", "config"):
        for folder, _, files in os.walk(os.path.join(ROOT, top)):
            found += sorted(os.path.relpath(os.path.join(folder, f), ROOT) for f in files if f.endswith(".py"))
    return found


def code_strings(tree):
    """The string constants of a module's code (f-strings' pieces too), not its docstrings."""
    docs = {id(node.body[0].value) for node in ast.walk(tree)
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body
            and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [node.value for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs]


def defined_names(tree):
    """The names a module defines at its top: functions, classes and assignments."""
    names = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names |= {n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return names


def test_only_data_tangshi_poems_defines_the_tang_task():
    """The acrostic request, the 句, the forms and the acrostic rule are written once, in data/tangshi/poems.py:
    rl.py's rewards (data/tangshi/rewards.py), evaluate.py and lm-eval's metric (tasks/acrostic.py) import them.
    A second copy, under its name or another (a string of the marks, the request's prefix), could drift from
    the first: a reward paying for one rule while the evaluation counts another."""
    found = []
    for path in source_files():
        with open(os.path.join(ROOT, path), encoding="utf-8") as f:
            tree = ast.parse(f.read())
        if path == TANG_POEMS:
            assert TANG_NAMES <= defined_names(tree), sorted(TANG_NAMES - defined_names(tree))
            continue
        found += [f"{path} defines {name}" for name in sorted(defined_names(tree) & TANG_NAMES)]
        found += [f"{path} writes {s!r}" for s in code_strings(tree) if any(w in s for w in TANG_WORDS)]
    assert found == [], found


def test_only_errors_suggests_a_nearest_name():
    """ "(did you mean 'x'?)" is written once, in nanogpt.errors.nearest: no other module imports difflib."""
    found = sorted(m for m in MODULES if "difflib" in {a.name for node in ast.walk(parse(m))
                                                       if isinstance(node, ast.Import) for a in node.names})
    assert found == ["nanogpt.errors"], found


def test_only_files_searches_for_a_folder_beside_the_repository():
    """A folder named as given, else beside the repository, is looked up by nanogpt.files.find_folder alone:
    no other module loops over candidate paths joined to REPOSITORY (datasets, chat bases, task folders)."""
    found = sorted(m for m in MODULES if m != "nanogpt.files" for node in ast.walk(parse(m))
                   if isinstance(node, ast.For) and "REPOSITORY" in ast.unparse(node.iter))
    assert found == [], found


def test_each_file_name_and_function_name_means_one_thing():
    """A trained BPE's ranks file is named once for a dataset (dataset.py) and once for an export (export.py),
    under names that say which; write_meta is the dataset's meta.json and meta.pkl alone."""
    constants = [(m, node.value) for m in MODULES for node in ast.walk(parse(m)) if isinstance(node, ast.Constant)]
    assert [m for m, v in constants if v == "tokenizer.bpe"] == ["nanogpt.dataset"]
    assert [m for m, v in constants if v == "ranks.tiktoken"] == ["export"]
    defined = sorted(m for m in MODULES for node in ast.walk(parse(m))
                     if isinstance(node, ast.FunctionDef) and node.name == "write_meta")
    assert defined == ["nanogpt.tokenizer"], defined


def test_the_device_and_dtype_keys_are_declared_once():
    """device and dtype are nanogpt.device's Device and Dtype, which the programs' configs inherit; trace.py and
    rl.py keep "cpu" as device's default by overriding it in their own class, saying why."""
    declared = {(m, node.name, st.target.id): [ast.unparse(b) for b in node.bases] for m in MODULES
                for node in ast.walk(parse(m)) if isinstance(node, ast.ClassDef) for st in node.body
                if isinstance(st, ast.AnnAssign) and getattr(st.target, "id", None) in ("device", "dtype")
                and ast.unparse(st.annotation) == "str"}
    assert sorted(declared) == [("nanogpt.device", "Device", "device"), ("nanogpt.device", "Dtype", "dtype"),
                                ("rl", "RLConfig", "device"), ("trace", "TraceConfig", "device")]
    assert "Device" in declared["rl", "RLConfig", "device"] and "Device" in declared["trace", "TraceConfig", "device"]


def test_only_the_chat_tokenizer_writes_the_chat_template():
    """The chat template has one home, nanogpt.tokenizer (ChatTokenizer and its rule table): no other module
    writes Jinja, names OpenAI's extra roles, or matches the role tokens' names in text (as serve.py once did);
    the Hugging Face export, GGUF and serve.py's /tokenizer_info ask ChatTokenizer.chat_template."""
    def writes_the_template(module):
        found = []
        for node in ast.walk(parse(module)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and (
                    "{%" in node.value or node.value == "developer"):
                found.append(f"{module}: {node.value[:30]!r}")
            elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "map"
                  and "attr='escape'" in ast.dump(node) and "attr='ids'" in ast.dump(node)):  # map(re.escape, tok.ids)
                found.append(f"{module}: a pattern of the role tokens' names")
        return found
    found = [f for m in sorted(MODULES - {"nanogpt.tokenizer"}) for f in writes_the_template(m)]
    assert found == [], found
    assert len(writes_the_template("nanogpt.tokenizer")) >= 3  # the checker sees the home's Jinja, roles and names


def test_training_and_interop_are_subsystems_a_reader_can_skip():
    """nanogpt/training (what train.py and rl.py share) and nanogpt/interop (Hugging Face and GGUF formats) are
    used from outside only by the programs and by the loaders that accept a Hugging Face directory; the rest of
    the library (generation, serving, checkpoints, tokenizers) imports neither."""
    found = []
    for m in sorted(MODULES):
        if not m.startswith(PACKAGE + "."):
            continue
        home = m.split(".")[1]
        for dep in sorted(imports_of(m)):
            group = dep.split(".")[1] if dep.count(".") >= 2 else None
            if group in ("training", "interop") and group != home:
                found.append(f"{m} imports {dep}")
    assert found == ["nanogpt.source imports nanogpt.interop.hf",
                     "nanogpt.training.startup imports nanogpt.interop.hf"], found
    assert {"nanogpt.training.optim", "nanogpt.interop.gguf_file"} <= MODULES
