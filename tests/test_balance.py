"""Data-parallel load balancing: uneven shares of the batch, the same update."""
from minipar.observe.runlog import step_records
from minipar.train.balance import proportional_shares
from tests.cli import train, assert_same_run


def test_shares_are_proportional_whole_and_complete():
    assert proportional_shares(12, [1, 1]) == [6, 6]
    assert proportional_shares(12, [3, 1]) == [9, 3]
    assert proportional_shares(12, [100, 1]) == [11, 1]            # everyone keeps a row
    assert proportional_shares(12, [2, 1, 1], quantum=2) in ([6, 4, 2], [6, 2, 4])
    for rows, speeds, q in [(32, [1.0, 2.5, 0.3], 1), (24, [5, 1, 1, 1], 2), (7, [1] * 7, 1)]:
        shares = proportional_shares(rows, speeds, q)
        assert sum(shares) == rows and all(s >= q and s % q == 0 for s in shares)


def test_uneven_shares_reproduce_the_single_process_update(tmp_path, monkeypatch):
    """Rank 1 slowed 3x: --balance moves rows to rank 0 (shares change during the run),
    and the losses, weights and Adam moments stay those of one process (fp64)."""
    single = train(tmp_path, "single", 1, steps=12, batch=12)
    monkeypatch.setenv("MINIPAR_SLOW_RANK", "1:3")
    run = train(tmp_path, "balanced", 2, "--balance", steps=12, batch=12)
    shares = [tuple(r["batch_shares"]) for r in step_records(tmp_path / "balanced.json")]
    assert shares[0] == (6, 6) and shares[-1][0] > shares[-1][1]    # rank 0 took more
    assert_same_run(run, single, rtol=1e-9)


def test_balance_with_grad_accumulation_keeps_whole_micro_batches(tmp_path, monkeypatch):
    single = train(tmp_path, "single", 1, steps=10, batch=12)
    monkeypatch.setenv("MINIPAR_SLOW_RANK", "0:3")
    run = train(tmp_path, "balanced", 2, "--balance", "--grad-accum", "2", steps=10, batch=12)
    shares = [tuple(r["batch_shares"]) for r in step_records(tmp_path / "balanced.json")]
    assert all(s % 2 == 0 for pair in shares for s in pair) and shares[-1][1] > shares[-1][0]
    assert_same_run(run, single, rtol=1e-9)
