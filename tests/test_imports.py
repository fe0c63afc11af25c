"""minipar's import graph is a DAG: between its layers, and between the files of each package.

A layer is a top-level module (``minipar/sample.py`` is ``sample``) or a subpackage
(everything under ``minipar/comm/`` is ``comm``); ``minipar/__init__.py`` is ``minipar``.
One exception: a command — a module outside the command line that only the command line
(``minipar/cli/`` and ``minipar/__main__.py``) imports, such as ``minipar/comm/bench.py`` —
is a layer of its own (``comm.bench``).  Nothing in minipar depends on it, so no cycle can
pass through it, and the command may use a layer above its package's (``bench comm``
calibrates with ``perf/``, ``profile`` in ``observe/`` sets a run up with ``train/``)
without making the package (``comm``, which ``perf`` builds on; ``observe``, which
``train`` writes with) depend on that layer.

Inside each package the files form a DAG too: ``comm/transport.py`` must not import
``comm/collectives.py`` when the collectives are written on the transport.  A package's
``__init__.py`` is one of its files (``minipar.comm``): a file that imports a name the
package re-exports depends on all of it.  With the layers a DAG and each package's files
a DAG, the whole file graph is one: a cycle of files either stays inside one package or
passes through two layers.

Every ``import`` statement of every file counts — inside functions too, since a deferred
import is still a dependency, only one that Python resolves later — in all its forms:
``import minipar.x.y``, ``from minipar.x import y``, ``from minipar import x`` and
relative imports.  A cycle (``train -> train_loop -> train``) means neither side can be
read, tested or replaced without the other; the failure names each cycle and the lines
(file:line) that make it.
"""
import ast
from collections import defaultdict
from functools import lru_cache
from pathlib import Path

import pytest

import minipar

ROOT = Path(minipar.__file__).resolve().parent


def module_name(path):
    """minipar/comm/ring.py -> "minipar.comm.ring"; a package's __init__.py -> the package."""
    parts = ("minipar",) + path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def is_module(name):
    """Whether "minipar.a.b" is a file or a package under minipar/."""
    rel = Path(*name.split(".")[1:]) if "." in name else Path()
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def layer(name, commands=frozenset()):
    """"minipar.comm.ring" -> "comm", "minipar.train" -> "train", "minipar" -> "minipar";
    a module in ``commands`` -> itself ("minipar.comm.bench" -> "comm.bench")."""
    if name in commands:
        return name.split(".", 1)[1]
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else "minipar"


