"""A mixture-of-experts MLP for the llama block: a router sends each token to k of E
SwiGLU experts; S shared experts see every token.

    p = softmax(x W_router)                    (T, E), in float32 at least; W_router: d x E, no bias
    e_1..e_k = the k largest p[t]              top-k, per token
    w_j = p[t, e_j] / Σ_j' p[t, e_j']          the k weights renormalised to 1 (Mixtral)
    moe(x)[t] = Σ_j w_j · expert_{e_j}(x[t]) + Σ_s shared_s(x[t])       (DeepSeek's shared)

Dispatch in one process: for each expert, gather the rows of the tokens assigned to it,
run the expert on them, and put its output rows back in (token, choice) order; the
combine is Σ_j w_j · out[t, j].  Gather and combine are the autograd's ``getitem`` and
``concat`` (their backward scatter-adds), so the router gets its gradient through w.
Every expert runs every step, on zero rows if none came: each parameter gets a gradient
(zeros), as data parallelism's hooks expect.

Capacity (``capacity_factor`` C > 0; C = 0 is dropless).  Per sequence each expert takes
at most ⌈C·k·T/E⌉ assignments.  Which are dropped is fixed: assignments are taken in the
order (choice j, position t) — every first choice before any second choice, then by
position in the sequence — and an expert takes them until it is full.  A dropped
assignment contributes nothing: its weight is not renormalised away over the kept ones.

Balancing (``balance`` "aux": the Switch/GShard auxiliary loss), per sequence of T tokens:

    f_i = (assignments of the sequence's k·T that chose expert i) / (k·T)    Σ_i f_i = 1
    P_i = (1/T) Σ_t p[t, i]
    aux = coef · E · Σ_i f_i · P_i        (1·coef when routing is uniform)

f_i counts the router's choices before any capacity drop and carries no gradient; P_i
does.  The layer's aux loss is the mean of aux over the sequences of the batch, so no
statistic crosses sequences: a batch split over ranks or micro-batches gives what the
whole batch gives.  A sequence split over ranks (context parallelism) has its choices
gathered and its P summed over them first (``sequence_split``, ``parallel/moe_split.py``).

How the aux loss joins the training loss L = cross-entropy + Σ_layers aux.  Its value
is added to the loss as a number (the log shows the total); its gradient enters at the
layer itself: the layer's output passes through ``AttachAux``, an identity in forward
whose backward also hands aux the gradient dL_seed/dL that the loss received
(``RecordLossSeed`` keeps it: 1, or fp16's loss scale, or 1/micro-batches — whatever
the training loop seeds backward with; the loss's node runs first in backward, before
any block's).  So the aux gradient lives inside the block's own graph: a block
recomputed in backward (``--recompute full``) or run as a ZeRO-3 unit carries it like
any other gradient (Megatron's MoEAuxLossAutoScaler, with the scale read from the loss).

Loss-free balancing (``balance`` "bias", DeepSeek-V3): a per-expert bias b, state and no
parameter, is added to the probabilities for the selection only,

    e_1..e_k = the k largest p[t] + b          the weights w_j still from p, unbiased

and after each optimizer step moves toward balance by the load of the step's global batch,

    b_e ← b_e + rate · sign(mean_e' load_e' − load_e)

load_e = the router's choices of expert e (before any capacity drop: a drop would hide
how over-chosen an expert is) over every micro-batch of every data rank, so the update is
the same under every layout.  An over-loaded expert's bias falls, an under-loaded one's
rises; no gradient is involved, so the loss stays the language model's alone.
"""
from __future__ import annotations

import math

import numpy as np

from minipar.autograd import ops
from minipar.autograd.function import Function, is_grad_enabled
from minipar.autograd.tensor import Tensor
from minipar.backend import xp
from minipar.nn.layers import Linear
from minipar.nn.module import Module


def route(probs, top_k, bias=None):
    """The k experts of each token, (..., k): the largest probabilities first (ties to the
    lower expert index: a stable sort); with ``bias`` (E,), the largest of probs + bias."""
    scores = probs if bias is None else probs + bias
    order = xp.argsort(-scores, axis=-1, kind="stable") if xp is np else xp.argsort(-scores, axis=-1)
    return order[..., :top_k]


