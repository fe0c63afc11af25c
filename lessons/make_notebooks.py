"""Build the lesson notebooks from their sources: ``python lessons/make_notebooks.py``.

Each lesson's text and code live in ``lessons/sources/lNN_topic.py`` as a list of plain
strings, ``CELLS`` (ordinary diffs in review); a string that starts with ``%md`` is a
markdown cell, every other one a code cell.  This script writes ``lessons/NN_topic.ipynb``
from them without outputs and with stable cell ids, so regenerating gives no spurious diff.
``tests/test_lessons.py`` executes every notebook.  (Lessons 04, 07, 09, 10 and 11 were
written as notebooks directly and have no source here.)
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
        else:
            nb.cells.append(nbformat.v4.new_code_cell(text))
    for i, cell in enumerate(nb.cells):
        cell["id"] = f"cell-{i:02d}"
    return nb


def main():
    sys.path.insert(0, SOURCES)
    for path in sorted(glob.glob(os.path.join(SOURCES, "l[0-9]*.py"))):
        lesson = importlib.import_module(os.path.splitext(os.path.basename(path))[0])
        out = os.path.join(HERE, lesson.NOTEBOOK)
        nbformat.write(build(lesson.CELLS), out)
        print("wrote", os.path.relpath(out))


if __name__ == "__main__":
    main()
