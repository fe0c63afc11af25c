"""The elastic supervisor's pieces without MPI: the world-size rule, the rewritten train
flags, membership and hosts, the merged log, Young/Daly and the goodput simulation."""
import json
import math

import pytest

from minipar.config import TrainConfig
from minipar.elastic import largest_world_size, model_goodput, simulate, young_daly_interval
from minipar.elastic.log import MergedLog, read_merged
from minipar.elastic.membership import HostsError, Membership, read_hosts
from minipar.elastic.rank import parse_fault
from minipar.elastic.replan import attempt_argv, parse_train, strip_owned

TINY = TrainConfig(model="tiny", n_layer=2, d_model=16, n_head=4, seq_len=8, batch_size=8,
                   precision="fp64")


@pytest.mark.parametrize("use_plan", [True, False])
def test_largest_valid_world_size(use_plan):
    """3 slots, global batch 8, 4 heads, 2 layers: dp 3, tp 3 and pp 3 are all invalid."""
    for slots, want in ((4, 4), (3, 2), (2, 2), (1, 1), (7, 4), (5, 4)):
        world, config, _ = largest_world_size(TINY, slots, use_plan=use_plan)
        assert world == want and config.world_size == want, slots
    assert largest_world_size(TINY, 3, min_np=3, use_plan=use_plan)[0] is None
    # tp 2 kept where it still divides; dp only once it cannot be kept
    world, config, how = largest_world_size(TrainConfig(**{**TINY.to_dict(), "tp": 2}), 3,
                                            use_plan=False)
    assert (world, config.tp, config.dp, how) == (2, 2, 1, "your layout, dp rescaled")


def test_balance_is_dropped_on_one_rank():
    balanced = TrainConfig(**{**TINY.to_dict(), "balance": True})
    world, config, _ = largest_world_size(balanced, 1, use_plan=False)
    assert world == 1 and not config.balance
    assert largest_world_size(balanced, 2, use_plan=False)[1].balance


def test_the_attempt_flags_give_exactly_the_planned_layout():
    user = ["--model", "tiny", "--n-layer", "2", "--tp=2", "--sequence-parallel", "--balance",
            "--resume", "old", "--log-json", "mine.json", "--steps", "5"]
    assert strip_owned(user) == ["--model", "tiny", "--n-layer", "2", "--steps", "5"]
    planned = TrainConfig(model="tiny", n_layer=2, steps=5, pp=2, schedule="afab",
                          microbatches=4, zero=1).resolve(4)
    argv = attempt_argv(user, planned, "a.json", "ckpt", 11.0)
    back = parse_train(argv)
    assert (back.dp, back.tp, back.pp, back.schedule, back.microbatches, back.zero) == \
        (2, 1, 2, "afab", 4, 1)
    assert not back.sequence_parallel and not back.balance
    assert (back.log_json, back.resume, back.hang_timeout, back.steps) == ("a.json", "ckpt", 11.0, 5)


def test_hosts_placement_failure_and_growth(tmp_path):
    hosts = tmp_path / "hosts"
    hosts.write_text("# two pretend hosts\nlocalhost-a 2\nlocalhost-b 2  # the second\n")
    m = Membership(4, str(hosts))
    assert m.capacity == 4 and m.placement(3) == ["localhost-a"] * 2 + ["localhost-b"]
    assert m.mpiexec_hosts(4) == []                       # all on this machine
    assert m.fail([2], 4) == ["localhost-b"] and m.capacity == 2
    hosts.write_text("localhost-a 2\nlocalhost-b 2\nlocalhost-c 3\n")
    assert m.refresh() and m.capacity == 5                # b stays out (blacklisted)
    assert not m.refresh()
    assert Membership(4).fail([1, 3], 4) == [] and Membership(4).capacity == 4
    plain = Membership(4)
    plain.fail([1, 3], 4)
    assert plain.capacity == 2
    assert Membership(2, None).mpiexec_hosts(2) == []
    remote = tmp_path / "remote"
    remote.write_text("node7 2\nlocalhost 1\n")
    assert Membership(3, str(remote)).mpiexec_hosts(3) == ["-hosts", "node7:2,localhost:1"]
    for bad in ("node 0\n", "node\n", "a 1\na 2\n"):
        remote.write_text(bad)
        with pytest.raises(HostsError):
            read_hosts(str(remote))


def test_faults_are_parsed_strictly():
    assert parse_fault("1:6:kill") == (1, 6, "kill")
    for bad in ("1:6", "1:0:kill", "x:1:kill", "1:2:explode"):
        with pytest.raises(ValueError, match="RANK"):
            parse_fault(bad)


