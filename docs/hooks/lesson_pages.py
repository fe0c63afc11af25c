"""The lessons as site pages: each notebook executed, with its outputs, at the sizes the tests use.

A committed notebook has no outputs, and its exercise cells are blanks that fail by design.
For the site each lesson runs as ``tests/test_lessons.py`` runs it — a fresh kernel in
``lessons/``, one BLAS thread, the solutions of ``lessons/solutions/NN_topic.py`` in its
exercise cells — but with matplotlib's inline backend, so every figure lands in the page.
The page then shows each exercise cell as the learner finds it (the blank, without output),
under a note that the outputs after it come from the solution.

Executing twenty lessons takes minutes, so an executed notebook is cached under
``.cache/lessons/`` keyed by a hash of everything its outputs depend on: the notebook, its
solutions, the lesson scripts beside it and minipar's sources.  A rebuild with
nothing changed executes nothing.

Parts that need what a build machine may lack (root and iproute2 for lesson 20's cluster, a
C++ compiler for lesson 11's emulator) say so in their output and skip.  Their outputs, as
recorded on a machine that had them, live in ``docs/hooks/recorded/NN_topic.json``; where a
build's own run skipped, the page shows the recorded outputs under a note that says where and
when they were recorded (``python docs/hooks/lesson_pages.py record NN`` writes the file from
this machine's run).

Nothing here imports MkDocs: the site's fast test (``tests/test_docs_site.py``) uses it too.
"""
from __future__ import annotations

import copy
import datetime
import glob
import hashlib
import importlib.util
import json
import os
import platform
import re
import shutil
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LESSONS = os.path.join(ROOT, "lessons")
CACHE = os.path.join(ROOT, ".cache", "lessons")
PAGES = os.path.join(CACHE, "pages")     # the notebooks as shown, at their site paths (lessons/NN_topic.ipynb)
RECORDED = os.path.join(os.path.dirname(os.path.abspath(__file__)), "recorded")
# What a lesson's outputs depend on, besides the notebook and its solutions (globs under ROOT).
INPUTS = ["lessons/*.py", "lessons/sources/launch.py", "minipar/**/*.py", "minipar/**/*.cu",
          "minipar/**/*.cuh", "minipar/**/*.h", "minipar/**/*.json"]
CELL_TIMEOUT_S = 900


def lesson_notebooks():
    """The lesson notebooks, ``lessons/NN_topic.ipynb``, in order (found by glob, so a new
    lesson gets a page without touching the site)."""
    return sorted(os.path.basename(p) for p in glob.glob(os.path.join(LESSONS, "[0-9][0-9]_*.ipynb")))


