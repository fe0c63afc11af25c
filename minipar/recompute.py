"""Activation recomputation (checkpointing): trade compute for activation memory.

Backward needs the activations its ops saved in forward.  For a transformer layer
Korthikanti et al. (2022, "Reducing Activation Recomputation in Large Transformer
Models") count, with s = sequence, b = batch, h = hidden, a = heads, 2-byte
activations and 1-byte dropout masks,

    activation bytes per layer ≈ s·b·h·(34 + 5·a·s/h)

where 5·a·s/h is the attention core (scores, softmax, its dropout mask: a·s²·b
numbers, quadratic in s) and 34 the rest (linear inputs, layer norms, GELU, masks).

``checkpoint(fn, *inputs)`` runs ``fn`` without recording a graph and keeps only its
inputs; backward runs ``fn`` again, with gradients on, and back-propagates through
that fresh copy.  Memory per layer falls to its input (2·s·b·h bytes), one layer's
activations live at a time during backward, and the price is one extra forward
(about +33% compute: forward 1 unit, backward 2).

- ``"full"``: each Block is wrapped, ``Recompute(block)``;
- ``"selective"``: only the attention core q, k, v → y is wrapped (the 5·a·s/h term,
  cheap to recompute: no weight matmuls), the rest is kept.

Bit-identical results: the re-run sees the same inputs and, for dropout, the same
random numbers — the generator's state is saved before the forward and restored
for the re-run (then put back where backward found it).  On NumPy the state is
``generator.bit_generator.state``.  CuPy's generators do not expose theirs (its
``bit_generator.state()`` is a method giving a device pointer): ``rng_state`` refuses
them, and ``train`` refuses --recompute with dropout on CuPy.  Without dropout no state
is needed.
"""
from __future__ import annotations

from minipar.autograd import Function, Tensor, set_grad_enabled
from minipar.nn.module import Module, Wrapper, unwrap


def rng_state(generator):
    """A snapshot of ``generator``'s state (NumPy Generator, RandomState, or anything
    with ``bit_generator.state`` or ``get_state``)."""
    if _has_state_property(generator):
        return generator.bit_generator.state
    if hasattr(generator, "get_state"):
        return generator.get_state()
    raise RuntimeError(f"cannot save the state of {type(generator).__name__}: recomputation "
                       "with dropout needs a generator exposing bit_generator.state or get_state()")


def _has_state_property(generator):
    """NumPy's ``bit_generator.state`` is a settable property (a dict); CuPy's XORWOW has a
    ``state()`` *method* (a device pointer), which must not be taken for one."""
    state = getattr(getattr(generator, "bit_generator", None), "state", None)
    return state is not None and not callable(state)


def set_rng_state(generator, state):
    if _has_state_property(generator):
        generator.bit_generator.state = state
    else:
        generator.set_state(state)


class Checkpoint(Function):
    """out = fn(*inputs), keeping only the inputs (and the RNG state) for backward."""

    @staticmethod
    def forward(ctx, fn, generator, *arrays):
        ctx.run, ctx.generator = fn, generator   # (ctx.fn is the node's Function)
        ctx.rng = rng_state(generator) if generator is not None else None
        ctx.save_for_backward(*arrays)
        with set_grad_enabled(False):
            out = fn(*[Tensor(a) for a in arrays])
        return out.data

    @staticmethod
    def backward(ctx, g):
        needs = ctx.needs_input_grad[2:]
        inputs = [Tensor(a, requires_grad=n) for a, n in zip(ctx.saved, needs)]
        if ctx.rng is not None:
            now = rng_state(ctx.generator)
            set_rng_state(ctx.generator, ctx.rng)
        with set_grad_enabled(True):
            out = ctx.run(*inputs)
        if ctx.rng is not None:
            set_rng_state(ctx.generator, now)
        if out.requires_grad:      # parameter gradients land in their .grad here (or, in a
            out.backward(g, deferral=getattr(ctx, "deferral", None))   # zero-bubble pipeline, queue)
        return (None, None) + tuple(t.grad if n else None for t, n in zip(inputs, needs))


def checkpoint(fn, *inputs, generator=None):
    """``fn(*inputs)`` (one Tensor out) without keeping its activations.

    ``generator``: the random generator ``fn`` draws from (dropout), restored for the
    re-run.  As in PyTorch's reentrant checkpoint, at least one input must require a
    gradient (else no graph is recorded and parameters inside ``fn`` get none).
    """
    return Checkpoint.apply(fn, generator, *inputs)


# ---------------------------------------------------------------- applying it to a GPT
class Recompute(Wrapper):
    """``inner`` run through ``checkpoint``: same parameters (same names), no activations
    kept.  A wrapper, not a patched method, so it composes with what wraps it (a ZeRO-3
    unit gathers the weights before the re-run) and ``unwrap`` removes it."""

    def __init__(self, inner, generator=None):
        super().__init__(inner)
        self.generator = generator

    def forward(self, *inputs):
        return checkpoint(self.inner, *inputs, generator=self.generator)


def apply_recompute(model, mode="full"):
    """Wrap ``model``'s blocks for recomputation: "none" | "full" | "selective".

    "full" replaces each ``model.blocks[i]`` by ``Recompute(block)``; "selective" wraps
    each block's attention core, ``attn.core = Recompute(attn.core)``; "none" unwraps.
    Only child modules are swapped (as tensor parallelism swaps layers); no class or
    method is touched, and calling it again switches modes.  Returns the model.
    """
    if mode not in ("none", "full", "selective"):
        raise ValueError(f"recompute mode must be none, full or selective, got {mode!r}")
    generator = getattr(model, "dropout_rng", None)
    if not getattr(getattr(model, "config", None), "dropout", 1.0):
        generator = None  # no dropout, no random numbers to replay (and CuPy's state is not saved)
    for i, block in enumerate(model.blocks):
        block = model.blocks[i] = unwrap(block)
        attn = block.attn
        if not isinstance(getattr(attn, "core", None), Module):
            raise TypeError(f"recomputation needs {type(attn).__name__} to hold its attention "
                            "core as a module (attn.core = AttentionCore(...))")
        attn.core = unwrap(attn.core)
        if mode == "full":
            model.blocks[i] = Recompute(block, generator)
        elif mode == "selective":
            attn.core = Recompute(attn.core, generator)
    return model


def peak_activation_bytes(step):
    """Run ``step()`` (forward + backward) and return (result, peak − live at start):
    the most bytes of activations (and gradients) held at once, from the backend's
    counter of tracked arrays.  Garbage is collected first and the collector paused
    during ``step``, so freeing older garbage cannot make the figure drift."""
    import gc
    from minipar.backend import memory
    gc.collect()
    start = memory.live
    memory.reset_peak()
    enabled = gc.isenabled()
    gc.disable()
    try:
        result = step()
    finally:
        if enabled:
            gc.enable()
    return result, memory.peak - start
