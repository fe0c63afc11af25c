"""Lesson 21's dispatch exercise with the usual mistakes: each case is the solution
(``lessons/solutions/21_experts.py``) with one line changed, run under ``mpiexec -n 4`` by
``lessons/21_yours.py``; its check must fail with one line that names the rank, the token
and the expert whose part is wrong (or the gradient, or the bytes, that are), and no traceback.  The
blank exercise and the solution are tests/test_lesson_yours.py's; the notebook executes
in tests/test_lessons.py (slow run).  One mistake runs by default, the rest are slow."""
import importlib.util
import os
import re

import pytest

from tests.mpirun import REPO, run_mpi

HEAD = r"rank (\d): ep 4 \(this rank is ep rank \1 of ranks \[0, 1, 2, 3\], holding experts \d\.\.\d\): "
TOKEN = r"the output of token \d+, expert \d \(choice \d of 2, w = [\d.]+, on ep rank \d\): "

# (name, the line of the solution, what it becomes, the diagnostic)
MISTAKES = [
    ("rows not put back in order", "per_slot = ops.getitem(back, xp.argsort(slots))",
     "per_slot = ops.getitem(back, slots)",
     HEAD + TOKEN + r"its part is expert \d's output of token \d+: the rows came back, but were not put back "
                    r"in \(token, choice\) order"),
    ("weights not renormalised", "weights = ops.div(top, ops.sum(top, axis=-1, keepdims=True))",
     "weights = top",
     HEAD + TOKEN + r"its part is weighted by the router's probability [\d.]+, not renormalised"),
    ("no weights", "return ops.sum(ops.mul(per_slot, ops.reshape(weights, (T, k, 1))), axis=1)",
     "return ops.sum(per_slot, axis=1)",
     HEAD + TOKEN + r"its part is not multiplied by its weight w = [\d.]+"),
    ("experts swapped on a rank", "moe.experts[first + j]", "moe.experts[first + (per - 1 - j)]",
     HEAD + TOKEN + r"its part is expert \d's output instead: the row went to, or came back from, the "
                    r"wrong expert"),
    ("weights from detached probabilities", "top = ops.getitem(probs, ",
     "top = ops.getitem(type(probs)(probs.data), ",
     HEAD + r"the router's weight gradient is none: the weights w_j must be computed from the router's "
            r"probabilities as a Tensor"),
    ("every count to every rank", "all_to_all(comm, counts.reshape(E, 1), [per] * ep)[0].reshape(ep, per)",
     "all_to_all(comm, np.tile(counts, ep).reshape(ep * E, 1), [E] * ep)[0].reshape(ep, E)[:, first:first + per]",
     HEAD + r"output and gradients are right, but this rank sent \d+ bytes in forward and backward; it should "
            r"send \d+: .*; the excess, \d+ = \(ep-1\)·\(E - E/ep\)·8, is every expert's count sent to every rank"),
]
DEFAULT = {"rows not put back in order"}


def solution():
    path = os.path.join(REPO, "lessons", "solutions", "21_experts.py")
    spec = importlib.util.spec_from_file_location("solutions_21", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    first, _, body = module.SOLUTIONS["dispatch"].strip("\n").partition("\n")
    assert first == "%%writefile {MINE}/experts.py", first
    return body


@pytest.mark.parametrize("what,old,new,diagnostic", [
    pytest.param(*case, marks=[] if case[0] in DEFAULT else [pytest.mark.slow], id=case[0].replace(" ", "_"))
    for case in MISTAKES])
def test_a_wrong_dispatch_names_the_rank_token_and_expert(what, old, new, diagnostic, tmp_path):
    code = solution()
    assert code.count(old) == 1, f"the case {what!r} no longer applies to the solution"
    mine = tmp_path / "experts.py"
    mine.write_text(code.replace(old, new))
    proc = run_mpi(4, [os.path.join("lessons", "21_yours.py"), "--file", mine], timeout=180, check=False)
    out = proc.stdout + proc.stderr
    assert proc.returncode != 0, f"{what}: the check passed:\n{out[-3000:]}"
    assert re.search(diagnostic, out), f"{what}: no diagnostic /{diagnostic}/ in:\n{out[-3000:]}"
    assert "Traceback" not in out, f"{what}: a traceback instead of the check's line:\n{out[-3000:]}"