def update_selection_bias(moe, load):
    """Loss-free balancing's step: b_e += rate · sign(mean(load) − load_e), where ``load``
    (E,) is the step's choices of each expert over the global batch."""
    moe.selection_bias = moe.selection_bias + moe.bias_rate * xp.sign(load.mean() - load)


def capacity(capacity_factor, top_k, seq_len, n_experts):
    """Assignments one expert takes per sequence: ⌈C·k·T/E⌉, or None (dropless, C = 0)."""
    if capacity_factor == 0:
        return None
    return math.ceil(capacity_factor * top_k * seq_len / n_experts)


def kept_assignments(chosen, n_experts, cap):
    """(B, T, k) booleans: which assignments ``chosen`` (B, T, k) of expert ids survive a
    capacity of ``cap`` per expert per sequence.  Each expert takes its assignments in
    the order (choice j, position t) until it holds ``cap``."""
    b, t, k = chosen.shape
    if cap is None:
        return xp.ones(chosen.shape, dtype=bool)
    in_order = chosen.transpose(0, 2, 1).reshape(b, k * t)          # j-major, then t
    one_hot = in_order[..., None] == xp.arange(n_experts)           # (B, k·T, E)
    rank = xp.cumsum(one_hot, axis=1)                               # 1-based within the expert
    keep = (one_hot & (rank <= cap)).any(axis=-1)                   # (B, k·T)
    return keep.reshape(b, k, t).transpose(0, 2, 1)


def balance_loss(probs, chosen, n_experts, split=None):
    """Per sequence E·Σ_i f_i·P_i, averaged over the sequences: probs (B, T, E) a Tensor,
    chosen (B, T, k) an array (the docstring of this module has f and P).  ``split``: the
    sequences' positions are spread over ranks (``parallel/moe_split.py``); ``chosen``
    is then the whole sequences', ``probs`` this rank's positions'."""
    b, t, k = chosen.shape
    counts = (chosen[..., None] == xp.arange(n_experts)).sum(axis=(1, 2))      # (B, E)
    f = (counts / (k * t)).astype(probs.dtype)
    position_sum = ops.sum(probs, axis=1)                                        # (B, E)
    if split is not None:
        position_sum = split.sum(position_sum)
    mean_p = ops.mul(position_sum, 1.0 / t)
    per_sequence = ops.sum(ops.mul(mean_p, Tensor(f)), axis=-1)                  # (B,)
    return ops.mul(ops.mean(per_sequence), float(n_experts))


class LossSeed:
    """The gradient the training loss received in the latest backward (dL_seed/dL)."""
    value = None


class RecordLossSeed(Function):
    """loss -> loss; backward keeps the incoming gradient in each of ``seeds``."""

    @staticmethod
    def forward(ctx, loss, seeds):
        ctx.seeds = seeds
        return loss

    @staticmethod
    def backward(ctx, g):
        for seed in ctx.seeds:
            seed.value = g
        return g, None


class AttachAux(Function):
    """out -> out; backward: g to out, and the loss's seed to the aux loss (a scalar)."""

    @staticmethod
    def forward(ctx, out, aux, seed, scale=1):
        ctx.seed, ctx.aux_dtype, ctx.scale = seed, aux.dtype, scale
        return out

    @staticmethod
    def backward(ctx, g):
        if ctx.seed.value is None:
            raise RuntimeError("the MoE balancing loss has no gradient to take: the training "
                               "loss was not made by Llama.loss")
        seed = ctx.seed.value * ctx.scale
        return g, xp.asarray(seed, dtype=ctx.aux_dtype).reshape(()), None, None


