"""Losses in bits per byte beside nats per token, and progress fit for a log file."""
import io
import math

import pytest

from minipar.observe import monitor
from minipar.observe.progress import LineProgress, progress


def run_monitor(bytes_per_token, val_loss=1.5):
    out = io.StringIO()
    header = dict(layout="single", params=1e6, tokens_per_step=256, seq_len=32, backend="numpy",
                  precision="fp32", bytes_per_token=bytes_per_token)
    mon = monitor.RunMonitor(None, header=header, flops_per_step=1e9, peak_tflops=1.0,
                             progress=True, total_steps=3, out=out)
    mon.start()
    recs = [mon.step(s, shared=dict(loss=2.0 - 0.1 * s, lr=1e-3), mine=dict(step_time_s=0.01, peak_mem_bytes=100))
            for s in range(3)]
    final = mon.finish(val_loss=val_loss)
    return out.getvalue(), recs, final


def test_bits_per_byte_divide_by_the_bytes_per_token():
    text, recs, final = run_monitor(bytes_per_token=3.5)
    for r in recs:
        assert r["bits_per_byte"] == pytest.approx(r["loss"] / math.log(2) / 3.5)
    assert final["val_bits_per_byte"] == pytest.approx(1.5 / math.log(2) / 3.5)
    assert final["train_bits_per_byte"] == pytest.approx(1.8 / math.log(2) / 3.5)
    assert f"val loss   1.5000 nats/token ({1.5 / math.log(2) / 3.5:.3f} bits/byte)" in text
    text, recs, final = run_monitor(bytes_per_token=1.0)       # bytes: nats/byte, as before
    assert "nats/byte" in text and final["val_bits_per_byte"] == pytest.approx(1.5 / math.log(2))


def test_off_a_terminal_progress_is_whole_lines():
    text, _, _ = run_monitor(bytes_per_token=2.0)
    assert "\r" not in text
    line = [t for t in text.splitlines() if t.startswith("train: ")]
    assert line == [line[0]] and "3/3 step (100%)" in line[0] and "bpb" in line[0]
    assert isinstance(progress(total=5, file=io.StringIO()), LineProgress)
    out = io.StringIO()
    bar = LineProgress(total=10, desc="encode", unit="B", file=out, every_s=0.0)
    bar.update(4)
    bar.update(6)
    bar.close()
    assert [t.split(" |")[0] for t in out.getvalue().splitlines()] == \
        ["encode: 4/10 B (40%)", "encode: 10/10 B (100%)", "encode: 10/10 B (100%)"]
