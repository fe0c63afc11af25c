"""Layout-free checkpoints: full arrays by parameter name, whatever the layout.

Saving gathers: ZeRO shards over dp (``sync.to_named``), tensor slices over tp, stages
merged over pp, and world rank 0 writes (``checkpoint.save``, atomic).  Loading slices:
the plain model loads the full weights before ``parallelize`` cuts them, and the
optimizer state is cut by the same rules.
"""
from __future__ import annotations

from minipar import checkpoint
from minipar.train.errors import TrainingStopped


def save_checkpoint(run, step):
    """Collective: every rank calls it."""
    optimizer, grid, tp_model = run.optimizer, run.grid, run.parallel.tp_model
    state = optimizer.state_dict()            # collective: gathers ZeRO shards
    params = optimizer.model_state_dict()     # collective under ZeRO
    if tp_model is not None:                  # collective over tp: slices -> full arrays
        params = tp_model.gather_full_arrays(params)
        state = dict(state, m=tp_model.gather_full_arrays(state["m"]),
                     v=tp_model.gather_full_arrays(state["v"]))
    if grid.pp > 1:                           # each stage holds other names: merge them
        parts = grid.pp_comm.mpi.gather((params, state), root=0)
        if parts is not None:
            params = {k: v for p, _ in parts for k, v in p.items()}
            state = {"step": state["step"], "m": {k: v for _, s in parts for k, v in s["m"].items()},
                     "v": {k: v for _, s in parts for k, v in s["v"].items()}}
    failure = None
    if grid.rank == 0:
        c = run.config
        meta = {"model": run.cfg.to_dict(), "step": step, "seed": c.seed, "precision": c.precision}
        if optimizer.scaler:
            meta["loss_scaler"] = optimizer.scaler.state_dict()
        try:
            checkpoint.save(c.save, params, state, meta)
        except checkpoint.CheckpointWriteError as err:
            failure = str(err)
    if grid.world.size > 1:                   # every rank learns the outcome: all stop alike
        failure = grid.world.mpi.bcast(failure, root=0)
    if failure:
        raise TrainingStopped(f"step {step}: {failure}")


def load_optimizer_state(optimizer, parallel, resume):
    """Load a resumed checkpoint's m, v (cut for this rank) and loss scaler; returns the
    step to continue from."""
    _, state, meta = resume
    if parallel.tp_model is not None:
        state = dict(state, m=parallel.tp_model.shard_full_arrays(state["m"]),
                     v=parallel.tp_model.shard_full_arrays(state["v"]))
    optimizer.load_state_dict(state)
    if "loss_scaler" in meta and optimizer.scaler:
        optimizer.scaler.load_state_dict(meta["loss_scaler"])
    return int(meta["step"])
