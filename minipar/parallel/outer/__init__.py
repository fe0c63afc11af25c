"""Training across a slow link: DiLoCo's groups and outer step.

    groups.py   ``carve_groups(grid, G)``: the group's grid (data parallelism inside the
                group), the communicator across groups, and one over the group's ranks
    diloco.py   ``DiLoCo``: every H inner steps the pseudo-gradient θ⁽ᵗ⁻¹⁾ − θ_g averaged
                over the groups and one outer Nesterov step (Algorithm 1); its streaming
                form (F fragments, overlapped, mixed) and compressed all-reduce

A run (``train.setup``) carves the groups from the grid before it builds the model, builds
everything inside a group from the group's grid, and calls ``DiLoCo.after_step`` after
each inner optimizer step; only that call sends anything to another group.
"""
from minipar.parallel.outer.diloco import DiLoCo, nesterov_step
from minipar.parallel.outer.groups import Groups, carve_groups

__all__ = ["DiLoCo", "Groups", "carve_groups", "nesterov_step"]
