"""Solutions of lesson 17's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "initial_value": r'''
def my_initial_value(seed, name, shape, std):
    """N(0, std²) in the global shape, from a generator keyed by (seed, sha256(name))."""
    digest = hashlib.sha256(name.encode("utf-8")).digest()
    words = [int.from_bytes(digest[i:i + 4], "little") for i in range(0, 16, 4)]
    rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([int(seed)] + words)))
    return rng.normal(0.0, std, size=tuple(shape))
''',
    "reshard": r'''
%%writefile {MINE}/reshard.py
"""Your reshard read (lesson 17): checked in the notebook and by 17_yours.py under mpiexec."""
import numpy as np


def my_intersect(a, b):
    """The box common to boxes a and b ((offsets, lengths) each), or None."""
    offsets, lengths = [], []
    for (ao, an), (bo, bn) in zip(zip(*a), zip(*b)):
        lo, hi = max(ao, bo), min(ao + an, bo + bn)
        if hi <= lo:
            return None
        offsets.append(lo)
        lengths.append(hi - lo)
    return tuple(offsets), tuple(lengths)


def my_read(pieces, want):
    """The array of box `want`, each element copied from the saved piece that holds it."""
    out = np.empty(want[1], dtype=pieces[0][1].dtype if pieces else float)
    filled = 0
    for box, array in pieces:
        common = my_intersect(box, want)
        if common is None:
            continue
        offsets, lengths = common
        source = tuple(slice(o - bo, o - bo + n) for o, bo, n in zip(offsets, box[0], lengths))
        target = tuple(slice(o - wo, o - wo + n) for o, wo, n in zip(offsets, want[0], lengths))
        out[target] = array[source]
        filled += int(np.prod(lengths))
    if filled != int(np.prod(want[1])):
        raise ValueError(f"the saved pieces cover {filled} of the {int(np.prod(want[1]))} elements wanted")
    return out
''',
}
