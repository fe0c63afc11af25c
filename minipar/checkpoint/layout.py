"""Where a checkpoint lives on disk, and how one becomes *the* checkpoint.

    DIR/latest                      "step-0000012": the newest committed checkpoint
    DIR/step-0000012/index.json     what every tensor is and where its pieces are
    DIR/step-0000012/rank-00003.bin the bytes rank 3 owned, each piece at the offset
                                    the index gives (raw, C order: np.memmap-able)
    DIR/step-0000016.tmp-<id>/      a save in progress (or crashed): never read

A save writes into the ``.tmp-`` directory, and only after every rank reported success
does rank 0 rename it to ``step-NNNNNNN`` and then replace ``latest`` (written to a
temporary name, fsynced, renamed: atomic).  A crash before the rename leaves only a
temporary directory, which nothing reads and the next save removes; a crash between the
rename and ``latest`` leaves a complete checkpoint that ``latest`` does not name yet.
Either way ``latest`` names a whole checkpoint.
"""
from __future__ import annotations

import json
import os
import re
import shutil

FORMAT = "minipar-checkpoint-2"
INDEX = "index.json"
LATEST = "latest"
ALIGN = 64                          # piece alignment in a streamed file (consolidate)
LEGACY_FILE = "checkpoint.npz"      # format minipar-checkpoint-1: one file of full arrays
_STEP = re.compile(r"^step-(\d{7,})(?:\.(\d+))?$")   # step-0000012, or step-0000012.1


def step_name(step):
    return f"step-{int(step):07d}"


def free_step_name(directory, step):
    """``step-NNNNNNN``, or ``step-NNNNNNN.K`` when that step was saved already (a resumed
    run saving the step it resumed from): a committed checkpoint is never overwritten."""
    name, k = step_name(step), 0
    while os.path.exists(os.path.join(directory, name)):
        k += 1
        name = f"{step_name(step)}.{k}"
    return name


def rank_file(rank):
    return f"rank-{rank:05d}.bin"


def fsync_directory(path):
    """Make a rename or a new file in ``path`` durable (a no-op where unsupported)."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write_atomic(path, text):
    """``path`` holds ``text`` or its old contents, never a mix (tmp, fsync, rename)."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_directory(os.path.dirname(path) or ".")


def committed(directory):
    """[(step, path)] of the complete checkpoints in ``directory``, oldest first (the
    re-saves of one step in the order they were made)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return []
    out = []
    for name in names:
        m = _STEP.match(name)
        if m and os.path.isfile(os.path.join(directory, name, INDEX)):
            out.append((int(m.group(1)), int(m.group(2) or 0), os.path.join(directory, name)))
    return [(step, path) for step, _, path in sorted(out)]


def latest(directory):
    """The checkpoint ``directory/latest`` names, or None."""
    try:
        with open(os.path.join(directory, LATEST)) as f:
            name = f.read().strip()
    except OSError:
        return None
    path = os.path.join(directory, name)
    return path if _STEP.match(name) and os.path.isfile(os.path.join(path, INDEX)) else None


def resolve(directory):
    """The step directory to read for ``--resume DIR``: DIR itself when it is one
    (holds index.json), else the one DIR/latest names.  Raises FileNotFoundError, or
    ValueError for an old single-file checkpoint (with the command that converts it)."""
    directory = str(directory)
    if os.path.isfile(os.path.join(directory, INDEX)):
        return directory
    found = latest(directory)
    if found:
        return found
    if os.path.isfile(os.path.join(directory, LEGACY_FILE)):
        raise ValueError(f"{directory} holds an old single-file checkpoint (minipar-checkpoint-1); "
                         f"convert it with: python -m minipar checkpoint upgrade {directory} NEW_DIR")
    raise FileNotFoundError(f"no checkpoint in {directory} (--resume takes the --save directory)")


def read_index(path):
    """The parsed index of a step directory, with one line for a corrupt or foreign one."""
    file = os.path.join(path, INDEX)
    try:
        with open(file) as f:
            index = json.load(f)
    except (OSError, ValueError) as err:
        raise ValueError(f"checkpoint {file} is corrupt or unreadable: {err}") from None
    if not isinstance(index, dict) or index.get("format") != FORMAT:
        got = index.get("format") if isinstance(index, dict) else None
        raise ValueError(f"{file} is not a {FORMAT} index (format {got!r})")
    return index


def remove_temporaries(directory):
    """Delete saves that never committed (``step-*.tmp-*``): they can be large."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        if name.startswith("step-") and ".tmp-" in name:
            shutil.rmtree(os.path.join(directory, name), ignore_errors=True)


def prune(directory, keep):
    """Remove all but the ``keep`` newest complete checkpoints (keep 0: keep all).  The
    one ``latest`` names is never removed."""
    if not keep:
        return
    newest = latest(directory)
    for _, path in committed(directory)[:-keep]:
        if os.path.abspath(path) != os.path.abspath(newest or ""):
            shutil.rmtree(path, ignore_errors=True)