def lesson_title(name):
    """``NN · <the notebook's first heading>``: the lesson's name in the site's navigation."""
    with open(os.path.join(LESSONS, name), encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    for cell in cells:
        if cell["cell_type"] == "markdown":
            for line in "".join(cell["source"]).splitlines():
                if line.startswith("# "):
                    heading = re.sub(rf"^(lesson\s+)?{name[:2]}\s*[·:.—–-]*\s*", "", line[2:].strip(), flags=re.I)
                    return f"{name[:2]} · {heading}"
    return name[:-len(".ipynb")].replace("_", " ")


def _solved():
    """``lessons/solved.py`` (the solutions and the course folder), loaded by its path."""
    spec = importlib.util.spec_from_file_location("lessons_solved", os.path.join(LESSONS, "solved.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def solutions(name):
    """{exercise name: solution code} from ``lessons/solutions/NN_topic.py`` (empty if none)."""
    return _solved().solutions(name)


def exercise_name(cell):
    """The exercise a cell is (``metadata.exercise``), or None for an ordinary cell."""
    if "exercise" in cell.get("metadata", {}).get("tags", []):
        return cell["metadata"].get("exercise")
    return None


def inputs_hash(name):
    """SHA-256 over the notebook, its solutions and every file in ``INPUTS``, with the
    Python version: a change to any of them executes the lesson again."""
    digest = hashlib.sha256(platform.python_version().encode())
    paths = [os.path.join(LESSONS, name), os.path.join(LESSONS, "solutions", name.replace(".ipynb", ".py"))]
    for pattern in INPUTS:
        paths += sorted(glob.glob(os.path.join(ROOT, pattern), recursive=True))
    for path in paths:
        if os.path.exists(path):
            digest.update(os.path.relpath(path, ROOT).encode())
            with open(path, "rb") as f:
                digest.update(hashlib.sha256(f.read()).digest())
    return digest.hexdigest()[:16]


def kernel_env():
    """The kernel's environment: the inline matplotlib backend (figures become outputs), one
    BLAS thread, and this checkout's minipar first on the path (the site documents the code
    beside it, even where another copy of minipar is installed)."""
    path = os.environ.get("PYTHONPATH")
    return {"MPLBACKEND": "module://matplotlib_inline.backend_inline", "OMP_NUM_THREADS": "1",
            "PYTHONPATH": ROOT + (os.pathsep + path if path else "")}


class LessonFailed(RuntimeError):
    """A lesson raised while executing with its solutions: the site would show a broken page."""


def execute(name, log=print):
    """The notebook executed with its solutions put in, from the cache when its inputs are
    unchanged; returns the path of the executed notebook (``.cache/lessons/NN_topic-HASH.ipynb``)."""
    import nbclient
    import nbformat
    os.makedirs(CACHE, exist_ok=True)
    cached = os.path.join(CACHE, f"{name[:-len('.ipynb')]}-{inputs_hash(name)}.ipynb")
    if os.path.exists(cached):
        return cached
    nb = nbformat.read(os.path.join(LESSONS, name), as_version=4)
    answers = solutions(name)
    for cell in nb.cells:
        key = exercise_name(cell)
        if key is not None:
            if key not in answers:
                raise LessonFailed(f"{name}: exercise {key!r} has no solution in lessons/solutions/")
            cell.source = answers[key].strip("\n")
    log(f"executing lessons/{name} (its inputs changed or it was never cached)")
    mine = tempfile.mkdtemp(prefix="minipar_course_")    # MINE as after every lesson: 12 composes them
    env = {**kernel_env(), "MINIPAR_MINE": _solved().course_folder(mine)}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)          # the kernel subprocess inherits os.environ
    try:
        nbclient.NotebookClient(nb, timeout=CELL_TIMEOUT_S, kernel_name="python3",
                                resources={"metadata": {"path": LESSONS}}).execute()
    except nbclient.exceptions.CellExecutionError as err:
        raise LessonFailed(f"lessons/{name} failed with its solutions in:\n{str(err)[-3000:]}") from None
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        shutil.rmtree(mine, ignore_errors=True)
    for stale in glob.glob(os.path.join(CACHE, f"{name[:-len('.ipynb')]}-*.ipynb")):
        os.remove(stale)
    nbformat.write(nb, cached + ".part")
    os.replace(cached + ".part", cached)
    return cached


def note_cell(title, text, kind="note"):
    """A markdown cell that renders as a Material admonition (plain HTML: notebooks' markdown
    has no admonition syntax)."""
    import nbformat
    return nbformat.v4.new_markdown_cell(
        f'<div class="admonition {kind}"><p class="admonition-title">{title}</p><p>{text}</p></div>')


def recorded(name):
    """The outputs recorded for this lesson on a machine that had what it needs, or None."""
    path = os.path.join(RECORDED, name.replace(".ipynb", ".json"))
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def lacks(nb, record):
    """Whether this run skipped what the recording had: the probe cell's output says so."""
    cell = next(c for c in nb.cells if c.get("id") == record["probe"]["cell"])
    text = "".join(o.get("text", "") for o in cell.get("outputs", []))
    return record["probe"]["lacking"] in text


def for_the_page(executed, name):
    """The executed notebook as the page shows it: each exercise cell back to its blank, with
    no output, under a note; and, where this machine skipped a part, the recorded outputs."""
    import nbformat
    nb = nbformat.read(executed, as_version=4)
    blank = {c.get("id"): c.source for c in nbformat.read(os.path.join(LESSONS, name), as_version=4).cells}
    record = recorded(name)
    substitute = record is not None and lacks(nb, record)
    cells = []
    for cell in nb.cells:
        key = exercise_name(cell)
        if key is not None:
            cells.append(note_cell(
                f"Exercise: <code>{key}</code>",
                "The cell below is as you find it. The outputs on this page come from running the "
                f"lesson with the solution (<code>lessons/solutions/{name.replace('.ipynb', '.py')}</code>) "
                "in its place; with the blank, the check after it fails with a hint.", "question"))
            cell.source = blank[cell.get("id")]
            cell.outputs = []
            cell.execution_count = None
        elif substitute and cell.get("id") in record["cells"]:
            cells.append(note_cell(
                "Outputs recorded elsewhere",
                f"This part needs {record['needs']}, which the machine that built this page lacked. "
                f"The outputs below were recorded on {record['machine']} on {record['date']}.", "info"))
            cell.outputs = [nbformat.from_dict(o) for o in record["cells"][cell.get("id")]["outputs"]]
        cells.append(cell)
    nb.cells = cells
    out = os.path.join(PAGES, "lessons", name)
    os.makedirs(os.path.dirname(out), exist_ok=True)
    nbformat.write(nb, out)
    return out


def figures(path):
    """How many figures (image outputs) an executed notebook holds."""
    with open(path, encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    return sum(1 for c in cells for o in c.get("outputs", []) if any(k.startswith("image/") for k in o.get("data", {})))


def record(number, probe_cell, lacking, needs, cells):
    """Write ``recorded/NN_topic.json`` from this machine's executed lesson: the outputs of
    ``cells``, shown by a build whose ``probe_cell`` printed ``lacking``."""
    import nbformat
    name = next(n for n in lesson_notebooks() if n.startswith(f"{number:02d}_"))
    by_id = {c.get("id"): c for c in nbformat.read(execute(name), as_version=4).cells}
    assert lacking not in "".join(o.get("text", "") for o in by_id[probe_cell]["outputs"]), \
        f"this machine lacks {needs}: it cannot record {name}"
    machine = (f"a {os.cpu_count()}-core {platform.machine()} {platform.system()} machine "
               f"(Python {platform.python_version()}, load average {os.getloadavg()[0]:.1f} when recorded)")
    data = {"needs": needs, "machine": machine, "date": datetime.date.today().isoformat(),
            "probe": {"cell": probe_cell, "lacking": lacking},
            "cells": {cid: {"outputs": by_id[cid]["outputs"]} for cid in cells}}
    os.makedirs(RECORDED, exist_ok=True)
    path = os.path.join(RECORDED, name.replace(".ipynb", ".json"))
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    print("wrote", os.path.relpath(path, ROOT))


if __name__ == "__main__":
    # python docs/hooks/lesson_pages.py record NN PROBE_CELL LACKING_TEXT NEEDS CELL [CELL ...]
    if len(sys.argv) < 7 or sys.argv[1] != "record":
        sys.exit(__doc__.split("\n\n")[0] + "\nusage: lesson_pages.py record NN PROBE_CELL LACKING_TEXT NEEDS CELL [CELL ...]")
    record(int(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5], sys.argv[6:])
