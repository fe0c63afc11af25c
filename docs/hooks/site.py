"""MkDocs hook (``hooks:`` in mkdocs.yml): the pages the site builds from the code itself.

- The lessons: every ``lessons/NN_topic.ipynb`` becomes a page ``lessons/NN_topic/``,
  executed with its outputs (``lesson_pages.py``), listed in the navigation under
  "Lessons" after ``lessons/index.md``; mkdocs-jupyter renders the executed notebooks.
- ``lessons/index.md`` shows ``lessons/README.md`` (the lessons' one description and table).
- ``cli.md``'s marker becomes every command's ``--help`` (``cli_reference.py``).
"""
from __future__ import annotations

import logging
import os
import sys

from mkdocs.exceptions import PluginError
from mkdocs.plugins import event_priority
from mkdocs.structure.files import File

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import cli_reference   # noqa: E402
import lesson_pages    # noqa: E402

log = logging.getLogger("mkdocs.hooks.minipar")
LESSONS_SECTION = "Lessons"
README_MARKER = "<!-- lessons/README.md is shown here -->"


def on_config(config):
    """Every lesson notebook in the navigation, after the lessons' index page."""
    for entry in config.nav or []:
        if isinstance(entry, dict) and LESSONS_SECTION in entry:
            entry[LESSONS_SECTION] += [{lesson_pages.lesson_title(name): f"lessons/{name}"}
                                       for name in lesson_pages.lesson_notebooks()]
            return config
    raise PluginError(f"mkdocs.yml's nav has no {LESSONS_SECTION!r} section for the lessons")


@event_priority(100)      # before mkdocs-jupyter's on_files, which claims every .ipynb page
def on_files(files, config):
    """Each lesson executed (or taken from the cache) and added as the page ``lessons/NN_topic.ipynb``."""
    names = lesson_pages.lesson_notebooks()
    with_figures, failed = 0, []
    for i, name in enumerate(names, 1):
        try:
            executed = lesson_pages.execute(name, log=lambda text: log.info(f"[{i}/{len(names)}] {text}"))
        except lesson_pages.LessonFailed as err:
            log.error(str(err))
            failed.append(name)
            continue
        with_figures += lesson_pages.figures(lesson_pages.for_the_page(executed, name)) > 0
        # a file whose source folder is PAGES (mkdocs-jupyter's wrapper reads the path from
        # src_dir and src_uri, so File.generated's bare abs_src_path would be lost)
        files.append(File(f"lessons/{name}", src_dir=lesson_pages.PAGES, dest_dir=config.site_dir,
                          use_directory_urls=config.use_directory_urls))
    if failed:     # every lesson is tried first, so that one build names all that fail
        raise PluginError(f"{len(failed)} lesson(s) failed with their solutions in: {', '.join(failed)}")
    log.info(f"{len(names)} lessons executed, {with_figures} with figures")
    return files


def on_page_markdown(markdown, page, config, files):
    """The generated parts of hand-written pages."""
    if cli_reference.MARKER in markdown:
        markdown = markdown.replace(cli_reference.MARKER, cli_reference.reference())
    if README_MARKER in markdown:
        with open(os.path.join(lesson_pages.LESSONS, "README.md"), encoding="utf-8") as f:
            readme = f.read()
        body = readme.split("\n", 1)[1] if readme.startswith("# ") else readme
        markdown = markdown.replace(README_MARKER, body)
    return markdown
