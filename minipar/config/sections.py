"""The five sections of a run's configuration: layout, numerics, model, run, output.

Each section is a frozen dataclass; each of its fields is one setting, declared once:

    tp: int = setting(1, "tensor-parallel size", planned=True)

its default, the help text and choices of its flag (``python -m minipar train --tp``,
built from these fields by ``flags.py``) and whether a planner chooses it.  Each
section checks its own fields, and only them, with ``check()``: pure — the values
alone, no file, no world size — so it can run first, before anything is probed.
The rules that tie two sections together live in one place, ``rules.py``.

``TrainConfig`` (``config/__init__.py``) inherits all five: one flat frozen dataclass
(``config.tp``, ``config.lr``), whose ``check()`` runs each section's.  A section can
also stand alone: ``Layout(tp=3).check()``.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field, fields
from typing import Optional

from minipar.config.error import ConfigError
from minipar.parallel.pipeline.schedules import SCHEDULES

EVAL_BATCHES = 16            # validation batches by default: 16 of the default 8 sequences = 16 KiB
DEFAULT_SCHEDULE = "1f1b"    # the pipeline schedule when none is given
INITIAL_LOSS_SCALE = 2.0 ** 16   # fp16's dynamic loss scale at the first step


def default_microbatches(pp):
    """Micro-batches per step when none are given: 2·pp in a pipeline (its bubble is
    (pp-1)/(m+pp-1), a third at m = 2·pp), 1 otherwise."""
    return 2 * pp if pp > 1 else 1


def setting(default, help, *, choices=None, planned=False, metavar=None, flag=True):
    """One field of a section: its ``default`` (written here, nowhere else) and its flag.

    ``help``      the flag's help (for a bool whose default is True, the help of its
                  ``--no-`` flag, the one a user types); ``%(default)s`` shows the default
    ``choices``   the values the flag accepts
    ``planned``   a planner chooses it: ``--layout auto`` refuses it given, the elastic
                  supervisor rewrites it, a checkpoint records it (``PLANNED``)
    ``flag``      False: set from Python or by the run, not on the command line
    """
    return field(default=default, metadata=dict(help=help, choices=choices, planned=planned,
                                                metavar=metavar, flag=flag))


def value_type(f):
    """The Python type of a field's values: ``Optional[int]`` -> int (the annotations are
    strings here: ``from __future__ import annotations``)."""
    name = f.type.removeprefix("Optional[").removesuffix("]")
    return {"int": int, "float": float, "str": str, "bool": bool}[name]


# -- the checks every section runs on its own fields --------------------------------

def _whole_numbers(config, section):
    """Every ``int`` field holds one: a size of 2.5 (from Python) would otherwise fail
    deep inside a layer's shape or the pipeline's schedule."""
    for f in fields(section):
        value = getattr(config, f.name)
        if value_type(f) is int and value is not None and (
                isinstance(value, bool) or not isinstance(value, numbers.Integral)):
            raise ConfigError(f"`{f.name}` must be a whole number, got {value!r}")


def _at_least(config, low, *names):
    """Each setting given is >= ``low`` (nan too is refused: it is not >= anything)."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not value >= low:
            raise ConfigError(f"`{name}` must be >= {low}, got {value}")


def _finite_positive(config, *names):
    """Each setting given is a finite number > 0: an lr of nan trains nan losses, exit 0."""
    for name in names:
        value = getattr(config, name)
        if value is not None and not (math.isfinite(value) and value > 0):
            raise ConfigError(f"`{name}` must be a finite number > 0, got {value}")


def _one_of(config, section, *names):
    """Each setting given names one of its field's choices.  The command line's choices
    allow nothing else; this catches a config built in Python before the class that
    reads the name (the synchroniser, the schedule) refuses it after the first message."""
    choices = {f.name: f.metadata["choices"] for f in fields(section)}
    for name in names:
        value = getattr(config, name)
        if value is not None and value not in choices[name]:
            raise ConfigError(f"`{name}` must be one of {', '.join(map(str, choices[name]))}, "
                              f"got {value!r}")


