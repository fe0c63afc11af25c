"""``python -m minipar checkpoint inspect|consolidate|upgrade``: look at a checkpoint,
make a one-file copy of it, convert an old one.  All stream tensor by tensor.

    inspect DIR            step, layout, tensor count, bytes per rank file
    consolidate DIR OUT    OUT/step-N/ in the same format with one file, rank-00000.bin,
                           each tensor whole (one piece, box = the whole tensor): what
                           exporters and ``sample`` read simply; ``--resume OUT`` works
    upgrade OLD NEW        an old single-file checkpoint.npz (minipar-checkpoint-1) as the
                           same one-file sharded checkpoint in NEW
"""
from __future__ import annotations

from minipar.checkpoint import layout
from minipar.checkpoint.read import KINDS, open_checkpoint
from minipar.checkpoint.write import save


def whole(shape):
    return (0,) * len(shape), tuple(shape)


def describe(directory):
    """The lines ``inspect`` prints."""
    ckpt = open_checkpoint(directory)
    meta, tensors = ckpt.meta, ckpt.tensors
    layout_ = meta.get("layout", {})
    counts = {k: sum(t["kind"] == k for t in tensors.values()) for k in KINDS}
    numel = sum(int(_prod(t["shape"])) for t in tensors.values() if t["kind"] == "param")
    lines = [f"checkpoint {ckpt.path}",
             f"  step {meta['step']} (optimizer step {meta.get('optimizer_step')}), "
             f"{meta.get('precision')}, seed {meta.get('seed')}",
             f"  written by layout {layout_.get('name', '?')} on {layout_.get('world_size', '?')} "
             f"rank(s)",
             f"  {len(tensors)} tensors: " + ", ".join(f"{counts[k]} {k}" for k in KINDS if counts[k])
             + f"; {numel:,} parameters",
             "  files:"]
    total = 0
    for file, nbytes in sorted(ckpt.index["files"].items()):
        pieces = sum(p["file"] == file for t in tensors.values() for p in t["pieces"])
        lines.append(f"    {file}  {nbytes / 2**20:10.2f} MiB  {pieces} pieces")
        total += nbytes
    lines.append(f"  total {total / 2**20:.2f} MiB")
    return lines


def _prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def consolidate(directory, out):
    """Write ``out``'s one-file checkpoint from ``directory``'s; returns its step dir."""
    ckpt = open_checkpoint(directory)
    pieces = ((t["kind"], t["name"], t["shape"], whole(t["shape"]), ckpt.tensor(t["name"], t["kind"]))
              for t in ckpt.tensors.values())
    meta = dict(ckpt.meta, consolidated_from=ckpt.path)
    failure = save(None, out, meta["step"], meta, pieces)
    if failure:
        raise OSError(failure)
    return layout.latest(out)


def upgrade(old, new):
    """An old ``checkpoint.npz`` as a one-file sharded checkpoint; returns its step dir."""
    from minipar.checkpoint.legacy import open_legacy
    z, meta = open_legacy(old)

    def pieces():
        for key in z.files:
            if key == "meta":
                continue
            kind, name = key.split("/", 1)      # hook/<rank>/<key> keeps "<rank>/<key>"
            values = z[key]
            yield kind, name, values.shape, whole(values.shape), values
    meta = {k: v for k, v in meta.items() if k != "format"}
    failure = save(None, new, meta["step"], meta, pieces())
    if failure:
        raise OSError(failure)
    return layout.latest(new)


def main(args):
    """The ``checkpoint`` command; returns the exit code."""
    if args.action == "inspect":
        print("\n".join(describe(args.directory)))
    elif args.action == "consolidate":
        print(f"wrote {consolidate(args.directory, args.out)}")
    else:
        print(f"wrote {upgrade(args.directory, args.out)}")
    return 0
