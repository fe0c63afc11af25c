"""This tree trains as another git revision does: the same per-step losses, layout by layout.

    python tests/scripts/losses_vs_revision.py --base acb6a77 [--steps 50]
        [--layouts dp2,tp2sp,pp2,cp2,zero3] [--precisions fp64] [--rtol 1e-12]

The base revision is checked out with ``git worktree add --detach`` into a temporary
folder (removed at the end, also on failure; nothing in this checkout changes).  Each
layout trains ``--model tiny`` (4 layers, d 16, seq 8) on the byte corpus, seed 0, under
``mpiexec``, once in each tree, with the same Python: ``PYTHONPATH`` puts that tree first,
and the script checks that ``import minipar`` resolves there before trusting a run.

Per layout and precision it prints the largest relative difference of the losses,
max_s |a_s - b_s| / |b_s|, and the first step past ``--rtol``.  A change meant to leave
behaviour alone (a redesign of the gradient synchronisers, say) should give ~1e-16 in
fp64: only a different order of summation moves the last bits.  Exits 1 if a layout
differs beyond ``--rtol`` or a run fails (its output's tail is printed); every subprocess
has a timeout, so a hang fails too.  ``single`` (one rank) checks the NumPy numerics
alone, e.g. ``--layouts single --precisions fp16,bf16 --rtol 1e-6``.

``--resume-at K``: the base revision trains steps 0..K-1 and saves a checkpoint; this
tree resumes from it to the end.  Its losses from step K on must equal those of this
tree's run that never stopped: checkpoints the base revision wrote still resume here.
"""
import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, REPO)
from minipar.observe.runlog import step_records  # noqa: E402

MODEL = ["--model", "tiny", "--n-layer", "4", "--d-model", "16", "--n-head", "4", "--seq-len", "8"]
RUN = ["--data", "stdlib-bytes", "--batch-size", "8", "--seed", "0", "--quiet", "--eval-batches", "0"]
LAYOUTS = {  # name: (ranks, flags)
    "single": (1, []),
    "dp2": (2, ["--dp", "2"]),
    "tp2sp": (2, ["--tp", "2", "--sequence-parallel"]),
    "pp2": (2, ["--pp", "2", "--schedule", "1f1b", "--microbatches", "4"]),
    "cp2": (2, ["--cp", "2"]),
    "zero1": (2, ["--dp", "2", "--zero", "1"]),
    "zero3": (2, ["--dp", "2", "--zero", "3"]),
}
MPIEXEC = shutil.which("mpiexec", path=os.path.dirname(sys.executable)) or shutil.which("mpiexec")


