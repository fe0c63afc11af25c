"""minipar's layers import each other without cycles: the import graph is a DAG.

A layer is a top-level module (``minipar/train.py`` is ``train``) or a subpackage
(everything under ``minipar/comm/`` is ``comm``); ``minipar/__init__.py`` is ``minipar``.
Every ``import`` statement of every file counts — inside functions too, since a deferred
import is still a dependency, only one that Python resolves later — in all its forms:
``import minipar.x.y``, ``from minipar.x import y``, ``from minipar import x`` and
relative imports.  A cycle (``train -> train_loop -> train``) means neither layer can be
read, tested or replaced without the other; the failure names each cycle and the lines
that make it.
"""
import ast
from collections import defaultdict
from pathlib import Path

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


def layer(name):
    """"minipar.comm.ring" -> "comm", "minipar.train" -> "train", "minipar" -> "minipar"."""
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


def layer_graph():
    """{layer: {imported layer: ["file:line", ...]}} without self-edges."""
    graph = defaultdict(lambda: defaultdict(list))
    for path in sorted(ROOT.rglob("*.py")):
        src = layer(module_name(path))
        for line, mod in imported_modules(path):
            where = f"{path.relative_to(ROOT.parent)}:{line}"
            if layer(mod) != src and where not in graph[src][layer(mod)]:
                graph[src][layer(mod)].append(where)
    return graph


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
