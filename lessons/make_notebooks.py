"""Build the lesson notebooks from their sources: ``python lessons/make_notebooks.py``.

Each lesson's text and code live in ``lessons/sources/lNN_topic.py`` as a list of plain
strings, ``CELLS`` (ordinary diffs in review); a string that starts with ``%md`` is a
markdown cell, every other one a code cell.  This script writes ``lessons/NN_topic.ipynb``
from them without outputs and with stable cell ids, so regenerating gives no spurious diff.

Exercises.  A code cell that starts with ``%exercise NAME`` is the learner's part: the
builder drops that line and tags the cell (``metadata.tags = ["exercise"]``,
``metadata.exercise = NAME``).  Its starting code must fail with a hint when the next
cell checks it (e.g. a function whose body is ``raise NotImplementedError("hint: ...")``);
the check cell compares the learner's version with the library's own function.  The
solution is ``lessons/solutions/NN_topic.py``: ``SOLUTIONS = {NAME: "code"}``.
``tests/test_lessons.py`` executes every notebook with the solutions put in the exercise
cells, checks that a blank exercise fails with its hint, and that this script rebuilds
the committed notebooks byte for byte.
"""
from __future__ import annotations

import glob
import importlib
import os
import sys

import nbformat

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCES = os.path.join(HERE, "sources")


def build(cells):
    nb = nbformat.v4.new_notebook()
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for text in cells:
        text = text.strip("\n")
        if text.startswith("%md"):
            nb.cells.append(nbformat.v4.new_markdown_cell(text[3:].strip("\n")))
        elif text.startswith("%exercise"):
            first, _, body = text.partition("\n")
            cell = nbformat.v4.new_code_cell(body.strip("\n"))
            cell.metadata["tags"] = ["exercise"]
            cell.metadata["exercise"] = first.split(None, 1)[1].strip()
            nb.cells.append(cell)
        else:
            nb.cells.append(nbformat.v4.new_code_cell(text))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def lessons():
    """(notebook file name, its built notebook) for every source."""
    sys.path.insert(0, SOURCES)
    for path in sorted(glob.glob(os.path.join(SOURCES, "l[0-9]*.py"))):
        lesson = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        yield lesson.NOTEBOOK, build(lesson.CELLS)


def main():
    for name, nb in lessons():
        out = os.path.join(HERE, name)
        nbformat.write(nb, out)
        print("wrote", os.path.relpath(out))


if __name__ == "__main__":
    main()
