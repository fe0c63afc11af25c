"""Text generation from a checkpoint: ``python -m minipar sample --resume DIR``.

Autoregressive sampling: feed the last ``seq_len`` tokens, take the logits of the
final position, divide by the temperature, keep the ``top_k`` largest, sample
one token from their softmax, append, repeat.  Tokens are bytes, or the ids of the
BPE tokenizer the checkpoint carries (a run on a tokenized dataset saves it there).

Token healing (BPE only).  A prompt is cut into tokens where *it* ends, not where the
training text went on: "def " ends in a lone space token, and in the training text a
lone space comes before a number (" name" is one chunk, so a name never follows one).
Sampled as is, "def " continues "def 0x00...".  So the prompt's last token is dropped
and the first sampled token may be any token whose bytes start with it (" f", " test",
" __init__", ...): the model chooses where the prompt's last chunk really ends.
"""
from __future__ import annotations

import numpy as np

from minipar import backend, checkpoint
from minipar.autograd import no_grad
from minipar.data import encode, decode
from minipar.nn import GPTConfig, make_model
from minipar.nn.moe import moe_layers
from minipar.tokenizer import Tokenizer


class SampleError(ValueError):
    """A bad flag or checkpoint for ``sample``; the message is one line."""


def load_model(directory):
    """(the model in eval mode, its tokenizer or None for bytes) of a checkpoint, read
    tensor by tensor from its pieces (``checkpoint.open_checkpoint``)."""
    try:
        ckpt = checkpoint.open_checkpoint(directory)
        meta = ckpt.meta
        cfg = GPTConfig(**meta["model"])
        tokenizer = Tokenizer.from_dict(meta["tokenizer"]) if "tokenizer" in meta else None
    except (ValueError, FileNotFoundError, TypeError, KeyError) as err:
        raise SampleError(f"--resume {directory}: {err}") from None
    # checkpoints hold fp32 weights (fp32 masters for fp16/bf16 runs), fp64 ones for fp64 runs
    precision = "fp64" if meta.get("precision") == "fp64" else "fp32"
    backend.set_default_dtype(backend.dtype_of(precision))
    model = make_model(cfg, materialize=False)     # placeholders, filled one tensor at a time
    try:
        checkpoint.check_loadable(ckpt, model, precision)
    except ValueError as err:
        raise SampleError(f"--resume {directory}: {err}") from None
    model.load_state_dict(ckpt.tensors_of("param"))   # every parameter, LayerNorm's too
    for name, moe in moe_layers(model):     # loss-free balancing: the bias picks the experts
        if moe.selection_bias is not None:
            moe.selection_bias = backend.to_device(ckpt.tensor(name, "moe_bias"))
    return model.eval(), tokenizer


def healed_prompt(tokenizer, text):
    """(the prompt's tokens less the last, the tokens the first sample may be): those
    that start with the dropped token's bytes (special tokens excluded)."""
    ids = [int(i) for i in tokenizer.encode(text)]
    if not ids:
        return ids, None
    tail = tokenizer.token_bytes[ids[-1]]
    ordinary = tokenizer.token_bytes[:tokenizer.vocab_size - len(tokenizer.special)]
    return ids[:-1], np.array([t for t, b in enumerate(ordinary) if b.startswith(tail)])


def generate(model, prompt_ids, tokens, temperature=0.8, top_k=40, seed=0, first_of=None):
    """``prompt_ids`` and ``tokens`` sampled ids after them; ``first_of``: the ids the
    first one must be among (token healing), or None."""
    rng = np.random.default_rng(seed)
    ids = list(int(i) for i in prompt_ids) or [ord("\n")]
    window = model.config.seq_len
    with no_grad():
        for step in range(tokens):
            context = backend.to_device(np.array([ids[-window:]], dtype=np.int64))
            logits = backend.to_host(model(context).data[0, -1]).astype(np.float64)
            if step == 0 and first_of is not None:
                allowed = np.full(len(logits), -np.inf)
                allowed[first_of] = 0.0
                logits += allowed
            logits /= max(temperature, 1e-6)
            if top_k and top_k < len(logits):
                logits[logits < np.sort(logits)[-top_k]] = -np.inf
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return ids


def check_sample_flags(args):
    if args.tokens < 1:
        raise SampleError(f"--tokens must be >= 1, got {args.tokens}")
    if not args.temperature > 0 or args.temperature == float("inf"):
        raise SampleError(f"--temperature must be a finite number > 0, got {args.temperature}")
    if args.top_k < 1:
        raise SampleError(f"--top-k must be >= 1, got {args.top_k}")
    if args.seed < 0:
        raise SampleError(f"--seed must be >= 0, got {args.seed}")


def sample_main(args):
    check_sample_flags(args)
    model, tokenizer = load_model(args.resume)
    if tokenizer is None:
        out = generate(model, encode(args.prompt), args.tokens, args.temperature, args.top_k, args.seed)
        print(decode(out))
        return
    prompt, first_of = healed_prompt(tokenizer, args.prompt)
    out = generate(model, prompt, args.tokens, args.temperature, args.top_k, args.seed, first_of)
    print(tokenizer.decode(out if prompt else out[1:]))