def dispatch_local(moe, tokens, slot_expert, keep, k):
    """(n·k, d): the expert output of each (token, choice) slot, zeros where the
    assignment was dropped — every expert on this rank, each on the rows routed to it
    (``getitem`` gathers them; its backward scatter-adds).  Expert parallelism
    replaces it (``parallel/experts.py``)."""
    d = tokens.shape[1]
    outputs, where = [], xp.full(len(slot_expert), -1, dtype=np.int64)   # slot -> row
    placed = 0
    for e, expert in enumerate(moe.experts):
        slots = xp.nonzero((slot_expert == e) & keep)[0]               # token·k + j
        outputs.append(expert(ops.getitem(tokens, slots // k)))
        where[slots] = placed + xp.arange(len(slots))
        placed += len(slots)
    outputs.append(Tensor(xp.zeros((1, d), dtype=tokens.dtype)))      # the dropped slots' row
    where[where < 0] = placed
    return ops.getitem(ops.concat(outputs, axis=0), where)


class StepLoad:
    """What one MoE layer routed in one training step, summed over the step's forwards
    on this rank's tokens (its micro-batches):

        received (E,)   assignments each expert took, after any capacity drop
        chosen (E,)     the router's choices of each expert, before any drop
        dropped         assignments the capacity dropped
        aux_sum         Σ aux · sequences: the balancing loss weighted by the sequences it
                        averaged (0 without the aux loss)
        sequences       the sequences routed

    Only a forward that records a graph counts, so each micro-batch counts once: a block
    recomputed in backward runs twice, its first forward without a graph; evaluation
    records none.  ``reset`` starts a step (``train_step``)."""

    def __init__(self, n_experts):
        self.n_experts = n_experts
        self.reset()

    def reset(self):
        self.received = xp.zeros(self.n_experts, dtype=np.int64)
        self.chosen = xp.zeros(self.n_experts, dtype=np.int64)
        self.dropped, self.aux_sum, self.sequences = 0, 0.0, 0

    def count(self, received, dropped, sequences, chosen):
        if is_grad_enabled():
            self.received = self.received + received
            self.chosen = self.chosen + chosen
            self.dropped += dropped
            self.sequences += sequences

    def count_aux(self, aux, sequences):
        if is_grad_enabled():
            self.aux_sum = self.aux_sum + aux * sequences


def moe_modules(module):
    """The MoE layers inside ``module`` (through wrappers and lists), in no set order."""
    stack, found = [module], []
    while stack:
        m = stack.pop()
        if isinstance(m, MoE):
            found.append(m)
        stack.extend(child for _, child in m.children())
    return found


def moe_layers(module):
    """[(name, MoE)] of the MoE layers ``module`` holds, in order, each named as its
    parameters are (``blocks.3.mlp``), whatever wraps it and whichever pipeline stage
    holds it."""
    found = {id(m.router.weight): m for m in moe_modules(module)}
    suffix = ".router.weight"
    return [(name[:-len(suffix)], found[id(p)]) for name, p in module.named_parameters()
            if id(p) in found and name.endswith(suffix)]


def add_balancing_losses(model, loss):
    """The training loss: ``loss`` plus the balancing loss of each MoE layer of ``model``
    in this forward (their values; their gradients enter at the layers, from the seed
    this loss's backward records — ``RecordLossSeed``).  Evaluation (no gradients), a
    dense model, or a model whose ``aux_in_loss`` a pipeline turned off (it adds its
    stages' balancing losses and seeds them itself) keep ``loss`` as it is."""
    if not getattr(model, "aux_in_loss", True):
        return loss
    layers = moe_modules(model)
    aux = [m.aux_loss for m in layers if m.aux_loss is not None]
    for m in layers:
        m.aux_loss, m.seed.value = None, None     # this loss's backward sets the seed
    if not aux or not is_grad_enabled():
        return loss
    total_aux = aux[0]
    for value in aux[1:]:
        total_aux = total_aux + value
    loss = ops.add(loss, Tensor(total_aux.astype(loss.dtype)))
    return RecordLossSeed.apply(loss, [m.seed for m in layers])



class MoE(Module):
    """The MoE MLP: a router, ``cfg.moe_experts`` routed experts and ``cfg.moe_shared_experts``
    shared ones, each a new ``make_expert()`` (the llama block's SwiGLU).  ``aux_loss`` holds the value (an array) of the
    last forward's balancing loss (coef included; None unless ``balance`` is "aux"), which
    ``Llama.loss`` adds to a training loss; ``seed`` the gradient that loss received,
    which ``AttachAux`` hands to the balancing loss in backward; ``load`` what the
    last forward routed (``record_load``), ``step_load`` what the step's forwards did
    (``StepLoad``)."""

    def __init__(self, d_model, make_expert, rng, cfg):
        self.n_experts, self.top_k = cfg.moe_experts, cfg.moe_top_k
        self.balance, self.aux_coef = cfg.moe_balance, cfg.moe_aux_coef
        self.capacity_factor = cfg.moe_capacity_factor
        self.router = Linear(d_model, self.n_experts, rng, bias=False)
        self.experts = [make_expert() for _ in range(self.n_experts)]
        self.shared = [make_expert() for _ in range(cfg.moe_shared_experts)]
        self.dispatch = dispatch_local
        self.sequence_split = None     # set where sequences are split over ranks (cp)
        self.aux_loss, self.seed = None, LossSeed()
        self.load, self.step_load = None, StepLoad(self.n_experts)
        self.bias_rate = cfg.moe_bias_rate       # "bias": the selection bias and its step
        self.selection_bias = xp.zeros(self.n_experts) if self.balance == "bias" else None

    def record_load(self, chosen, keep):
        """``self.load``: what the last forward routed — ``received`` (E,) the assignments
        each expert took after any capacity drop, ``dropped`` the assignments dropped.
        Counted on this rank's tokens only; a log adds them over the ranks."""
        received = xp.bincount(chosen[keep].reshape(-1), minlength=self.n_experts)
        self.load = dict(received=received, dropped=int(keep.size - keep.sum()))
        self.step_load.count(received, self.load["dropped"], chosen.shape[0],
                             xp.bincount(chosen.reshape(-1), minlength=self.n_experts))

    def router_probs(self, x):
        """softmax over the experts, in float32 at least."""
        logits = self.router(x)
        if logits.dtype.itemsize < 4:
            logits = ops.cast(logits, np.float32)
        return ops.softmax(logits, axis=-1)

    def forward(self, x):
        b, t, d = x.shape
        k, n = self.top_k, b * t
        probs = self.router_probs(x)                                   # (B, T, E)
        chosen = route(probs.data, k, self.selection_bias)             # (B, T, k)
        split = self.sequence_split
        whole = chosen if split is None else split.gather(chosen)      # the whole sequences'
        keep = kept_assignments(whole, self.n_experts,
                                capacity(self.capacity_factor, k, whole.shape[1], self.n_experts))
        if split is not None:
            keep = split.mine(keep)
        self.record_load(chosen, keep)
        rows = xp.arange(n)[:, None].repeat(k, axis=1)                 # (N, k): the token
        flat_chosen = chosen.reshape(n, k)
        top = ops.getitem(ops.reshape(probs, (n, self.n_experts)), (rows, flat_chosen))
        weights = ops.div(top, ops.sum(top, axis=-1, keepdims=True))   # (N, k), Σ_j = 1
        if weights.dtype != x.dtype:
            weights = ops.cast(weights, x.dtype)

        tokens = ops.reshape(x, (n, d))
        per_slot = ops.reshape(self.dispatch(self, tokens, flat_chosen.reshape(n * k),
                                             keep.reshape(n * k), k), (n, k, d))
        out = ops.sum(ops.mul(per_slot, ops.reshape(weights, (n, k, 1))), axis=1)
        if out.dtype != x.dtype:           # a half-precision sum accumulates in float32
            out = ops.cast(out, x.dtype)
        for expert in self.shared:     # on (B, T, d): tensor parallelism gathers along T
            out = ops.add(out, ops.reshape(expert(x), (n, d)))
        self.aux_loss = None
        if self.balance == "aux":
            aux = ops.mul(balance_loss(probs, whole, self.n_experts, split), self.aux_coef)
            self.aux_loss = aux.data
            self.step_load.count_aux(aux.data, b)
            if is_grad_enabled():
                out = AttachAux.apply(out, aux, self.seed,
                                      1 if split is None else split.aux_grad_scale)
        return ops.reshape(out, (b, t, d))
