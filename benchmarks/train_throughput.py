"""Training tokens/s on one GPU by precision: ``minipar train --backend cupy`` against
PyTorch eager with autocast on the same model, in the same run.

    python benchmarks/train_throughput.py                      # GPT-2-small shape, 30 steps
    python benchmarks/train_throughput.py --precisions fp32,fp16 --steps 20 --attention naive

For each precision in ``--precisions`` (fp32, fp16, bf16) and each framework:

- minipar: ``python -m minipar train --backend cupy --model gpt2`` with the shape's flags, a
  log (``--log-json``), and tokens/s = the median of the logged steps' ``tokens_per_s``
  after the first ``--warmup`` (a step's time ends when the device is done: the trainer
  reads the loss, flag and norm once and then waits for the queue);
- PyTorch: ``torch_gpt.py``'s GPT of the same shape (its fused SDPA when minipar uses its
  flash kernels), ``torch.autocast`` in fp16/bf16 with a ``GradScaler`` in fp16,
  ``clip_grad_norm_(1.0)`` and ``AdamW`` (foreach), as minipar's trainer steps; each step
  ends with ``loss.item()``.  Median seconds per step after ``--warmup`` steps.

Printed: one row per (framework, precision) with tokens/s, then the ratios with
targets — each precision against fp32 in the same framework (target: fp16 and bf16
≥ 1.8×) and minipar against PyTorch at each precision (target ≥ 0.9×).  The targets are
printed beside the measured ratios, not asserted.  ``--frameworks minipar`` runs minipar
alone (no PyTorch needed).  ``benchmarks/gpu_check.py`` measures the same rows one run
at a time (its own minipar command, with ``--data stdlib-bytes``).  Vocabulary: the 256 byte ids of the default data,
so the head is a multiple of 64 wide and both models are the same size.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, REPO)
TARGET_VS_FP32, TARGET_VS_TORCH = 1.8, 0.9


def minipar_tokens_per_s(args, precision):
    """Median tokens/s of ``minipar train --backend cupy`` at ``precision``, from its log."""
    from minipar.observe.runlog import step_records
    with tempfile.TemporaryDirectory() as tmp:
        log = os.path.join(tmp, "log.json")
        cmd = [sys.executable, "-m", "minipar", "train", "--backend", "cupy", "--model", "gpt2",
               "--n-layer", str(args.layers), "--d-model", str(args.d_model), "--n-head", str(args.heads),
               "--seq-len", str(args.seq), "--batch-size", str(args.batch), "--steps", str(args.steps),
               "--precision", precision, "--attention", args.attention, "--eval-batches", "0",
               "--data", "stdlib-bytes", "--quiet", "--log-json", log]   # 256 tokens, as PyTorch's model
        out = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=args.timeout)
        if out.returncode != 0:
            raise RuntimeError(f"minipar train {precision} failed:\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
        rates = [r["tokens_per_s"] for r in step_records(log)][args.warmup:]
    if not rates:
        raise RuntimeError(f"no step after the {args.warmup} warm-up steps: raise --steps")
    return statistics.median(rates)


def torch_tokens_per_s(args, precision):
    """Median tokens/s of the PyTorch GPT of the same shape, eager, autocast in half."""
    import torch
    sys.path.insert(0, HERE)
    from torch_gpt import build_torch_gpt
    torch.manual_seed(0)
    model = build_torch_gpt(args.layers, args.d_model, args.heads, args.seq,
                            fused_attention=args.attention == "flash", device="cuda")
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.1, foreach=True)
    half = {"fp16": torch.float16, "bf16": torch.bfloat16}.get(precision)
    scaler = torch.amp.GradScaler("cuda", enabled=precision == "fp16")
    x = torch.randint(0, 256, (args.batch, args.seq), device="cuda")
    y = torch.randint(0, 256, (args.batch, args.seq), device="cuda")

    def step():
        with torch.autocast("cuda", dtype=half, enabled=half is not None):
            loss = model(x, y)
        scaler.scale(loss).backward()
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0, foreach=True)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad(set_to_none=True)
        return loss.item()

    times = []
    for i in range(args.steps):
        t0 = time.perf_counter()
        step()
        if i >= args.warmup:
            times.append(time.perf_counter() - t0)
    del model, opt
    torch.cuda.empty_cache()
    return args.batch * args.seq / statistics.median(times)


def ratio_lines(rates, precisions, frameworks):
    """The ratios with targets: each half precision against fp32, minipar against PyTorch."""
    lines = []
    for fw in frameworks:
        for p in precisions:
            if p != "fp32" and (fw, "fp32") in rates and (fw, p) in rates:
                r = rates[fw, p] / rates[fw, "fp32"]
                lines.append(f"{fw:8s} {p} / fp32     {r:6.2f}x   (target >= {TARGET_VS_FP32}x: "
                             f"{'met' if r >= TARGET_VS_FP32 else 'NOT met'})")
    if "torch" in frameworks:
        for p in precisions:
            if ("minipar", p) in rates and ("torch", p) in rates:
                r = rates["minipar", p] / rates["torch", p]
                lines.append(f"minipar / torch {p}     {r:6.2f}x   (target >= {TARGET_VS_TORCH}x: "
                             f"{'met' if r >= TARGET_VS_TORCH else 'NOT met'})")
    return lines


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--layers", type=int, default=12)
    p.add_argument("--d-model", type=int, default=768)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--seq", type=int, default=1024)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5, help="steps left out of the median")
    p.add_argument("--precisions", default="fp32,fp16,bf16")
    p.add_argument("--frameworks", default="minipar,torch")
    p.add_argument("--attention", choices=("naive", "flash"), default="flash")
    p.add_argument("--timeout", type=float, default=600, help="seconds for one minipar run")
    p.add_argument("--json", help="also write {framework: {precision: tokens/s}} here")
    args = p.parse_args(argv)
    precisions = args.precisions.split(",")
    frameworks = args.frameworks.split(",")
    bad = sorted(set(precisions) - {"fp32", "fp16", "bf16"}) + sorted(set(frameworks) - {"minipar", "torch"})
    if bad:
        p.error(f"unknown precision or framework: {', '.join(bad)}")
    measure = {"minipar": minipar_tokens_per_s, "torch": torch_tokens_per_s}
    print(f"train tokens/s, {args.layers} layers, d {args.d_model}, {args.heads} heads, "
          f"seq {args.seq}, batch {args.batch}, {args.attention} attention, "
          f"median of steps {args.warmup}..{args.steps - 1}", flush=True)
    rates = {}
    for fw in frameworks:
        for precision in precisions:
            try:
                rates[fw, precision] = measure[fw](args, precision)
                print(f"{fw:8s} {precision}  {rates[fw, precision]:12,.0f} tokens/s", flush=True)
            except Exception as err:   # one failing row must not hide the others' figures
                print(f"{fw:8s} {precision}  failed: {str(err).strip().splitlines()[-1]}", flush=True)
    for line in ratio_lines(rates, precisions, frameworks):
        print(line)
    if args.json:
        table = {fw: {p: rates[fw, p] for p in precisions if (fw, p) in rates} for fw in frameworks}
        with open(args.json + ".tmp", "w") as f:
            json.dump(table, f, indent=1)
        os.replace(args.json + ".tmp", args.json)
    return 0 if len(rates) == len(precisions) * len(frameworks) else 1


if __name__ == "__main__":
    sys.exit(main())
