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
SPREAD = ["--dp", "2", "--grad-accum", "2", "--recompute", "full"]


def logged_run(tmp_path, name, n, *flags):
    log = tmp_path / f"{name}.json"
    run_mpi(n, ["-m", "minipar", "train", *MODEL, *flags, "--steps", "3", "--batch-size", str(BATCH),
                "--precision", "fp64", "--data", "stdlib-bytes", "--eval-batches", "0", "--quiet",
                "--log-json", log], timeout=300)
    return log


def check_counts(records):
    """Every step and MoE layer: received + dropped = k · tokens; returns whether any dropped."""
    assignments, dropped_any = TOP_K * BATCH * SEQ_LEN, False
    for record in records:
        assert [e["block"] for e in record["experts"]] == [0, 1]
        for layer in record["experts"]:
            dropped = layer["dropped_share"] * assignments
            assert dropped == pytest.approx(round(dropped), abs=1e-9)
            assert sum(layer["received"]) == assignments - round(dropped), (record["step"], layer)
            dropped_any |= dropped > 0
            assert layer["load_max_mean"] == pytest.approx(
                max(layer["received"]) / (sum(layer["received"]) / 4))
            assert layer["balance_loss"] >= 0.01 * (1 - 1e-9)   # coef · E·Σf·P >= coef
    return dropped_any


def test_log_counts_every_assignment_once_and_report_draws_it(tmp_path):
    """dp 2 × 2 accumulated micro-batches × full recomputation (each block routes twice a
    micro-batch): the counts of both ranks add up to k · tokens, with some dropped
    (capacity 1); report draws them."""
    log = logged_run(tmp_path, "spread", 2, *SPREAD)
    records = read_log(log)[1]
    assert len(records) == 3 and check_counts(records)
    out = tmp_path / "report"
    assert report.main([str(log), "--out", str(out)]) == 0
    assert (out / "expert_load_1.png").stat().st_size > 1000
    assert 'src="expert_load_1.png"' in (out / "index.html").read_text()


@pytest.mark.slow
def test_log_counts_are_the_single_process_counts(tmp_path):
    """The same counts, balancing loss and dropped share under dp 2 × 2 micro-batches ×
    recomputation as in one process (fp64)."""
    single = read_log(logged_run(tmp_path, "single", 1))[1]
    spread = read_log(logged_run(tmp_path, "spread", 2, *SPREAD))[1]
    check_counts(single)
    for one, other in zip(single, spread):
        for mine, theirs in zip(one["experts"], other["experts"]):
            assert theirs["received"] == mine["received"], (other["step"], theirs, mine)
            assert theirs["dropped_share"] == mine["dropped_share"]
            assert theirs["balance_loss"] == pytest.approx(mine["balance_loss"], rel=1e-9)


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