def environment(tree):
    """The environment a run in ``tree`` gets: that tree's minipar first, one BLAS thread."""
    path = os.pathsep.join(p for p in (tree, os.environ.get("PYTHONPATH")) if p)
    return dict(os.environ, PYTHONPATH=path, MINIPAR_BACKEND="numpy", OMP_NUM_THREADS="1",
                OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def check_imports_from(tree):
    """Refuse a tree whose ``import minipar`` lands elsewhere (an editable install first)."""
    proc = subprocess.run([sys.executable, "-c", "import minipar; print(minipar.__file__)"],
                          cwd=tree, env=environment(tree), capture_output=True, text=True, timeout=120)
    where = os.path.realpath(proc.stdout.strip() or "?")
    if proc.returncode != 0 or not where.startswith(os.path.realpath(tree) + os.sep):
        sys.exit(f"minipar in {tree} does not import from there ({where}):\n{proc.stderr[-2000:]}")


def losses(tree, layout, precision, steps, log, timeout, extra=()):
    """The per-step losses of one training run in ``tree``, or the run's output tail if it failed."""
    ranks, flags = LAYOUTS[layout]
    cmd = [MPIEXEC, "-n", str(ranks), sys.executable, "-m", "minipar", "train", *MODEL, *RUN,
           "--precision", precision, "--steps", str(steps), "--log-json", log, *flags, *extra]
    # its own session, so that a hang ends every rank, not mpiexec alone
    proc = subprocess.Popen(cmd, cwd=tree, env=environment(tree), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        return f"timed out after {timeout} s: {' '.join(cmd)}\n{err[-3000:]}"
    if proc.returncode != 0:
        return f"exited {proc.returncode}: {' '.join(cmd)}\n{out[-1500:]}\n{err[-3000:]}"
    return [r["loss"] for r in step_records(log)]


def resumed(base, layout, precision, args, name):
    """(this tree resumed from the base's checkpoint, this tree uninterrupted): the losses
    of steps resume_at.. of each, or a failed run's output."""
    k, ckpt = args.resume_at, name + "_ckpt"
    saved = losses(base, layout, precision, args.steps, name + "_base.json", args.timeout,
                   ["--save", ckpt, "--stop-at", str(k)])
    if isinstance(saved, str):
        return saved, saved
    again = losses(REPO, layout, precision, args.steps, name + "_resumed.json", args.timeout,
                   ["--resume", ckpt])
    whole = losses(REPO, layout, precision, args.steps, name + "_this.json", args.timeout)
    return again[-(args.steps - k):] if isinstance(again, list) else again, \
        whole[k:] if isinstance(whole, list) else whole


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--base", required=True, help="the git revision to compare with")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--layouts", default="dp2,tp2sp,pp2,cp2,zero3", help=",".join(LAYOUTS))
    ap.add_argument("--precisions", default="fp64")
    ap.add_argument("--rtol", type=float, default=1e-12)
    ap.add_argument("--timeout", type=int, default=900, help="seconds one run may take")
    ap.add_argument("--resume-at", type=int, default=None,
                    help="the base saves at this step and this tree resumes from there")
    args = ap.parse_args()
    layouts, precisions = args.layouts.split(","), args.precisions.split(",")
    unknown = [name for name in layouts if name not in LAYOUTS]
    if unknown or not MPIEXEC:
        sys.exit(f"unknown layout {unknown} (known: {', '.join(LAYOUTS)})" if unknown else "no mpiexec")
    failed, started = False, time.time()
    with tempfile.TemporaryDirectory() as tmp:
        base = os.path.join(tmp, "base")
        made = subprocess.run(["git", "worktree", "add", "--detach", base, args.base], cwd=REPO,
                              capture_output=True, text=True, timeout=300)
        if made.returncode != 0:
            sys.exit(f"git worktree add {args.base}: {made.stderr.strip()}")
        try:
            check_imports_from(base)
            check_imports_from(REPO)
            print(f"{'layout':<8} {'precision':<9} {'steps':>5} {'max rel diff':>12}  verdict")
            for layout in layouts:
                for precision in precisions:
                    name = os.path.join(tmp, f"{layout}_{precision}")
                    if args.resume_at is None:
                        b = losses(base, layout, precision, args.steps, name + "_base.json",
                                   args.timeout)
                        a = losses(REPO, layout, precision, args.steps, name + "_this.json",
                                   args.timeout)
                    else:
                        a, b = resumed(base, layout, precision, args, name)
                    if isinstance(a, str) or isinstance(b, str) or len(a) != len(b) or not a:
                        failed = True
                        print(f"{layout:<8} {precision:<9} FAILED")
                        for tree, got in ((args.base, b), ("this tree", a)):
                            print(f"--- {tree}: " + (got if isinstance(got, str) else f"{len(got)} steps"))
                        continue
                    rel = [abs(x - y) / abs(y) for x, y in zip(a, b)]
                    beyond = [s for s, r in enumerate(rel, 1) if not r <= args.rtol]
                    failed |= bool(beyond)
                    verdict = f"DIFFERS from step {beyond[0]}" if beyond else "same"
                    print(f"{layout:<8} {precision:<9} {len(a):>5} {max(rel):>12.1e}  {verdict}")
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", base], cwd=REPO,
                           capture_output=True, timeout=300)
    print(f"{args.base} vs this tree, {time.time() - started:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
