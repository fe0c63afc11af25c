"""The lessons, solved: each exercise's solution, and a learner's course folder as it is
after every lesson.

The tools that execute the notebooks with their solutions put in — the test suite
(``tests/test_lessons.py``) and the documentation site (``docs/hooks/lesson_pages.py``) —
load this file by its path; it needs nothing but the standard library.

- ``solutions(notebook)``: ``{exercise name: solution code}`` from
  ``solutions/NN_topic.py`` (empty when the lesson has none).
- ``course_folder(path)``: ``path`` filled as ``MINE`` is once a learner has done every
  lesson — each solution that is a ``%%writefile {MINE}/name.py`` cell (or lesson 07's
  ``{WORK}/``), written there — so that a lesson that composes earlier lessons' files
  (lesson 12's capstone) runs on its own.
"""
import glob
import importlib.util
import os

LESSONS = os.path.dirname(os.path.abspath(__file__))


def solutions(notebook):
    """{exercise name: solution code} of ``notebook`` (a file name, NN_topic.ipynb)."""
    path = os.path.join(LESSONS, "solutions", os.path.basename(notebook).replace(".ipynb", ".py"))
    if not os.path.exists(path):
        return {}
    spec = importlib.util.spec_from_file_location("solutions_" + os.path.basename(notebook)[:2], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.SOLUTIONS


def course_folder(path):
    """``path`` (an existing folder) with every lesson's solved ``%%writefile`` files in it."""
    for notebook in sorted(glob.glob(os.path.join(LESSONS, "[0-9][0-9]_*.ipynb"))):
        for code in solutions(notebook).values():
            first, _, body = code.lstrip("\n").partition("\n")
            if first.startswith(("%%writefile {MINE}/", "%%writefile {WORK}/")):
                with open(os.path.join(str(path), first.rsplit("/", 1)[1]), "w") as f:
                    f.write(body)
    return path
