"""The process grid's groups by enumeration, for the grid tests (tests/test_grid.py and
tests/scripts/grid_check.py).

The numbering (minipar/parallel/grid.py's docstring): tensor parallelism fastest, then
context, data, pipeline — the order ``itertools.product`` counts (pp, dp, cp, tp) in.  A
group holds the ranks that differ from a rank in its own axes only, listed in the order
of those axes' index (dp × cp: dp major)."""
import itertools

KINDS = ("tp", "cp", "dp", "dp_cp", "pp")
VARIES = {"tp": ("tp",), "cp": ("cp",), "dp": ("dp",), "dp_cp": ("dp", "cp"), "pp": ("pp",)}


def expected_groups(dp, cp, tp, pp):
    """[(coordinates (dp, cp, tp, pp), {kind: [world ranks in sub-rank order]})], by rank."""
    sizes = {"pp": pp, "dp": dp, "cp": cp, "tp": tp}
    order = ("pp", "dp", "cp", "tp")
    coords = [dict(zip(order, values)) for values in itertools.product(*(range(sizes[a]) for a in order))]
    rank = {tuple(c[a] for a in order): r for r, c in enumerate(coords)}
    out = []
    for c in coords:
        groups = {}
        for kind in KINDS:
            axes = VARIES[kind]
            groups[kind] = [rank[tuple(dict(c, **dict(zip(axes, values)))[a] for a in order)]
                            for values in itertools.product(*(range(sizes[a]) for a in axes))]
        out.append(((c["dp"], c["cp"], c["tp"], c["pp"]), groups))
    return out
