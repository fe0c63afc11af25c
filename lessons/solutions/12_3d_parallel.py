"""Solutions of lesson 12's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_coordinates": r'''
def my_coordinates(rank, dp, tp, pp):
    """(dp_rank, tp_rank, pp_rank) of `rank` in a dp × tp × pp grid numbered tp-fastest."""
    return (rank // tp) % dp, rank % tp, rank // (dp * tp)
''',
    "group_members": r'''
def group_members(rank, dp, tp, pp, kind):
    """World ranks of `rank`'s `kind` group ("tp", "dp" or "pp"), ordered by rank within the group."""
    d, t, p = my_coordinates(rank, dp, tp, pp)
    rank_of = lambda d, t, p: p * dp * tp + d * tp + t         # the numbering above
    if kind == "tp":
        return [rank_of(d, i, p) for i in range(tp)]
    if kind == "dp":
        return [rank_of(i, t, p) for i in range(dp)]
    if kind == "pp":
        return [rank_of(d, t, i) for i in range(pp)]
    raise ValueError(kind)
''',
}
