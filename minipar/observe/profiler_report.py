"""``minipar profile``'s tables: a ``StepProfiler``'s records per step, and how they print.

``summarize`` turns the seconds, FLOPs and bytes recorded per (op, pass, phase) into rows
per step with each op's roofline, max(FLOPs / gemm_rate, bytes / mem_bw) (``profiler.py``
says how each is counted), and each phase's Python overhead: its time minus the time
inside its ops.  ``format_report`` prints the phase table, the top ops and one line that
adds the phases up.
"""
from __future__ import annotations

PHASES = ("forward", "backward", "optimizer", "comm")


def summarize(prof, steps, gemm_rate, mem_bw, optimizer_bytes=0):
    """The tables per step: {"step_s", "python_overhead_s", "phases", "ops"} (``--json``)."""
    roof = lambda flops, nbytes: max(flops / gemm_rate, nbytes / mem_bw)   # noqa: E731
    ops = [dict(op=name, kind=kind, phase=phase, calls=c / steps, s=s / steps, flops=f / steps,
                bytes=b / steps, roofline_s=roof(f, b) / steps)
           for (name, kind, phase), (c, s, f, b) in prof.ops.items()]
    in_ops = lambda ph: sum(o["s"] for o in ops if o["phase"] == ph)      # noqa: E731
    phases = {ph: {"s": prof.phases.get(ph, 0.0) / steps} for ph in PHASES}
    opt_s = max(phases["optimizer"]["s"] - in_ops("optimizer"), 0.0)
    ops.append(dict(op="Optimizer.step", kind="optimizer", phase="optimizer", calls=1.0, s=opt_s,
                    flops=0, bytes=optimizer_bytes, roofline_s=roof(0, optimizer_bytes)))
    for ph, row in phases.items():
        row["ops_s"] = in_ops(ph)
        own_work = ph in ("forward", "backward")   # the optimizer is one row; comm is no op
        row["overhead_s"] = max(row["s"] - row["ops_s"], 0.0) if own_work else 0.0
        row["roofline_s"] = sum(o["roofline_s"] for o in ops if o["phase"] == ph)
    step = sum(row["s"] for row in phases.values())
    ops = sorted((dict(o, share=o["s"] / max(step, 1e-12)) for o in ops), key=lambda o: -o["s"])
    return {"step_s": step, "python_overhead_s": sum(r["overhead_s"] for r in phases.values()),
            "phases": phases, "ops": ops}


def _ms(s):
    return f"{1e3 * s:9.2f}"


def format_report(rep, top=15):
    """The phase table, the op table (``top`` rows), the final ``profile:`` line."""
    step, ph = rep["step_s"], rep["phases"]
    total = {k: sum(r[k] for r in ph.values()) for k in ("s", "ops_s", "overhead_s", "roofline_s")}
    lines = [f"{'phase':<11}{'ms/step':>9}{'% step':>8}{'in ops':>9}{'overhead':>9}{'roofline':>9}"]
    for name, r in list(ph.items()) + [("step", total)]:
        lines.append(f"{name:<11}{_ms(r['s'])}{r['s'] / max(step, 1e-12):8.1%}{_ms(r['ops_s'])}"
                     f"{_ms(r['overhead_s'])}{_ms(r['roofline_s'])}")
    lines += ["", f"{'op':<22}{'pass':<10}{'calls':>6}{'ms/step':>9}{'% step':>8}{'GFLOP/s':>9}"
                  f"{'GB/s':>8}{'roofline':>9}{'achieved/roofline':>19}"]
    for o in rep["ops"][:top]:
        name = o["op"] + ("" if o["phase"] in (o["kind"], "optimizer") else
                          " (recompute)" if o["phase"] == "backward" else f" (in {o['phase']})")
        s = max(o["s"], 1e-12)
        lines.append(f"{name:<22}{o['kind']:<10}{o['calls']:6.0f}{_ms(o['s'])}{o['share']:8.1%}"
                     f"{o['flops'] / s / 1e9:9.2f}{o['bytes'] / s / 1e9:8.2f}{_ms(o['roofline_s'])}"
                     f"{o['roofline_s'] / s:19.2f}")
    rest = rep["ops"][top:]
    if rest:
        lines.append(f"({len(rest)} more op rows: {1e3 * sum(o['s'] for o in rest):.2f} ms/step)")
    ms = {k: f"{1e3 * r['s']:.2f}" for k, r in ph.items()}
    lines += ["", f"profile: step {1e3 * step:.2f} ms = forward {ms['forward']} + backward "
                  f"{ms['backward']} + optimizer {ms['optimizer']} + comm {ms['comm']} "
                  f"(python overhead {1e3 * rep['python_overhead_s']:.2f})"]
    return "\n".join(lines)
