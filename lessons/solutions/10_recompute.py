"""Solutions of lesson 10's exercises (put into the notebook's exercise cells by the tests)."""

SOLUTIONS = {
    "my_checkpoint": r'''
class MyCheckpoint(Function):
    """out = fn(*inputs), keeping only the inputs (and the random state) for backward;
    backward runs fn again, with the graph, and back-propagates through that copy."""

    @staticmethod
    def forward(ctx, fn, generator, *arrays):
        ctx.run, ctx.generator = fn, generator
        ctx.rng = rng_state(generator) if generator is not None else None
        ctx.save_for_backward(*arrays)              # the inputs: all that is kept
        with set_grad_enabled(False):               # no graph: fn's activations are freed
            out = fn(*[Tensor(a) for a in arrays])
        return out.data

    @staticmethod
    def backward(ctx, g):
        needs = ctx.needs_input_grad[2:]            # [0] is fn's, [1] the generator's
        inputs = [Tensor(a, requires_grad=n) for a, n in zip(ctx.saved, needs)]
        if ctx.rng is not None:                     # replay the forward's random draws
            now = rng_state(ctx.generator)
            set_rng_state(ctx.generator, ctx.rng)
        with set_grad_enabled(True):                # the second forward, graph recorded
            out = ctx.run(*inputs)
        if ctx.rng is not None:                     # and leave the generator where it was
            set_rng_state(ctx.generator, now)
        out.backward(g)                             # the weights inside fn get their .grad here
        return (None, None) + tuple(t.grad if n else None for t, n in zip(inputs, needs))


def my_checkpoint(fn, *inputs, generator=None):
    return MyCheckpoint.apply(fn, generator, *inputs)
''',
    "layer_activation_bytes": r'''
def layer_activation_bytes(s, b, h, a, recompute="none"):
    """Bytes of one transformer layer's activations (Korthikanti et al. 2022, 16-bit, t = 1)."""
    sbh = s * b * h
    if recompute == "full":
        return 2 * sbh                  # the layer's input, 2 bytes per value
    if recompute == "selective":
        return 34 * sbh                 # everything but the attention core
    return sbh * (34 + 5 * a * s / h)
''',
}
