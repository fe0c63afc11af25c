"""The documentation site: every page in the navigation exists, every page is in it, every
internal link and anchor resolves, every lesson has a page — checked without MkDocs, in well
under a second — and, in the slow run, ``mkdocs build --strict`` itself (lessons executed).
"""
import glob
import importlib.util
import json
import os
import re
import subprocess
import sys
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
HOOKS = os.path.join(DOCS, "hooks")


def _module(name):
    spec = importlib.util.spec_from_file_location(f"docs_hooks_{name}", os.path.join(HOOKS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lesson_pages = _module("lesson_pages")
cli_reference = _module("cli_reference")
site_hook_text = open(os.path.join(HOOKS, "site.py"), encoding="utf-8").read()


def nav_pages():
    """The pages mkdocs.yml's nav names (its ``*.md`` entries, in order)."""
    text = open(os.path.join(ROOT, "mkdocs.yml"), encoding="utf-8").read()
    nav = re.search(r"^nav:\n((?:[ \t]+.*\n?|\n)*)", text, re.M)
    assert nav, "mkdocs.yml has no nav"
    return re.findall(r"([\w./-]+\.md)\b", re.sub(r"#.*", "", nav.group(1)))


def markdown_pages():
    """{site path: markdown text} of every hand-written page, lessons/index.md with the
    lessons' README that it shows."""
    pages = {}
    for path in glob.glob(os.path.join(DOCS, "**", "*.md"), recursive=True):
        rel = os.path.relpath(path, DOCS).replace(os.sep, "/")
        if not rel.startswith("hooks/"):
            pages[rel] = open(path, encoding="utf-8").read()
    readme = open(os.path.join(ROOT, "lessons", "README.md"), encoding="utf-8").read()
    pages["lessons/index.md"] = pages.get("lessons/index.md", "") + "\n" + readme
    return pages


def lesson_page_paths():
    return {f"lessons/{name}" for name in lesson_pages.lesson_notebooks()}


def slug(heading):
    """Python-Markdown's toc anchor of a heading's text (inline code and links as their text)."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).replace("`", "")
    text = re.sub(r"<[^>]+>", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def without_code(markdown):
    """The text outside fenced code blocks and inline code spans."""
    markdown = re.sub(r"^(```|~~~).*?^\1", "", markdown, flags=re.M | re.S)
    return re.sub(r"`[^`\n]*`", "", markdown)


def anchors(markdown):
    """The anchors a page defines: its headings' slugs and explicit ``{ #id }`` ones."""
    found = set()
    for line in without_code(markdown).splitlines():
        heading = re.match(r"#{1,6}\s+(.*?)\s*(?:\{\s*#([\w-]+)\s*\})?\s*$", line)
        if heading:
            found.add(heading.group(2) or slug(heading.group(1)))
    return found


def links(markdown):
    """The relative link targets of a page (external ones, ``http:``, ``mailto:``, left out)."""
    targets = re.findall(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)", without_code(markdown))
    return [t for t in targets if not re.match(r"[a-z]+:", t)]


def test_every_nav_page_exists_and_every_page_is_in_the_nav():
    named = nav_pages()
    assert "lessons/index.md" in named and "cli.md" in named, f"nav lacks the lessons or the CLI page: {named}"
    missing = [p for p in named if not os.path.exists(os.path.join(DOCS, p))]
    assert not missing, f"mkdocs.yml's nav names pages docs/ does not have: {missing}"
    repeated = sorted({p for p in named if named.count(p) > 1})
    assert not repeated, f"pages named twice in the nav: {repeated}"
    left_out = sorted(set(markdown_pages()) - set(named))
    assert not left_out, f"pages in docs/ that mkdocs.yml's nav leaves out: {left_out}"
    assert cli_reference.MARKER in open(os.path.join(DOCS, "cli.md"), encoding="utf-8").read(), \
        "docs/cli.md lost the marker where the build writes every command's --help"


def test_every_internal_link_and_anchor_resolves():
    pages = markdown_pages()
    lessons = lesson_page_paths()
    broken = []
    for page, text in sorted(pages.items()):
        for target in links(text):
            path, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(os.path.dirname(page), path)).replace(os.sep, "/") if path else page
            if resolved in pages:
                if anchor and anchor not in anchors(pages[resolved]):
                    broken.append(f"{page}: {target} (no heading with that anchor)")
            elif resolved not in lessons and not os.path.isfile(os.path.join(DOCS, resolved)):
                broken.append(f"{page}: {target}")
    assert not broken, "links that lead nowhere on the site:\n" + "\n".join(broken)


def test_every_lesson_has_a_page():
    """Each notebook in lessons/ is a page (the hook adds every one the glob finds, in the
    nav's Lessons section), with a title, and the lessons' table links it."""
    notebooks = sorted(os.path.basename(p) for p in glob.glob(os.path.join(ROOT, "lessons", "*.ipynb")))
    assert notebooks and lesson_pages.lesson_notebooks() == notebooks, \
        f"notebooks the site would leave out: {sorted(set(notebooks) - set(lesson_pages.lesson_notebooks()))}"
    assert "lesson_pages.lesson_notebooks()" in site_hook_text and "LESSONS_SECTION" in site_hook_text
    readme = open(os.path.join(ROOT, "lessons", "README.md"), encoding="utf-8").read()
    unlisted = [n for n in notebooks if f"]({n})" not in readme]
    assert not unlisted, f"lessons/README.md (the site's lessons page) does not link {unlisted}"
    untitled = [n for n in notebooks if not lesson_pages.lesson_title(n).startswith(n[:2])]
    assert not untitled, f"lessons without an 'NN · title' for the nav: {untitled}"


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_mkdocs_build_strict(tmp_path):
    """The whole site builds with every warning an error (broken links, missing pages, a
    lesson that fails), each lesson page shows its outputs, and at least all but two show
    a figure."""
    pytest.importorskip("mkdocs")
    pytest.importorskip("mkdocs_jupyter")
    site = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
                          cwd=ROOT, capture_output=True, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.returncode == 0, proc.stderr[-5000:]
    names = lesson_pages.lesson_notebooks()
    pages = {n: (site / "lessons" / n[:-len(".ipynb")] / "index.html").read_text(encoding="utf-8") for n in names}
    with_figures = [n for n, html in pages.items() if re.search(r'<img[^>]+src="data:image/png;base64', html)]
    assert len(with_figures) >= len(names) - 2, f"lessons without a figure: {sorted(set(names) - set(with_figures))}"
    cli = (site / "cli" / "index.html").read_text(encoding="utf-8")
    assert "--sequence-parallel" in cli and "minipar cluster up" in cli, "the CLI page lacks train's or cluster's help"


def test_a_page_shows_blank_exercises_and_recorded_outputs_where_its_part_skipped(tmp_path, monkeypatch):
    """What a lesson page shows: the exercise cell as the learner finds it (no output) under a
    note, and where this machine's run skipped a part (its probe cell said so) the outputs
    recorded elsewhere, marked; a run that did not skip keeps its own outputs."""
    nbformat = pytest.importorskip("nbformat")
    lessons, recorded = tmp_path / "lessons", tmp_path / "recorded"
    lessons.mkdir(), recorded.mkdir()
    cells = [nbformat.v4.new_code_cell("print('probe')"), nbformat.v4.new_code_cell("raise NotImplementedError('hint')"),
             nbformat.v4.new_code_cell("if ok: measure()")]
    cells[1].metadata.update(tags=["exercise"], exercise="mine")
    for i, cell in enumerate(cells):
        cell["id"] = f"cell-{i:02d}"
    blank = nbformat.v4.new_notebook(cells=cells)
    nbformat.write(blank, lessons / "99_topic.ipynb")
    (recorded / "99_topic.json").write_text(json.dumps({
        "needs": "root", "machine": "a machine with root", "date": "2026-12-07",
        "probe": {"cell": "cell-00", "lacking": "no root"},
        "cells": {"cell-02": {"outputs": [{"output_type": "stream", "name": "stdout", "text": "measured 1.0 s\n"}]}}}))
    monkeypatch.setattr(lesson_pages, "LESSONS", str(lessons))
    monkeypatch.setattr(lesson_pages, "RECORDED", str(recorded))
    monkeypatch.setattr(lesson_pages, "CACHE", str(tmp_path / "cache"))

    def page(probe_says, solution_prints):
        executed = nbformat.from_dict(json.loads(json.dumps(blank)))
        executed.cells[0].outputs = [nbformat.v4.new_output("stream", name="stdout", text=probe_says)]
        executed.cells[1].source = "def mine(): return 1"
        executed.cells[1].outputs = [nbformat.v4.new_output("stream", name="stdout", text=solution_prints)]
        executed.cells[2].outputs = [nbformat.v4.new_output("stream", name="stdout", text="live 2.0 s\n")]
        path = tmp_path / "executed.ipynb"
        nbformat.write(executed, path)
        return nbformat.read(lesson_pages.for_the_page(str(path), "99_topic.ipynb"), as_version=4)

    skipped = page("no root: skipped\n", "solved\n")
    sources = [c.source for c in skipped.cells]
    exercise = sources.index("raise NotImplementedError('hint')")
    assert "Exercise" in sources[exercise - 1] and not skipped.cells[exercise].outputs
    measured = sources.index("if ok: measure()")
    assert "recorded on a machine with root on 2026-12-07" in sources[measured - 1]
    assert skipped.cells[measured].outputs[0]["text"] == "measured 1.0 s\n"
    live = page("a cluster can be built here\n", "solved\n")
    assert [c.outputs[0]["text"] for c in live.cells if c.source == "if ok: measure()"] == ["live 2.0 s\n"]
    assert not any("recorded" in c.source for c in live.cells)
