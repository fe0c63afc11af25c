"""The parameters one rank holds, built without communication.

A rank's share of the model is what training's own code leaves it: the plain model of
placeholders (``make_model(cfg, materialize=False)``: every weight the right shape and
no memory, ``nn/init.py``), cut by the tensor-parallel layer swaps
(``to_tensor_parallel``), stripped of other ranks' experts (``apply_expert_parallel``),
then reduced to the rank's pipeline stages (``RankStages``),
with each parameter's ``Placement`` (``tp_placements``) saying what the rank holds of it.
``rank_parameters`` runs exactly those steps for one rank's coordinates, so whoever
needs that rank's parameters (the memory model, ``perf/memory.py``) reads them from the
objects training builds instead of listing them a second time.

No other rank takes part.  Cutting asks the tp communicator only where this rank
stands (``rank``, ``size``) and, for grouped-query attention with more tp ranks than
key/value heads, to ``split`` off the ranks that share a KV head
(``tensor/llama.replica_comm``), a group whose members only messages could tell.
``PlaceOnlyComm`` answers the first and, for the second, hands back a group that
refuses every use: the replica group is only stored at construction and used in
backward, which a model built here never runs.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from minipar.nn import make_model
from minipar.parallel.experts import apply_expert_parallel
from minipar.parallel.pipeline.stage import RankStages
from minipar.parallel.placement import tp_placements
from minipar.parallel.tensor import to_tensor_parallel


class PlaceOnlyComm:
    """A tp communicator that knows this rank's place (``rank`` of ``size``) and sends
    nothing: enough to cut a model, never enough to run it."""

    def __init__(self, rank, size):
        if not 0 <= rank < size:
            raise ValueError(f"tp rank {rank} is outside a group of {size}")
        self.rank, self.size = rank, size

    def split(self, color, key=0):
        """The sub-group of the ranks that pass the same ``color``: unknown here (only the
        others' colors could tell its members), so a group that refuses every use."""
        return UnknownGroup(color)

    def __getattr__(self, name):
        raise AttributeError(f"PlaceOnlyComm has no {name!r}: this stand-in cuts a model "
                             f"for its shapes and sends no message")


class UnknownGroup:
    """What ``PlaceOnlyComm.split`` returns: a group stored by a layer, never used."""

    def __init__(self, color):
        self.color = color

    def __getattr__(self, name):
        raise AttributeError(f"no {name!r}: the sub-group of color {self.color} was split off "
                             f"a PlaceOnlyComm; its members are unknown and it sends no message")


@dataclass
class RankParameters:
    """One rank's parameters, cut as training cuts them."""
    module: Any       # holds this rank's parameters in the model's order (``RankStages``
                      # when pipelined, else the model itself)
    model: Any        # the model after the tp cut (pipelined: other stages' parts dropped)
    placements: dict  # {name: Placement} of every parameter of the model: tp cut, stage


def rank_parameters(cfg, tp=1, tp_rank=0, pp=1, chunks=1, pp_rank=0, ep=1, ep_rank=0):
    """The parameters that tp rank ``tp_rank`` of ``tp``, pipeline rank ``pp_rank`` of
    ``pp`` (``chunks`` stages each) and expert-parallel rank ``ep_rank`` of ``ep`` hold
    of model ``cfg``, as placeholders: the steps of ``parallel.parallelize`` that cut the
    model (1. tensor parallelism, 1c. expert parallelism, 3. pipeline stages), with no
    communicator.  Raises ValueError where training would refuse the layout
    (``check_tensor_parallel``, ``check_partition``)."""
    model = make_model(cfg, materialize=False)
    global_shapes = {n: tuple(p.shape) for n, p in model.named_parameters()}
    tp_model = tp_comm = None
    if tp > 1:
        tp_comm = PlaceOnlyComm(tp_rank, tp)
        model = tp_model = to_tensor_parallel(model, tp_comm)   # uses the placeholders up
    if ep > 1:
        apply_expert_parallel(model, PlaceOnlyComm(ep_rank, ep))
    module = model
    if pp > 1 or chunks > 1:
        module = RankStages(model, pp_rank, pp, chunks)
    placements = tp_placements(global_shapes, tp_model, tp_comm, False, module)
    return RankParameters(module=module, model=model, placements=placements)