def _default(section, name):
    return next(f.default for f in fields(section) if f.name == name)


# -- the sections -------------------------------------------------------------------

@dataclass(frozen=True)
class Layout:
    """How the ranks share the work: the parallel sizes, the pipeline's schedule, ZeRO,
    recomputation, and how data-parallel gradients travel."""
    dp: Optional[int] = setting(None, "data-parallel size (default: all ranks left over by "
                                "cp·tp·pp)", planned=True)
    cp: int = setting(1, "context-parallel size: the sequence split over cp ranks (ring attention)",
                      planned=True)
    cp_split: str = setting("zigzag", "how the sequence is cut: zigzag balances the causal "
                            "mask's work (default %(default)s)", choices=("zigzag", "contiguous"))
    cp_kind: str = setting("ring", "context parallelism's kind: ring (K/V blocks passed round the "
                           "cp ranks) or ulysses (an all-to-all turns positions into heads around "
                           "attention; see --cp-ulysses) (default %(default)s)",
                           choices=("ring", "ulysses"), planned=True)
    cp_ulysses: Optional[int] = setting(None, "with --cp-kind ulysses: the Ulysses degree U, "
                                        "dividing cp (default cp); below cp, Ulysses runs in "
                                        "groups of U ranks and the ring across the cp/U groups",
                                        planned=True)
    tp: int = setting(1, "tensor-parallel size", planned=True)
    sequence_parallel: bool = setting(False, "with --tp: also split the sequence between the "
                                      "tensor-parallel ranks outside attention and the MLP "
                                      "(norms, dropout, residuals)", planned=True)
    pp: int = setting(1, "pipeline stages", planned=True)
    chunks: int = setting(1, "model chunks per pipeline rank (--schedule interleaved)", planned=True)
    schedule: Optional[str] = setting(None, f"pipeline schedule (default {DEFAULT_SCHEDULE}; "
                                      "needs --pp or --chunks)", choices=SCHEDULES, planned=True)
    microbatches: Optional[int] = setting(None, "micro-batches per step in the pipeline "
                                          "(default 2·pp)", planned=True)
    ep: int = setting(1, "expert-parallel size: the experts of every MoE block split over ep "
                      "of the data-parallel ranks, tokens sent to them by all-to-all",
                      planned=True)
    zero: int = setting(0, "ZeRO stage: shard the optimizer state (1), and the gradients (2), "
                        "and the weights (3) over the data-parallel ranks", choices=(0, 1, 2, 3),
                        planned=True)
    grad_accum: int = setting(1, "micro-batches per optimizer step", planned=True)
    recompute: str = setting("none", "activation recomputation: none, full (every block's "
                             "forward again in backward) or selective (attention's core only)",
                             choices=("none", "full", "selective"), planned=True)
    balance: bool = setting(False, "give each data-parallel replica a share of the batch by "
                            "its speed")
    bucket_mb: Optional[float] = setting(None, "gradient bucket size in MiB (default: the "
                                         "performance model's choice for the layout)")
    overlap: bool = setting(True, "all-reduce after backward instead of from gradient hooks")
    comm_algorithm: str = setting("auto", "data parallelism's all-reduce (default: the cost "
                                  "model's choice per size)",
                                  choices=("auto", "ring", "tree", "recursive_doubling",
                                           "rabenseifner", "hierarchical"))
    grad_compression: str = setting("none", "compress data-parallel gradients (DDP comm hooks, "
                                    "error feedback)",
                                    choices=("none", "fp16", "bf16", "int8", "topk", "powersgd"))
    compression_ratio: float = setting(0.01, "topk: the fraction of each bucket kept "
                                       "(default %(default)s)")
    powersgd_rank: int = setting(4, "powersgd: the rank of each bucket's low-rank factors "
                                 "(default %(default)s)")
    compression_start: Optional[int] = setting(None, "uncompressed warm-up steps (default: 10 "
                                               "for powersgd, 0 otherwise)")

    @property
    def pipelined(self):
        return self.pp > 1 or self.chunks > 1

    def check(self):
        """The layout's own fields, alone and with each other."""
        _whole_numbers(self, Layout)
        _at_least(self, 1, "dp", "cp", "cp_ulysses", "tp", "pp", "ep", "chunks", "microbatches",
                  "grad_accum")
        _finite_positive(self, "bucket_mb")
        _one_of(self, Layout, "zero", "recompute", "schedule", "cp_split", "cp_kind",
                "grad_compression")
        from minipar.comm.algorithms import _algorithm as all_reduce_algorithm
        try:
            all_reduce_algorithm(self.comm_algorithm)
        except (TypeError, ValueError) as err:
            raise ConfigError(f"`comm_algorithm`: {err}") from None
        if self.sequence_parallel and self.tp == 1:
            raise ConfigError("`sequence_parallel` needs `tp` T with T >= 2")
        if self.cp == 1 and self.cp_split != _default(Layout, "cp_split"):
            raise ConfigError("`cp_split` belongs to context parallelism; set `cp` C or leave it out")
        self._check_context_kind()
        if self.schedule is not None and not self.pipelined:
            raise ConfigError("`schedule` belongs to pipeline parallelism; set `pp` P or leave it out")
        if self.zero > 0 and (self.comm_algorithm != "auto" or not self.overlap):
            raise ConfigError("`comm_algorithm` and `no_overlap` set data parallelism's all-reduce "
                              "(`zero` 0); ZeRO reduce-scatters (ring) from the gradient hooks")
        if self.zero == 3 and self.bucket_mb is not None:
            raise ConfigError("`bucket_mb` does not apply to `zero` 3, whose units are the layers")
        if self.balance and self.pipelined:
            raise ConfigError("`balance` with pipeline parallelism is not built (it would move "
                              "layers between stages); use it with data parallelism")
        if self.pipelined:
            self._check_pipeline()
        self._check_compression()

    def _check_context_kind(self):
        if self.cp == 1 and self.cp_kind != _default(Layout, "cp_kind"):
            raise ConfigError("`cp_kind` belongs to context parallelism; set `cp` C or leave it out")
        if self.cp_ulysses is not None and self.cp_kind != "ulysses":
            raise ConfigError("`cp_ulysses` is the Ulysses degree: it needs `cp_kind` ulysses")
        if self.cp_ulysses is not None and self.cp % self.cp_ulysses:
            raise ConfigError(f"`cp_ulysses` {self.cp_ulysses} must divide `cp` {self.cp} (Ulysses "
                              f"in groups of cp_ulysses ranks, the ring across the groups)")

    def _check_pipeline(self):
        pp, chunks = self.pp, self.chunks
        m = self.microbatches if self.microbatches is not None else default_microbatches(pp)
        schedule = self.schedule or DEFAULT_SCHEDULE
        if chunks > 1 and schedule != "interleaved":
            raise ConfigError(f"`chunks` {chunks} needs `schedule` interleaved")
        if schedule == "interleaved" and chunks < 2:
            raise ConfigError("`schedule` interleaved needs `chunks` V with V >= 2")
        if schedule == "interleaved" and m % pp:
            raise ConfigError(f"`schedule` interleaved needs `microbatches` divisible by `pp` {pp}, "
                              f"got {m}")
        if self.grad_accum != 1:
            raise ConfigError("with `pp`, micro-batches do the accumulation: use `microbatches` "
                              "instead of `grad_accum`")
        if self.zero == 3:
            raise ConfigError("`zero` 3 with `pp` is not supported (ZeRO-3 gathers whole-model "
                              "units); use `zero` 1 or 2 with pipeline parallelism")

    def _check_compression(self):
        if self.grad_compression == "none":
            changed = [name for name in ("compression_ratio", "powersgd_rank", "compression_start")
                       if getattr(self, name) != _default(Layout, name)]
            if changed:
                raise ConfigError(f"`{changed[0]}` sets gradient compression; add "
                                  "`grad_compression` METHOD")
            return
        if self.zero:
            raise ConfigError(f"`grad_compression` {self.grad_compression} with `zero` {self.zero} "
                              "is not supported: ZeRO reduce-scatters gradients into shards, while "
                              "the hooks replace DDP's all-reduce of whole buckets; use `zero` 0")
        if not 0 < self.compression_ratio <= 1:
            raise ConfigError(f"`compression_ratio` must be in (0, 1], got {self.compression_ratio}")
        _at_least(self, 1, "powersgd_rank")
        _at_least(self, 0, "compression_start")


