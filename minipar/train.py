"""The training loop behind ``python -m minipar train``.

One optimizer step:
    batch  = the global batch of step k, a pure function of (seed, k)
    for each of K micro-batches:  loss_i = CE(model(x_i), y_i) / K;  backward
    clip the global gradient norm;  AdamW with the warm-up + cosine learning rate
and a log line.  ``--batch-size`` is the global batch, so every layout sees the
same data and makes the same update as the single-process run.
"""
from __future__ import annotations

import json
import time

from minipar import backend, checkpoint
from minipar.autograd import no_grad
from minipar.data import Dataset, load_corpus
from minipar.nn import GPT, config_from_preset
from minipar.optim import AdamW, clip_grad_norm, lr_at
from minipar.layout import validate_layout


def model_config(args):
    return config_from_preset(args.model, n_layer=args.n_layer, d_model=args.d_model,
                              n_head=args.n_head, seq_len=args.seq_len, dropout=args.dropout,
                              tie_weights=args.tie_weights, attention=args.attention)


def evaluate(model, dataset, args, batches):
    """Mean validation loss over ``batches`` fixed batches."""
    model.eval()
    total = 0.0
    with no_grad():
        for i in range(batches):
            x, y = dataset.batch(args.seed, i, args.batch_size, split="val")
            total += model(backend.to_device(x), backend.to_device(y))[1].item()
    model.train()
    return total / max(batches, 1)


def train_step(model, optimizer, x, y, grad_accum, grad_clip):
    """Forward/backward over K micro-batches, clip, update. Returns (loss, grad norm)."""
    rows = x.shape[0] // grad_accum
    loss_sum = 0.0
    for i in range(grad_accum):
        xs, ys = x[i * rows:(i + 1) * rows], y[i * rows:(i + 1) * rows]
        _, loss = model(backend.to_device(xs), backend.to_device(ys))
        (loss * (1.0 / grad_accum)).backward()
        loss_sum += loss.item()
    norm = clip_grad_norm(model.parameters(), grad_clip)
    optimizer.step()
    optimizer.zero_grad()
    return loss_sum / grad_accum, norm


def _save(args, model, optimizer, step):
    meta = {"model": model.config.to_dict(), "step": step, "seed": args.seed,
            "precision": args.precision}
    checkpoint.save(args.save, model.state_dict(), optimizer.state_dict(), meta)


def train(args):
    layout = validate_layout(args)
    backend.set_default_dtype(backend.dtype_of(args.precision))
    cfg = model_config(args)
    dataset = Dataset(load_corpus(args.data), cfg.seq_len)
    model = GPT(cfg, seed=args.seed)
    optimizer = AdamW(model.named_parameters(), lr=args.lr, weight_decay=args.weight_decay)
    start = 0
    if args.resume:
        params, opt_state, meta = checkpoint.load(args.resume)
        checkpoint.check_compatible(meta, cfg.to_dict())
        model.load_state_dict(params)
        optimizer.load_state_dict(opt_state)
        start = int(meta["step"])
    warmup = args.warmup if args.warmup is not None else max(1, args.steps // 10)
    tokens_per_step = args.batch_size * cfg.seq_len
    flops_per_step = model.flops_per_token() * tokens_per_step
    log = open(args.log_json, "w") if args.log_json else None
    bar = None
    if not args.quiet and layout.rank == 0:
        from tqdm import tqdm
        bar = tqdm(total=args.steps, initial=start, desc="train", unit="step")
    for step in range(start, args.steps):
        optimizer.lr = lr_at(step, args.lr, warmup, args.steps)
        x, y = dataset.batch(args.seed, step, args.batch_size)
        backend.memory.reset_peak()
        t0 = time.perf_counter()
        loss, norm = train_step(model, optimizer, x, y, args.grad_accum, args.grad_clip)
        backend.sync()
        dt = time.perf_counter() - t0
        record = {"step": step, "loss": loss, "lr": optimizer.lr, "grad_norm": norm,
                  "tokens_per_s": tokens_per_step / dt, "step_time_s": dt, "comm_time_s": 0.0,
                  "peak_mem_bytes": backend.memory.peak}
        if args.peak_tflops:
            record["mfu"] = flops_per_step / dt / (args.peak_tflops * 1e12 * layout.world_size)
        if log:
            log.write(json.dumps(record) + "\n")
            log.flush()
        if bar:
            bar.set_postfix(loss=f"{loss:.4f}")
            bar.update(1)
        if args.save and args.save_every and (step + 1) % args.save_every == 0:
            _save(args, model, optimizer, step + 1)
    if bar:
        bar.close()
    if args.save:
        _save(args, model, optimizer, args.steps)
    if args.eval_batches and layout.rank == 0:
        print(f"val loss {evaluate(model, dataset, args, args.eval_batches):.4f} "
              f"after {args.steps} steps", flush=True)
    if log:
        log.close()
    return model
