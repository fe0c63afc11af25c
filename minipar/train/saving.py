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
    """Collective: every rank calls it.  Its memory peak is the run's "save" phase."""
    with run.process_memory.phase("save"):
        _save_checkpoint(run, step)


def _save_checkpoint(run, step):
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
    hook = getattr(optimizer.sync, "comm_hook", None)
    if hasattr(hook, "state_dict"):           # compression residuals differ per rank: all of them
        states = grid.world.mpi.gather(hook.state_dict(), root=0)
        if states is not None:
            state = dict(state, hook=dict(enumerate(states)))
    failure = None
    if grid.rank == 0:
        c = run.config
        meta = {"model": run.cfg.to_dict(), "step": step, "seed": c.seed, "precision": c.precision}
        if run.dataset.tokenizer is not None:     # sample and resume decode with it
            meta["tokenizer"] = run.dataset.tokenizer.to_dict()
        if hasattr(hook, "state_dict"):
            meta["compression"] = {"method": c.grad_compression, "world_size": grid.world.size,
                                   "layout": c.layout_name()}
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


def load_optimizer_state(optimizer, parallel, resume, config=None, rank=0):
    """Load a resumed checkpoint's m, v (cut for this rank), loss scaler and gradient
    compression state; returns the step to continue from.  Compression state is per rank:
    it is loaded when the run has the checkpoint's method and layout, else started afresh
    (said once)."""
    _, state, meta = resume
    hook = getattr(optimizer.sync, "comm_hook", None)
    saved = meta.get("compression")
    if hasattr(hook, "load_state_dict") and config is not None:
        if saved and saved["method"] == config.grad_compression and \
                saved["layout"] == config.layout_name() and rank in state.get("hook", {}):
            hook.load_state_dict(state["hook"][rank])
        elif rank == 0:
            print(f"minipar train: note: no {config.grad_compression} state for this layout in the "
                  "checkpoint; error feedback starts from zero", flush=True)
    if parallel.tp_model is not None:
        state = dict(state, m=parallel.tp_model.shard_full_arrays(state["m"]),
                     v=parallel.tp_model.shard_full_arrays(state["v"]))
    optimizer.load_state_dict(state)
    if "loss_scaler" in meta and optimizer.scaler:
        optimizer.scaler.load_state_dict(meta["loss_scaler"])
    return int(meta["step"])