@dataclass(frozen=True)
class Numerics:
    """How the numbers are computed: the dtype, fp16's loss scale, the attention kernel
    and the array library."""
    precision: str = setting("fp32", "the dtype of the compute; fp16 and bf16 keep fp32 master "
                             "weights (default %(default)s)", choices=("fp32", "fp16", "bf16", "fp64"))
    initial_loss_scale: Optional[float] = setting(None, "fp16: the dynamic loss scale to start "
                                                  f"from (default {INITIAL_LOSS_SCALE:g})")
    attention: str = setting("naive", "attention kernel: naive (the whole score matrix) or "
                             "flash (tiled, online softmax)", choices=("naive", "flash"))
    backend: Optional[str] = setting(None, "array library (default: $MINIPAR_BACKEND or numpy)",
                                     choices=("numpy", "cupy"))
    share_gpus: bool = setting(False, "cupy: let several ranks of a node use one GPU (each rank "
                               "takes GPU local rank %% GPUs; without this flag a node with more "
                               "ranks than GPUs is refused)")
    transport: Optional[str] = setting(None, "cupy: how device arrays reach MPI — cuda-aware "
                                       "(MPI reads GPU memory; auto takes it where MPI says it "
                                       "can), staging (pinned host buffers, chunks pipelined on "
                                       "side streams), pageable (a host copy per message), nccl "
                                       "(the collectives' messages over NCCL; a GPU per rank) "
                                       "(default: $MINIPAR_TRANSPORT or auto)",
                                       metavar="NAME")   # checked by the transport's own list

    def check(self):
        """The numerics' own fields, alone and with each other."""
        from minipar.backend import backend_name, dtype_of
        from minipar.comm.device_paths import check_transport
        _one_of(self, Numerics, "attention", "backend")
        if self.transport is not None:
            try:
                check_transport(self.transport)
            except ValueError as err:
                raise ConfigError(f"`transport`: {err}") from None
        if self.transport == "nccl" and self.share_gpus:
            raise ConfigError("`transport` nccl with `share_gpus`: NCCL refuses two ranks on one "
                              "GPU; give each rank its own GPU, or use `transport` staging")
        if self.transport == "nccl" and (self.backend or backend_name()) != "cupy":
            raise ConfigError("`transport` nccl moves device arrays: it needs `backend` cupy")
        try:
            dtype_of(self.precision)          # bf16 also needs ml_dtypes: said here, not later
        except (ValueError, RuntimeError) as err:
            raise ConfigError(f"`precision`: {err}") from None
        _finite_positive(self, "initial_loss_scale")
        if self.initial_loss_scale is not None and self.precision != "fp16":
            raise ConfigError("`initial_loss_scale` needs `precision` fp16 (the only one scaled)")