def imported_modules(path, text=None):
    """[(line, module name)] of every minipar module the file (or ``text`` as if it were
    that file) imports, anywhere in it."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text() if text is None else text, str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: "from ..x import y" inside minipar.a.b
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module
            for alias in node.names:  # "from minipar import comm" imports the module minipar.comm
                sub = f"{source}.{alias.name}"
                found.append((node.lineno, sub if is_module(sub) else source))
    return [(line, mod) for line, mod in found if mod == "minipar" or mod.startswith("minipar.")]


@lru_cache(maxsize=1)
def file_graph():
    """{module: {imported module: ["file:line", ...]}} of every file under minipar/,
    without self-edges (every module is a key, those that import nothing too)."""
    graph = {}
    for path in sorted(ROOT.rglob("*.py")):
        src = module_name(path)
        edges = graph.setdefault(src, {})
        for line, mod in imported_modules(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if mod != src and where not in edges.setdefault(mod, []):
                edges[mod].append(where)
    return graph


def is_cli(name):
    """Whether module ``name`` is the command line: ``minipar/__main__.py`` or ``minipar/cli/``."""
    return name in ("minipar.__main__", "minipar.cli") or name.startswith("minipar.cli.")


def commands(graph):
    """The modules outside the command line that it imports and no other minipar module does."""
    importers = defaultdict(set)
    for src, edges in graph.items():
        for mod in edges:
            importers[mod].add(src)
    return frozenset(mod for mod, srcs in importers.items()
                     if not is_cli(mod) and all(is_cli(src) for src in srcs))


def layer_graph():
    """{layer: {imported layer: ["file:line", ...]}} without self-edges."""
    files = file_graph()
    cli = commands(files)
    graph = defaultdict(lambda: defaultdict(list))
    for src, edges in files.items():
        for mod, lines in edges.items():
            a, b = layer(src, cli), layer(mod, cli)
            if a != b:
                graph[a][b] += [where for where in lines if where not in graph[a][b]]
    return graph


def package_graph(package, graph=None):
    """The part of the file graph (``graph``, by default minipar's) inside
    ``minipar.<package>``: its files, its subpackages' and its ``__init__``'s."""
    graph = file_graph() if graph is None else graph
    name = f"minipar.{package}"
    inside = {m for m in graph if m == name or m.startswith(name + ".")}
    return {m: {n: lines for n, lines in graph[m].items() if n in inside} for m in inside}


PACKAGES = sorted(path.parent.name for path in ROOT.glob("*/__init__.py"))
# packages whose files import each other in cycles today; each one's test is expected to
# fail (strict: it fails as soon as the package is a DAG, so the entry must go)
CYCLIC = {"autograd": "tensor <-> engine, function, ops: the Tensor's methods call the ops",
          "data": "data/__init__ <-> data/tokens",
          "kernels": "fused_cpu <-> fused_cpu_llama"}


def cycles(graph, limit=50):
    """The elementary cycles, each as [a, b, ..., a], starting from its smallest layer."""
    found = []

    def walk(start, node, path):
        for nxt in sorted(graph.get(node, ())):
            if nxt == start:
                found.append(path + [start])
            elif nxt > start and nxt not in path and len(found) < limit:
                walk(start, nxt, path + [nxt])

    for start in sorted(graph):
        walk(start, start, [start])
    return found


def describe(graph, found):
    lines = []
    for cycle in found:
        lines.append(" -> ".join(cycle))
        for a, b in zip(cycle, cycle[1:]):
            lines.append(f"    {a} -> {b}: " + ", ".join(graph[a][b]))
    return "\n".join(lines)


def test_the_checker_finds_a_cycle_and_accepts_a_dag():
    dag = {"train": {"nn": ["x"], "autograd": ["x"]}, "nn": {"autograd": ["x"]}}
    assert cycles(dag) == []
    cyclic = {"train": {"train_loop": ["a"]}, "train_loop": {"train": ["b"], "nn": ["c"]}, "nn": {}}
    assert cycles(cyclic) == [["train", "train_loop", "train"]]
    assert layer("minipar.comm.ring") == "comm" and layer("minipar.train") == "train"
    assert layer("minipar.comm.bench", {"minipar.comm.bench"}) == "comm.bench"


def test_a_package_graph_keeps_its_own_files_and_commands_are_what_only_the_cli_imports():
    files = {"minipar.__main__": {"minipar.cli": ["m:1"]},
             "minipar.cli": {"minipar.comm.bench": ["c:2"], "minipar.cli.run_config": ["c:3"]},
             "minipar.cli.run_config": {},     # the command line's own file: not a command
             "minipar.comm": {"minipar.comm.ring": ["c:1"]},
             "minipar.comm.ring": {"minipar.comm.exchange": ["r:1"], "minipar.backend": ["r:2"]},
             "minipar.comm.exchange": {},
             "minipar.comm.bench": {"minipar.comm": ["b:1"], "minipar.perf.calibrate_links": ["b:2"]},
             "minipar.communicate": {"minipar.comm.ring": ["x:1"]}}
    assert package_graph("comm", files) == {
        "minipar.comm": {"minipar.comm.ring": ["c:1"]},
        "minipar.comm.ring": {"minipar.comm.exchange": ["r:1"]},
        "minipar.comm.exchange": {},
        "minipar.comm.bench": {"minipar.comm": ["b:1"]}}
    assert commands(files) == {"minipar.comm.bench"}
    assert {"minipar.comm.bench", "minipar.observe.profiler"} <= commands(file_graph())


def test_every_form_of_import_is_resolved():
    text = ("from ...backend import xp\nfrom . import schedules\nimport numpy\n"
            "def f():\n    import minipar.kernels.dense\n    from minipar import backend, __version__\n")
    found = imported_modules(ROOT / "parallel" / "pipeline" / "example.py", text)
    assert found == [(1, "minipar.backend"), (2, "minipar.parallel.pipeline.schedules"),
                     (5, "minipar.kernels.dense"), (6, "minipar.backend"), (6, "minipar")]
    graph = layer_graph()
    assert "backend" in graph["autograd"]  # from minipar.backend import xp
    assert "process" in graph["minipar"]   # minipar/__init__.py's own import


def test_the_layers_form_a_dag():
    graph = layer_graph()
    found = cycles(graph)
    assert not found, "import cycles between minipar's layers:\n" + describe(graph, found)


@pytest.mark.parametrize("package", [
    pytest.param(p, marks=pytest.mark.xfail(strict=True, reason=f"known cycles: {CYCLIC[p]}"))
    if p in CYCLIC else p for p in PACKAGES])
def test_the_files_of_each_package_form_a_dag(package):
    graph = package_graph(package)
    found = cycles(graph)
    assert not found, f"import cycles between the files of minipar/{package}:\n" + \
        describe(graph, found)


def test_every_package_is_checked():
    assert {"cli", "comm", "nn", "observe", "perf", "parallel", "process", "train"} <= set(PACKAGES)
    assert set(CYCLIC) <= set(PACKAGES) and not {"comm", "nn", "perf"} & set(CYCLIC)
