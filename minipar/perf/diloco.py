"""DiLoCo priced by the performance model: the inner steps inside a group, the outer step
across groups, each on its own link class.

A DiLoCo run of G groups is, between outer steps, G independent runs of dp/G replicas on
B/G sequences each: its inner step is ``estimate.predict`` of that run, whose collectives
stay inside a group (on the simulated cluster, one node: the fast links).  Every H inner
steps the outer step adds

    outer_s = all-reduce over G ranks of this rank's share of the pseudo-gradient
              (the elements it updates, split between a group's replicas), on the link
              between the groups ("inter" when a group fills a node)
            + the all-gather that gives a group's replicas their new weights (inside it)
            + the Nesterov update (priced as the optimizer's pass over those elements)

and compressed (``outer_compression``) it all-gathers 2 bytes (fp16/bf16) or 1 + 4/256
bytes (int8) per element instead.  So a step costs on average

    plain        inner_s + outer_s / H
    streaming    inner_s + F · max(0, outer_s/F − τ·inner_s) / H   (each fragment's
                 all-reduce hides behind the τ inner steps that follow it)

against data parallelism's ``predict`` of the same config, whose gradient all-reduce
crosses the slow link every step.  DiLoCo pays where its step is shorter; it costs loss
per token, which this model does not price (``benchmarks/cluster_diloco.py`` measures it).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from minipar.perf import comm as pcomm
from minipar.perf import memory as pmem
from minipar.perf.profile import DTYPE_BYTES

# bytes per element the outer step sends, by outer_compression (int8: a float32 scale per 256)
WIRE_BYTES = {"fp16": 2.0, "bf16": 2.0, "int8": 1.0 + 4.0 / 256}


@dataclass(frozen=True)
class DiLoCoPrice:
    inner_s: float          # one inner step (predict of one group's run)
    outer_s: float          # one outer step: the exchange across groups, the gather, the update
    step_s: float           # the mean step, the outer step's exposed part spread over H
    outer_bytes: float      # bytes every rank together sends across groups per outer step
    where: str              # the link class the outer all-reduce crosses


def inner_config(config):
    """One group's run: dp/G replicas on B/G sequences, no outer step."""
    from minipar.config.outer import Outer
    G = config.diloco_groups
    plain = {f.name: f.default for f in dataclasses.fields(Outer)}
    return dataclasses.replace(config, **plain, dp=config.dp // G,
                               batch_size=config.batch_size // G)


def price(config, prof, ranks_per_node=None):
    """``DiLoCoPrice`` of a resolved config with ``outer`` diloco."""
    from minipar.perf.estimate import predict
    G, H, F = config.diloco_groups, config.inner_steps, config.diloco_fragments
    rpn = ranks_per_node or prof.ranks_per_node or 1
    inner = predict(inner_config(config), prof, rpn)
    cfg = config.model_config()
    per_group = config.dp // G * config.cp            # the ranks that share the elements
    elements = pmem.numel(cfg, tp=config.tp, pp=config.pp, chunks=config.chunks,
                          pp_rank=config.pp - 1) / per_group
    master = "fp32" if config.precision in ("fp16", "bf16") else config.precision
    item = DTYPE_BYTES[master]
    ranks_per_group = config.world_size // G
    where = pcomm.placement(G, ranks_per_group, rpn)
    if config.outer_compression == "none":
        exchange = pcomm.collective_seconds(prof, "all_reduce", G, elements * item, where)
        sent = 2 * (G - 1) / G * elements * item
    else:
        wire = elements * WIRE_BYTES[config.outer_compression]
        exchange = pcomm.collective_seconds(prof, "all_gather", G, G * wire, where)
        sent = (G - 1) * wire
    gather = pcomm.collective_seconds(prof, "all_gather", per_group, elements * per_group * item,
                                      pcomm.placement(per_group, config.tp, rpn)) \
        if config.zero == 0 else 0.0
    update = prof.optimizer_seconds(elements, master)
    outer_s = exchange + gather + update
    if F == 1:
        exposed = outer_s
    else:
        exposed = F * max(0.0, outer_s / F - config.outer_delay * inner.step_s)
    return DiLoCoPrice(inner.step_s, outer_s, inner.step_s + exposed / H,
                       sent * config.world_size, where)


def compare(config, prof, ranks_per_node=None, inner_steps=(10, 50, 100, 500)):
    """Text: data parallelism over every rank against DiLoCo with ``config``'s groups at
    each H, predicted per step — where DiLoCo's fewer bytes pay."""
    from minipar.perf.estimate import predict
    rpn = ranks_per_node or prof.ranks_per_node or 1
    plain = dataclasses.replace(config, **{k: v for k, v in
                                           dataclasses.asdict(inner_config(config)).items()
                                           if k not in ("dp", "batch_size")})
    ddp = predict(plain, prof, rpn).step_s
    G = config.diloco_groups
    lines = [f"DiLoCo, {G} groups of {config.world_size // G} ranks, against data parallelism "
             f"over all {config.world_size} (profile {prof.name}; per step, predicted):",
             f"  {'':<28} {'step s':>9} {'vs DDP':>7} {'outer s':>9} {'MB across/outer':>16}",
             f"  {'DDP':<28} {ddp:9.3f} {1.0:7.2f}"]
    for H in inner_steps:
        p = price(dataclasses.replace(config, inner_steps=H), prof, rpn)
        name = f"DiLoCo H={H}" + (f" F={config.diloco_fragments}" if config.diloco_fragments > 1
                                  else "") + (f" {config.outer_compression}"
                                              if config.outer_compression != "none" else "")
        lines.append(f"  {name:<28} {p.step_s:9.3f} {ddp / p.step_s:7.2f} {p.outer_s:9.3f} "
                     f"{p.outer_bytes / 1e6:16.1f}")
    lines.append("  (loss per token is not priced: DiLoCo needs more tokens for the same loss)")
    return "\n".join(lines)