@dataclass(frozen=True)
class Model:
    """The model: a preset (``nn.PRESETS``) and the sizes that override it (None: the
    preset's)."""
    model: str = setting("llama-small", "preset (default %(default)s): tiny, small, medium, "
                         "gpt2, llama-tiny, llama-small, llama-medium")
    arch: Optional[str] = setting(None, "the block: gpt2 (LayerNorm, learned positions, GELU) or "
                                  "llama (RMSNorm, RoPE, SwiGLU, grouped-query attention); "
                                  "default: the preset's", choices=("gpt2", "llama"))
    n_layer: Optional[int] = setting(None, "transformer blocks (default: the preset's)")
    d_model: Optional[int] = setting(None, "the residual stream's width (default: the preset's)")
    n_head: Optional[int] = setting(None, "attention heads (default: the preset's)")
    n_kv_head: Optional[int] = setting(None, "llama: key/value heads (default n_head)")
    rope_theta: Optional[float] = setting(None, "llama: RoPE's base (default 10000)")
    d_ff: Optional[int] = setting(None, "llama: SwiGLU's hidden width (default 8/3·d_model to a "
                                  "multiple of 64)")
    seq_len: Optional[int] = setting(None, "tokens per sequence (default: the preset's)")
    dropout: Optional[float] = setting(None, "dropout probability (default: the preset's, 0)")
    tie_weights: Optional[bool] = setting(None, "the head reuses the token embedding's weight")
    vocab_size: Optional[int] = setting(None, "the vocabulary; None: the data's (256 bytes, or "
                                        "the tokenizer's), filled in by preflight", flag=False)
    pad_vocab_to: Optional[int] = setting(None, "embedding/head rows padded to a multiple of N, "
                                          "the padding masked out of the loss (default: 64 on "
                                          "--backend cupy, 1 on numpy)", metavar="N")
    moe_experts: int = setting(0, "llama: routed experts of the mixture-of-experts MLP "
                               "(default %(default)s: dense)", metavar="E")
    moe_top_k: int = setting(2, "experts per token, their weights renormalised to 1 "
                             "(default %(default)s)", metavar="K")
    moe_every: int = setting(1, "the MoE MLP in every N-th block (default %(default)s)",
                             metavar="N")
    moe_shared_experts: int = setting(0, "experts every token goes through, added to the routed "
                                      "ones (default %(default)s)", metavar="S")
    moe_balance: str = setting("aux", "load balancing: aux (Switch/GShard loss, per sequence), "
                               "bias (DeepSeek-V3's loss-free: a per-expert bias on the scores "
                               "that select, moved toward balance after each step) or none "
                               "(default %(default)s)", choices=("aux", "bias", "none"))
    moe_aux_coef: float = setting(0.01, "the balancing loss's weight (default %(default)s)")
    moe_bias_rate: float = setting(1e-3, "--moe-balance bias: each expert's bias moves by this "
                                   "per step (default %(default)s)", metavar="RATE")
    moe_capacity_factor: float = setting(0.0, "per sequence an expert takes at most "
                                         "ceil(C·k·T/E) assignments (default %(default)s: "
                                         "dropless)", metavar="C")

    def gpt_config(self, attention="naive", pad_vocab_to=None):
        """The GPTConfig: the preset with this section's overrides (``pad_vocab_to``: the
        padding multiple the numerics choose, else this section's)."""
        from minipar.nn import config_from_preset
        pad = self.pad_vocab_to if pad_vocab_to is None else pad_vocab_to
        return config_from_preset(self.model, n_layer=self.n_layer, d_model=self.d_model,
                                  n_head=self.n_head, seq_len=self.seq_len, dropout=self.dropout,
                                  tie_weights=self.tie_weights, attention=attention,
                                  vocab_size=self.vocab_size, arch=self.arch,
                                  n_kv_head=self.n_kv_head, rope_theta=self.rope_theta,
                                  d_ff=self.d_ff, pad_vocab_to=pad,
                                  moe_experts=self.moe_experts, moe_top_k=self.moe_top_k,
                                  moe_every=self.moe_every,
                                  moe_shared_experts=self.moe_shared_experts,
                                  moe_balance=self.moe_balance, moe_aux_coef=self.moe_aux_coef,
                                  moe_capacity_factor=self.moe_capacity_factor,
                                  moe_bias_rate=self.moe_bias_rate)

    def check(self):
        """The model can be built: GPTConfig's own checks (sizes >= 1, heads dividing the
        width, llama's fields only with llama, ...)."""
        _whole_numbers(self, Model)
        try:
            self.gpt_config()
        except ValueError as err:
            raise ConfigError(str(err)) from None