def test_merged_log_keeps_every_step_once(tmp_path):
    def attempt_log(path, steps, final=None):
        lines = [{"header": {"layout": "x"}}] + [{"step": s, "loss": float(s + 10 * k)}
                                                 for s, k in steps]
        lines += [{"final": final}] if final else []
        path.write_text("\n".join(json.dumps(r) for r in lines) + '\n{"step": 9, "lo')  # torn
    a1, a2 = tmp_path / "a1.json", tmp_path / "a2.json"
    attempt_log(a1, [(0, 1), (1, 1), (2, 1), (3, 1)])
    attempt_log(a2, [(2, 2), (3, 2), (4, 2)], final={"train_loss": 1.0})
    log = MergedLog(str(tmp_path / "merged.json"), {"np": 4})
    log.add_attempt(1, 4, str(a1))
    log.add_event({"kind": "failure", "resume_step": 2, "_private": 1})
    log.add_attempt(2, 2, str(a2))
    log.write({"steps": 5})
    header, steps, events, final = read_merged(tmp_path / "merged.json")
    assert header == {"layout": "x", "elastic": {"np": 4}}
    assert [(r["step"], r["attempt"], r["world_size"]) for r in steps] == \
        [(0, 1, 4), (1, 1, 4), (2, 2, 2), (3, 2, 2), (4, 2, 2)]
    assert [r["loss"] for r in steps] == [10.0, 11.0, 22.0, 23.0, 24.0]   # attempt 2 wins
    assert events == [{"kind": "failure", "resume_step": 2}]
    assert final == {"train_loss": 1.0, "steps": 5}
    lines = (tmp_path / "merged.json").read_text().splitlines()
    assert json.loads(lines[3]) == {"event": events[0]}       # just before step 2


def test_young_daly_interval_maximises_goodput():
    C, M = 30.0, 86400.0
    tau = young_daly_interval(C, M)
    assert tau == pytest.approx(math.sqrt(2 * C * M)) and 2200 < tau < 2300
    assert young_daly_interval(C, M, daly=True) == pytest.approx(tau, rel=0.02)
    grid = [tau * f for f in (0.25, 0.5, 0.8, 1.0, 1.25, 2.0, 4.0)]
    best = max(grid, key=lambda t: model_goodput(t, C, M, restart_s=60))
    assert best == tau
    with pytest.raises(ValueError):
        young_daly_interval(0, M)


def test_daly_checkpoints_once_an_mtbf_when_a_checkpoint_costs_two():
    """Daly's form holds for C < 2M; a checkpoint dearer than that is taken every M
    seconds (Young's √(2CM) would wait longer than the mean time to the next failure)."""
    M = 100.0
    assert young_daly_interval(300.0, M, daly=True) == M
    assert young_daly_interval(300.0, M) == pytest.approx(math.sqrt(2 * 300.0 * M))
    x = 50.0 / (2 * M)
    assert young_daly_interval(50.0, M, daly=True) == pytest.approx(
        math.sqrt(2 * 50.0 * M) * (1 + math.sqrt(x) / 3 + x / 9) - 50.0)


def test_simulated_failures_agree_with_the_model():
    """Exponential failures, 400 MTBFs of work: the simulated goodput is near the model's
    and best near Young's interval (a seeded simulation: no timing involved)."""
    C, M, R = 20.0, 3600.0, 30.0
    tau = young_daly_interval(C, M)
    sims = {f: simulate(tau * f, C, M, R, work_s=400 * M, seed=1) for f in (0.2, 1.0, 5.0)}
    assert sims[1.0] > sims[0.2] and sims[1.0] > sims[5.0]
    assert sims[1.0] == pytest.approx(model_goodput(tau, C, M, R), abs=0.02)


def test_report_marks_the_events_of_a_merged_log(tmp_path):
    pytest.importorskip("matplotlib")
    from minipar.observe.report import main as report_main
    steps = [{"step": s, "loss": 5.0 - 0.1 * s, "step_time_s": 0.01, "tokens_per_s": 100.0,
              "per_rank": {"step_time_s": [0.01] * w, "compute_s": [0.01] * w}}
             for s, w in zip(range(6), (4, 4, 4, 2, 2, 2))]
    event = {"kind": "failure", "what": "rank 1 killed by signal 9", "resume_step": 3,
             "world_after": 2}
    records = [{"header": {"layout": "dp4"}}] + steps[:3] + [{"event": event}] + steps[3:]
    log = tmp_path / "merged.json"
    log.write_text("\n".join(json.dumps(r) for r in records) + "\n")
    assert report_main([str(log), "--out", str(tmp_path / "out")]) == 0
    page = (tmp_path / "out" / "index.html").read_text()
    assert "event at step 3: rank 1 killed by signal 9 -&gt; 2 ranks" in page
