"""The all-reduce algorithms by name, and how ``auto`` picks one.

    ring | recursive_doubling (rd) | rabenseifner (rab) | tree (binomial) | hierarchical
    hierarchical:<flat algorithm>     the inter-node step run with that algorithm
    auto                              the cost model's fastest for (communicator, size)

``auto`` asks ``cost_model.choose`` with the communicator's constants (``cost_model.params``:
set by an explicit ``use`` of what ``perf/calibrate_links.calibrate`` measured, a profile,
or the documented defaults — never a hidden collective);
hierarchical is a candidate only when a node layout is declared (``ranks_per_node``)
and it has more than one node of more than one rank, or when the constants were
calibrated across nodes (``two_level.py``: then the model prices each step by the link
it crosses, and nodes are taken to be q consecutive ranks, the launcher's placement).  The choice is cached per size, so
every rank — with the same broadcast constants — makes the same one.
"""
from __future__ import annotations

from minipar.comm import cost_model, watchdog
from minipar.comm.doubling import rabenseifner_all_reduce, recursive_doubling_all_reduce
from minipar.comm.hierarchical import hierarchical_all_reduce, node_layout
from minipar.comm.ring import ring_all_reduce
from minipar.comm.tree import tree_all_reduce

ALIASES = {"rd": "recursive_doubling", "rab": "rabenseifner", "binomial": "tree"}


def _hierarchical(comm, buf, reduce, inner_algorithm="auto"):
    """Two levels; the inter-node all-reduce uses ``inner_algorithm`` ("hierarchical:ring")."""
    def inner(cross, shard):
        name = inner_algorithm
        if name == "auto":  # a flat algorithm, by the whole communicator's constants: no
            # calibration or layout of ``cross`` (collective setup, maybe on a progress thread)
            name = cost_model.choose(cross.size, shard.nbytes, _params(comm),
                                     ranks_per_node=1)   # one rank of each node
        _ALL_REDUCE[name](cross, shard, reduce)
    return hierarchical_all_reduce(comm, buf, reduce, inner)


_ALL_REDUCE = {
    "ring": ring_all_reduce,
    "recursive_doubling": recursive_doubling_all_reduce,
    "rabenseifner": rabenseifner_all_reduce,
    "tree": tree_all_reduce,
    "hierarchical": _hierarchical,
}
ALL_REDUCE_ALGORITHMS = tuple(_ALL_REDUCE)


def _params(comm):
    """The cost model's constants (``cost_model.params``: no communication)."""
    c = comm.cache.get("cost")
    if c is None:
        c = watchdog.watched(comm, None, "cost-model calibration", cost_model.params, comm) \
            if comm.hang_timeout is not None else cost_model.params(comm)
    return c


def _auto(comm, nbytes):
    """The cost model's choice for this communicator and size (cached per size)."""
    key = ("auto", nbytes)
    choice = comm.cache.get(key)
    if choice is None:
        candidates = cost_model.FLAT
        c = _params(comm)
        if comm.ranks_per_node:  # only a declared node layout makes two levels worth it
            if 1 < node_layout(comm)[3] < comm.size:
                candidates += ("hierarchical",)
        elif cost_model.hierarchical_applies(c, comm.size):
            candidates += ("hierarchical",)      # calibrated across real nodes
        choice = cost_model.choose(comm.size, nbytes, c, candidates)
        comm.cache[key] = choice
    return choice


def _algorithm(name):
    if name in _ALL_REDUCE or name == "auto":  # the common case, kept cheap
        return name
    if not isinstance(name, str):
        raise TypeError(f"algorithm must be a name, not {name!r}")
    name = ALIASES.get(name, name)
    if name.startswith("hierarchical:"):
        inner = _algorithm(name.split(":", 1)[1])
        if inner == "hierarchical" or ":" in inner:
            raise ValueError("hierarchical:X needs a flat inner algorithm X")
        return name
    if name != "auto" and name not in _ALL_REDUCE:
        raise ValueError(f"unknown all-reduce algorithm {name!r}; choose auto, one of "
                         f"{', '.join(_ALL_REDUCE)}, or hierarchical:<inner algorithm>")
    return name