@dataclass(frozen=True)
class Run:
    """The training run: its length, batch, optimizer, data and memory limit."""
    steps: int = setting(1500, "total steps (the LR schedule spans them)")
    stop_at: Optional[int] = setting(None, "end this run at that step (saving with --save); "
                                     "resume later")
    batch_size: int = setting(8, "global batch, in sequences (default %(default)s)")
    lr: float = setting(5e-3, "peak learning rate (default %(default)s)")
    warmup: Optional[int] = setting(None, "warm-up steps (default: steps/10)")
    weight_decay: float = setting(0.1, "AdamW's decoupled weight decay (default %(default)s; 0: off)")
    grad_clip: float = setting(1.0, "clip the global gradient norm to this (default %(default)s; "
                               "0: off)")
    seed: int = setting(0, "seed of the weights, the batches and dropout (default %(default)s)")
    data: str = setting("stdlib", "'stdlib' (the standard library in BPE tokens, built once and "
                        "cached), 'stdlib-bytes' (the same text as bytes), a text file or a "
                        "folder (bytes), or a folder written by `minipar tokenize` (tokens)")
    eval_batches: Optional[int] = setting(None, f"validation batches after training (default "
                                          f"{EVAL_BATCHES}; 0 to skip)")
    mem_per_rank: Optional[float] = setting(None, "memory one rank may use, in GiB, for the check "
                                            "before the run (default: the GPU's free memory, or "
                                            "this node's RAM / its ranks)", metavar="GIB")
    skip_memory_check: bool = setting(False, "run even when the memory model predicts more than "
                                      "a rank may use")

    def check(self):
        """The run's own fields, alone and with each other."""
        _whole_numbers(self, Run)
        _at_least(self, 1, "steps", "batch_size")
        _finite_positive(self, "lr")
        for name in ("weight_decay", "grad_clip"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"`{name}` must be a finite number >= 0 (0 turns it off), "
                                  f"got {value}")
        _at_least(self, 0, "warmup", "eval_batches", "seed")
        if self.seed >= 2 ** 63:
            raise ConfigError(f"`seed` must be below 2^63, got {self.seed}")
        if self.stop_at is not None and not 1 <= self.stop_at <= self.steps:
            raise ConfigError(f"`stop_at` must be in [1, steps = {self.steps}], got {self.stop_at}")
        _finite_positive(self, "mem_per_rank")
        if self.mem_per_rank is not None and self.skip_memory_check:
            raise ConfigError("`mem_per_rank` sets the limit of the memory check that "
                              "`skip_memory_check` turns off; drop one")


