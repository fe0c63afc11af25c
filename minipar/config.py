"""``TrainConfig``: everything a training run is, frozen, built once and checked once.

    config = TrainConfig(tp=2, pp=2, microbatches=4, precision="fp64")   # from Python
    config = config.resolve(world_size=8)      # dp filled in, defaults chosen, every check
    train(config)

The command line builds the same object (``TrainConfig.from_namespace``).  ``resolve``
returns a new config with the layout-dependent defaults filled in (dp = world/(tp·pp),
microbatches = 2·pp, the schedule, the bucket size, ...) or raises ``ConfigError``
before any message is sent.  Errors speak in the config's own field names, written
`like_this`; the CLI turns them into flags (`n_head` -> --n-head).  The checks are
pure: the world size and the arguments, nothing else, so every rank stops alike.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Optional

from minipar.config_checks import ConfigError, check


@dataclass(frozen=True)
class TrainConfig:
    # layout
    dp: Optional[int] = None            # None: all ranks left over by cp·tp·pp
    cp: int = 1                         # context parallel: the sequence split over cp ranks
    cp_split: str = "zigzag"            # zigzag (balanced under the causal mask) | contiguous
    tp: int = 1
    sequence_parallel: bool = False
    pp: int = 1
    chunks: int = 1
    schedule: Optional[str] = None      # afab | 1f1b | interleaved | zb-h1 (default 1f1b)
    microbatches: Optional[int] = None
    zero: int = 0
    grad_accum: int = 1
    balance: bool = False               # data-parallel shares of the batch by measured speed
    bucket_mb: Optional[float] = None
    overlap: bool = True
    comm_algorithm: str = "auto"
    grad_compression: str = "none"      # none | fp16 | bf16 | int8 | topk | powersgd (DDP hooks)
    compression_ratio: float = 0.01     # topk: the fraction of each bucket kept
    powersgd_rank: int = 4
    compression_start: Optional[int] = None   # uncompressed warm-up steps (powersgd: 10)
    # numerics
    precision: str = "fp32"
    initial_loss_scale: Optional[float] = None
    recompute: str = "none"
    attention: str = "naive"
    backend: Optional[str] = None
    # model
    model: str = "llama-small"          # chosen by measurement: benchmarks/first_command.py
    arch: Optional[str] = None          # gpt2 | llama; None: the preset's
    n_layer: Optional[int] = None
    d_model: Optional[int] = None
    n_head: Optional[int] = None
    seq_len: Optional[int] = None
    dropout: Optional[float] = None
    tie_weights: Optional[bool] = None
    n_kv_head: Optional[int] = None     # llama: key/value heads (grouped-query attention)
    rope_theta: Optional[float] = None  # llama: RoPE's base (10000)
    d_ff: Optional[int] = None          # llama: SwiGLU's hidden width
    vocab_size: Optional[int] = None    # None: the data's (256 bytes, or the tokenizer's)
    pad_vocab_to: Optional[int] = None  # None: 64 on the cupy backend, 1 on numpy (nn/gpt.py)
    # run
    steps: int = 1500                   # llama-small on --data stdlib (BPE 4,096), dp2: val 1.64 bits/byte
    stop_at: Optional[int] = None
    batch_size: int = 8
    lr: float = 5e-3
    warmup: Optional[int] = None
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    data: str = "stdlib"
    eval_batches: Optional[int] = None
    mem_per_rank: Optional[float] = None      # GiB a rank may use (default: resources.py)
    skip_memory_check: bool = False           # run even if the memory model says it won't fit
    # output
    log_json: Optional[str] = None
    trace: Optional[str] = None
    peak_tflops: Optional[float] = None
    save: Optional[str] = None
    save_every: int = 0
    keep: int = 2                       # complete checkpoints kept in `save` (0: all)
    save_async: bool = False            # write checkpoints in a background thread
    resume: Optional[str] = None
    quiet: bool = False
    hang_timeout: float = 300.0         # seconds a rank may wait on a peer; 0: no limit

    @classmethod
    def from_namespace(cls, ns):
        """From an argparse namespace (or any object) with these attribute names."""
        values = {f.name: getattr(ns, f.name) for f in fields(cls) if hasattr(ns, f.name)}
        if hasattr(ns, "no_overlap"):
            values["overlap"] = not ns.no_overlap
        return cls(**values)

    def to_dict(self):
        return asdict(self)

    def model_config(self):
        """The GPTConfig: the preset with this config's overrides."""
        from minipar.nn import config_from_preset
        return config_from_preset(self.model, n_layer=self.n_layer, d_model=self.d_model,
                                  n_head=self.n_head, seq_len=self.seq_len, dropout=self.dropout,
                                  tie_weights=self.tie_weights, attention=self.attention,
                                  vocab_size=self.vocab_size, arch=self.arch,
                                  n_kv_head=self.n_kv_head, rope_theta=self.rope_theta,
                                  d_ff=self.d_ff, pad_vocab_to=self.vocab_multiple())

    def vocab_multiple(self):
        """What the vocabulary is padded to a multiple of: ``pad_vocab_to``, else 64 where
        the head's GEMM runs on a GPU (its tensor-core tiles; GPT-2's 50257 -> 50304) and
        1 on NumPy, where padding would only add work and change nothing else."""
        if self.pad_vocab_to is not None:
            return self.pad_vocab_to
        from minipar.backend import backend_name
        return 64 if (self.backend or backend_name()) == "cupy" else 1

    def layout_name(self):
        """A short name of the layout, e.g. "dp2·tp2·pp2 zero1 sp" or "single"."""
        parts = [f"{k}{v}" for k, v in (("dp", self.dp), ("cp", self.cp), ("tp", self.tp),
                                        ("pp", self.pp)) if v and v > 1]
        name = "·".join(parts) or "single"
        extras = [f"chunks{self.chunks}" if self.chunks > 1 else "",
                  self.schedule if self.pipelined and self.schedule else "",
                  f"zero{self.zero}" if self.zero else "", "sp" if self.sequence_parallel else "",
                  f"recompute-{self.recompute}" if self.recompute != "none" else "",
                  f"accum{self.grad_accum}" if self.grad_accum > 1 else ""]
        return " ".join([name] + [e for e in extras if e])

    @property
    def pipelined(self):
        return self.pp > 1 or self.chunks > 1

    @property
    def world_size(self):
        return (self.dp or 1) * self.cp * self.tp * self.pp

    def resolve(self, world_size):
        """Checked, with every default that depends on the layout filled in."""
        return check(self, world_size)
