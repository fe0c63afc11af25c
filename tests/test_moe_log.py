"""The expert load in the JSON log (``observe/expert_load.py``) and its figure in ``report``.

Per step and per MoE layer the log counts the assignments each expert received over the
global batch: Σ_e received_e = k · tokens − dropped, every micro-batch counted once
(a recomputed block routes twice), the same under every layout.
"""
import json

import pytest

from minipar.nn import config_from_preset
from minipar.observe import report
from minipar.observe.expert_load import ExpertLoadLog
from minipar.observe.runlog import read_log
from tests.mpirun import run_mpi

TOP_K, SEQ_LEN, BATCH = 2, 16, 8
MODEL = ["--model", "llama-tiny", "--n-layer", "2", "--d-model", "32", "--n-head", "4",
         "--n-kv-head", "2", "--seq-len", str(SEQ_LEN), "--moe-experts", "4",
         "--moe-top-k", str(TOP_K), "--moe-capacity-factor", "1.0"]


def logged_run(tmp_path, name, n, *flags):
    log = tmp_path / f"{name}.json"
    run_mpi(n, ["-m", "minipar", "train", *MODEL, *flags, "--steps", "3", "--batch-size", str(BATCH),
                "--precision", "fp64", "--data", "stdlib-bytes", "--eval-batches", "0", "--quiet",
                "--log-json", log], timeout=300)
    return log


def test_log_counts_every_assignment_once_under_any_layout_and_report_draws_it(tmp_path):
    """dp 2 × 2 accumulated micro-batches × full recomputation logs the single process's
    counts, and they add up: received + dropped = k · tokens, with some dropped (capacity 1)."""
    single = read_log(logged_run(tmp_path, "single", 1))[1]
    spread_log = logged_run(tmp_path, "spread", 2, "--dp", "2", "--grad-accum", "2",
                            "--recompute", "full")
    spread = read_log(spread_log)[1]
    assert len(spread) == len(single) == 3
    assignments = TOP_K * BATCH * SEQ_LEN
    dropped_any = False
    for one, other in zip(single, spread):
        assert [e["block"] for e in other["experts"]] == [0, 1]
        for mine, theirs in zip(one["experts"], other["experts"]):
            assert theirs["received"] == mine["received"], (other["step"], theirs, mine)
            dropped = theirs["dropped_share"] * assignments
            assert dropped == pytest.approx(round(dropped), abs=1e-9)
            assert sum(theirs["received"]) == assignments - round(dropped)
            dropped_any |= dropped > 0
            assert theirs["load_max_mean"] == pytest.approx(
                max(theirs["received"]) / (sum(theirs["received"]) / 4))
            assert theirs["balance_loss"] == pytest.approx(mine["balance_loss"], rel=1e-9)
            assert theirs["balance_loss"] >= 0.01 * (1 - 1e-9)   # coef · E·Σf·P >= coef
    assert dropped_any

    out = tmp_path / "report"
    assert report.main([str(spread_log), "--out", str(out)]) == 0
    assert (out / "expert_load_1.png").stat().st_size > 1000
    assert 'src="expert_load_1.png"' in (out / "index.html").read_text()


def test_a_dense_model_logs_no_expert_load():
    dense = config_from_preset("llama-tiny")
    assert ExpertLoadLog.of(None, dense) is None
    layout = ExpertLoadLog([1, 3], 4, 2, "none", {}, counts_own_tokens=True)
    rows = [layout.vector(), layout.vector()]            # two ranks holding neither block
    assert len(rows[0]) == 2 * (4 + 3)
    entries = layout.fields(rows)
    assert [e["block"] for e in entries] == [1, 3]
    assert entries[0]["received"] == [0, 0, 0, 0] and entries[0]["balance_loss"] is None
    json.dumps(entries)                                   # plain numbers, ready for the log
