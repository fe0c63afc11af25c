"""The command line's config: parsed flags in, the config a run starts from out.

``config_from_flags(args)`` builds the frozen ``TrainConfig`` from the parsed flags and
prepares it for this world size (``config.prepare``: each section's checks, the probes,
``--layout auto``'s choice, ``resolve`` once), before any message is sent.  Refusals
are ``ConfigError`` in the library's words (`n_head`); ``cli_checks.as_flags`` says them
as the flags a user typed (--n-head), which ``python -m minipar`` prints after the name
of the command that was run.
"""
from __future__ import annotations

from minipar.config import ConfigError, TrainConfig, prepare


def world():
    """(rank, size) of MPI.COMM_WORLD; (0, 1) when run without mpiexec."""
    from mpi4py import MPI
    return MPI.COMM_WORLD.Get_rank(), MPI.COMM_WORLD.Get_size()


def _layout_auto(size, rank):
    """``--layout auto``: the performance model's fastest layout for ``size`` ranks (the
    plan printed first, on rank 0).  A planned field given with it would be overridden:
    refused.  Runs after preflight, so the plan sizes the head with the data's vocabulary."""
    def choose(config):
        default = TrainConfig().planned_layout()
        given = [name for name, value in config.planned_layout().items() if value != default[name]]
        if given:
            raise ConfigError(f"`layout` auto chooses the layout itself; drop `{given[0]}`")
        from minipar.perf.plan import auto_layout
        chosen, text = auto_layout(config, size)
        if rank == 0:
            print(text, flush=True)
            print(f"--layout auto: running {chosen.layout_name()}", flush=True)
        return chosen
    return choose


def config_from_flags(args, rank_and_size=None) -> TrainConfig:
    """The prepared TrainConfig of parsed flags ``args``, or ConfigError."""
    rank, size = rank_and_size or world()
    auto = getattr(args, "layout", "manual") == "auto"
    return prepare(TrainConfig.from_namespace(args), size,
                   choose_layout=_layout_auto(size, rank) if auto else None)