@dataclass(frozen=True)
class Output:
    """What the run writes and reads back: logs, traces, checkpoints, the progress bar,
    and how long a rank waits for a peer."""
    log_json: Optional[str] = setting(None, "write one JSON object per step to this file")
    trace: Optional[str] = setting(None, "Chrome trace JSON of the pipeline schedule")
    peak_tflops: Optional[float] = setting(None, "peak FLOP/s of one rank, for MFU")
    save: Optional[str] = setting(None, "directory to write the final checkpoint to")
    save_every: int = setting(0, "also save every K steps")
    keep: int = setting(2, "complete checkpoints kept in --save (default %(default)s; 0: all)")
    save_async: bool = setting(False, "write checkpoints from a background thread while the next "
                               "forward and backward run")
    resume: Optional[str] = setting(None, "checkpoint directory to continue from")
    quiet: bool = setting(False, "no progress bar")
    hang_timeout: float = setting(300.0, "seconds a rank may wait on a peer before the job ends, "
                                  "naming both (default %(default)s; 0: no limit)")

    def check(self):
        """The outputs' own fields, alone and with each other."""
        _whole_numbers(self, Output)
        _at_least(self, 0, "save_every", "keep", "hang_timeout")
        _finite_positive(self, "peak_tflops")
        if self.save_every and not self.save:
            raise ConfigError("`save_every` needs `save` DIR")
        if self.save_async and not self.save:
            raise ConfigError("`save_async` needs `save` DIR")


SECTIONS = (Layout, Numerics, Model, Run, Output)
# the fields a planner chooses (`--layout auto`, the elastic supervisor), in their order
PLANNED = tuple(f.name for f in fields(Layout) if f.metadata["planned"])
