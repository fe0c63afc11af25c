"""Text generation from a checkpoint: ``python -m minipar sample --resume DIR``.

Autoregressive sampling: feed the last ``seq_len`` bytes, take the logits of the
final position, divide by the temperature, keep the ``top_k`` largest, sample
one byte from their softmax, append, repeat.
"""
from __future__ import annotations

import numpy as np

from minipar import backend, checkpoint
from minipar.autograd import no_grad
from minipar.data import encode, decode
from minipar.nn import GPT, GPTConfig


def load_model(directory):
    params, _, meta = checkpoint.load(directory)
    # checkpoints hold fp32 weights (fp32 masters for fp16/bf16 runs), fp64 ones for fp64 runs
    backend.set_default_dtype(backend.dtype_of("fp64" if meta.get("precision") == "fp64" else "fp32"))
    model = GPT(GPTConfig(**meta["model"]))
    model.load_state_dict(params)
    return model.eval()


def generate(model, prompt_ids, tokens, temperature=0.8, top_k=40, seed=0):
    rng = np.random.default_rng(seed)
    ids = list(int(i) for i in prompt_ids) or [ord("\n")]
    window = model.config.seq_len
    with no_grad():
        for _ in range(tokens):
            context = backend.to_device(np.array([ids[-window:]], dtype=np.int64))
            logits = backend.to_host(model(context).data[0, -1]).astype(np.float64)
            logits /= max(temperature, 1e-6)
            if top_k and top_k < len(logits):
                logits[logits < np.sort(logits)[-top_k]] = -np.inf
            p = np.exp(logits - logits.max())
            ids.append(int(rng.choice(len(p), p=p / p.sum())))
    return ids


def sample_main(args):
    model = load_model(args.resume)
    prompt = encode(args.prompt)
    out = generate(model, prompt, args.tokens, args.temperature, args.top_k, args.seed)
    print(decode(out))
