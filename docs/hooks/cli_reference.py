"""The command-line page, written from the parser itself at every build, so it cannot drift.

Each command's section is the text ``python -m minipar COMMAND --help`` prints, run as a
user runs it (80 columns).  The commands are found the same way: the top level's
subcommands are the choices in its usage line (``{train,profile,...}``), and a command
whose usage offers choices of its own (``cluster {up,down,...}``, ``bench {comm,attention}``)
is followed into each one whose help differs from its parent's (``checkpoint inspect``
is one of ``checkpoint``'s actions, not a command with flags of its own).
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MARKER = "<!-- the command reference is generated here -->"


def help_text(command):
    """What ``python -m minipar COMMAND... --help`` prints (80 columns, exit status 0)."""
    env = dict(os.environ, COLUMNS="80", PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.run([sys.executable, "-m", "minipar", *command, "--help"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(f"python -m minipar {' '.join(command)} --help exited {proc.returncode}:\n{proc.stderr}")
    return proc.stdout.rstrip()


def choices(usage_help):
    """The positional ``{a,b,c}`` of a help text's usage paragraph: the subcommands it offers
    (a flag's choices, ``[--placement {block,cyclic}]``, are not)."""
    usage = usage_help.split("\n\n", 1)[0]
    for before, found in re.findall(r"(\S*)\s+\{([\w,-]+)\}", usage):
        if not (before.lstrip("[").startswith("-") and not before.endswith("]")):
            return found.split(",")
    return []


def commands():
    """[(command words, help text)] for ``python -m minipar`` and every command under it,
    depth first, in the order the parser lists them (each level's ``--help`` runs at once)."""
    def under(command, text, pool):
        words = [command + [choice] for choice in choices(text)]
        found = []
        for child, child_text in zip(words, pool.map(help_text, words)):
            if child_text != text and " ".join(child) in child_text.split("\n\n", 1)[0]:
                found += [(child, child_text)] + under(child, child_text, pool)
        return found

    top = help_text([])
    with ThreadPoolExecutor(max_workers=8) as pool:
        return [([], top)] + under([], top, pool)


def anchor(command):
    return "-".join(["minipar", *command]) if command else "minipar"


def reference():
    """The page's generated part: an index of the commands, then each one's ``--help``."""
    found = commands()
    index = [f"- [`minipar {' '.join(c)}`](#{anchor(c)})" for c, _ in found if c]
    sections = []
    for command, text in found:
        title = " ".join(["minipar", *command])
        sections.append(f"## `{title}` {{ #{anchor(command)} }}\n\n```text\n$ python -m {title} --help\n{text}\n```")
    return "\n".join(index) + "\n\n" + "\n\n".join(sections) + "\n"


if __name__ == "__main__":
    print(reference())
