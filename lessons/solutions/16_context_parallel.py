"""Solutions of lesson 16's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "merge": r'''
def my_merge(out, lse, o, l):
    m = np.maximum(lse, l)                        # finite: l is, for every row it touches
    new = m + np.log(np.exp(lse - m) + np.exp(l - m))
    out *= np.exp(lse - new)[..., None]           # e^{-inf} = 0 on the first block
    out += o * np.exp(l - new)[..., None]
    lse[...] = new
''',
    "zigzag": r'''
def my_chunks_of(rank, cp):
    return rank, 2 * cp - 1 - rank
''',
}
