"""plan and its pieces: formulas, refusals identical to train's, auto_layout, the cost model.

Timing never decides a test here: the step-time model is checked against its own
formulas (FLOPs, the ring all-reduce, the bubble) and the shipped A100 profile
against the published iteration times it was documented with.
"""
import math

import pytest

from minipar.comm import cost_model as cm
from minipar.config import ConfigError, TrainConfig
from minipar.nn import GPT
from minipar.perf import comm as pcomm
from minipar.perf.estimate import flops_per_token, predict
from minipar.perf.models import KORTHIKANTI, korthikanti_config
from minipar.perf.pipeline import pipeline_time
from minipar.perf.plan import auto_layout, candidates, plan, plan_main
from minipar.perf.profile import Profile, load_profile


def test_flops_per_token_is_the_models():
    """The estimate reads the model's count; the closed form 6N + 12·L·h·s, N = gpt2's
    12h² + 13h per layer, the head V·h and the final norm 2h, checks it."""
    for n in ("tiny", "small"):
        cfg = TrainConfig(model=n).model_config()
        h, L, V = cfg.d_model, cfg.n_layer, cfg.vocab_size
        n_matmul = L * 12 * h * h + L * 13 * h + V * h + 2 * h
        assert flops_per_token(cfg) == GPT(cfg).flops_per_token() == \
            6 * n_matmul + 12 * L * h * cfg.seq_len


def test_ring_all_reduce_time_from_links():
    prof = Profile("x", links={"intra": {"alpha": 1e-5, "bw": 1e10}})
    p, S = 8, 1 << 26
    want = 2 * (p - 1) * 1e-5 + 2 * (p - 1) / p * S / 1e10
    assert pcomm.collective_seconds(prof, "all_reduce", p, S) == pytest.approx(want)
    assert pcomm.collective_seconds(prof, "all_gather", p, S) == pytest.approx(want / 2)


@pytest.mark.parametrize("kind,v", [("1f1b", 1), ("afab", 1), ("interleaved", 2)])
def test_bubble_is_the_closed_form(kind, v):
    p, m = 4, 8
    _, bubble, _ = pipeline_time(kind, p, m, v, 1.0, 2.0)
    assert bubble == pytest.approx((p - 1) / (v * m + p - 1))


def test_plan_refuses_what_train_refuses_for_the_same_reasons():
    base = TrainConfig(model="tiny", batch_size=6)
    world = 6
    pl = plan(base, world, "cpu")
    reasons = {}
    accepted = 0
    for cand in candidates(base, world, ranks_per_node=world):
        try:
            cand.resolve(world)
            accepted += 1
        except ConfigError as err:
            reasons[str(err)] = reasons.get(str(err), 0) + 1
    assert pl.refused == reasons and reasons      # e.g. n_head 4 is not divisible by tp 3
    assert len(pl.ranked) + len(pl.too_big) == accepted
    for p in pl.ranked:
        assert p.config.resolve(world) == p.config


def test_plan_drops_what_does_not_fit_and_says_by_how_much():
    base = TrainConfig(model="tiny", batch_size=8)
    pl = plan(base, 2, "cpu", mem_per_rank=6e6)
    assert pl.too_big and all(over > 0 for _, over in pl.too_big)
    assert all(p.mem_bytes <= 6e6 for p in pl.ranked)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_auto_layout_returns_a_config_that_resolves(world):
    config = TrainConfig(model="tiny", batch_size=8, steps=3, precision="fp64")
    best, text = auto_layout(config, world)
    assert best.resolve(world) == best and best.world_size == world
    assert best.precision == "fp64" and best.steps == 3 and "best: mpiexec" in text


def test_plan_main_prints_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    assert plan_main(["--ranks", "4", "--model", "tiny", "--batch-size", "8", "--json", str(out)]) == 0
    assert "best: mpiexec -n 4" in capsys.readouterr().out and out.read_text().startswith("[")


def test_a100_profile_predicts_the_published_runs():
    prof = load_profile("a100")
    errors = []
    for name, row in KORTHIKANTI.items():
        for recompute, measured in (("full", row[8]), ("selective", row[9])):
            config, _ = korthikanti_config(name, recompute)
            errors.append(abs(predict(config, prof).step_s / measured - 1))
    assert sum(errors) / len(errors) <= 0.15


class _NoComm:
    """A communicator without MPI: params() must not need one."""
    cache = {}


def test_cost_params_never_calibrate_silently(monkeypatch):
    for k in ("ALPHA", "BETA", "GAMMA"):
        monkeypatch.delenv(f"MINIPAR_COMM_{k}", raising=False)
    monkeypatch.delenv("MINIPAR_COMM_PROFILE", raising=False)
    comm = _NoComm()
    comm.cache = {}
    assert cm.params(comm) == cm.DEFAULTS
    c = cm.use(comm, cm.CostParams(alpha=1e-6))
    assert cm.params(comm) is c


def test_auto_follows_measured_winners():
    c = cm.CostParams(alpha=5e-6, beta=1e-10, gamma=1e-10)
    model_pick = cm.choose(2, 1 << 16, c)
    other = "tree" if model_pick != "tree" else "ring"
    measured = cm.CostParams(alpha=5e-6, beta=1e-10, gamma=1e-10,
                             winners=((1 << 16, other),), winners_p=2)
    assert cm.choose(2, 1 << 16, measured) == other
    assert cm.choose(4, 1 << 16, measured) == cm.choose(4, 1 << 16, c)   # other p: the model
    assert cm.choose(2, 1 << 24, measured) == cm.choose(2, 1 << 24, c)   # far size: the model


def test_out_of_cache_rates_raise_large_all_reduces():
    small = cm.CostParams(alpha=5e-6, beta=4e-10, gamma=4e-11)
    big = cm.CostParams(alpha=5e-6, beta=4e-10, gamma=4e-11, beta_large=1e-9,
                        gamma_large=3e-10, cache_bytes=1 << 20)
    S = 16 << 20
    assert cm.predict("ring", 2, S, big) > 2 * cm.predict("ring", 2, S, small)
    assert cm.predict("ring", 2, 4096, big) == cm.predict("ring", 2, 4096, small)
    assert math.isfinite(cm.predict("recursive_doubling", 3, S, big))


def test_placement_block_keeps_tp_inside_a_node_and_cyclic_spreads_it():
    """2 nodes x 2 ranks: block puts ranks {0,1} on node 0, cyclic rank r on node r mod 2;
    with a slow link between nodes tp2 x dp2 is faster with tp inside a node (block),
    and a profile's intra curve never stands in for a missing inter one."""
    block, cyclic = 2, pcomm.Cyclic(2, 2)
    assert pcomm.placement(2, 1, block) == "intra" and pcomm.placement(2, 2, block) == "inter"
    assert pcomm.placement(2, 1, cyclic) == "inter" and pcomm.placement(2, 2, cyclic) == "intra"
    assert cyclic == 2 and cyclic.nodes == 2                      # still the node size
    prof = Profile("cluster", links={"intra": {"alpha": 1e-5, "bw": 1e10},
                                     "inter": {"alpha": 1e-4, "bw": 1.25e8}},
                   collectives={"all_reduce": {"2:intra": [[1, 1e-5], [1 << 30, 0.1]]}}, ranks_per_node=2)
    assert prof.curve("all_reduce", 2, "inter") is None
    # the byte model (vocabulary 256): with the 4,096-token default the embedding's gradient
    # makes dp's all-reduce the larger one, and dp inside a node (cyclic) wins instead
    config = TrainConfig(model="small", tp=2, dp=2, batch_size=16, data="stdlib-bytes").resolve(4)
    inside, across = (predict(config, prof, ranks_per_node=r) for r in (block, cyclic))
    assert inside.breakdown["tp_s"] < across.breakdown["tp_s"]
    assert inside.step_s < across.step_s
    best = plan(TrainConfig(model="small", batch_size=16, data="stdlib-bytes"), 4, prof,
                placements=("block", "cyclic"))
    ranked = [(p.config.tp, p.config.dp, p.config.pp, p.breakdown["placement"]) for p in best.ranked]
    assert ranked.index((2, 2, 1, "block")) < ranked.index((2, 2, 1, "cyclic"))


def test_layout_auto_resolves_to_the_plans_first_layout(monkeypatch, capsys):
    """``train --layout auto`` on 4 ranks runs exactly the layout ``minipar plan`` ranks
    first for the same run — the fastest predicted — with the run's other settings kept.
    The profile is the shipped h100 one ($MINIPAR_PROFILE), so nothing is measured here."""
    from minipar.cli import build_parser
    from minipar.cli.run_config import config_from_flags
    from minipar.config.probes import with_data
    monkeypatch.setenv("MINIPAR_PROFILE", "h100")
    world = 4
    run = ["train", "--model", "tiny", "--batch-size", "16", "--data", "stdlib-bytes", "--seed", "7"]
    chosen = config_from_flags(build_parser().parse_args(run + ["--layout", "auto"]), (0, world))
    base = with_data(TrainConfig.from_namespace(build_parser().parse_args(run)))
    ranked = plan(base, world, "h100").ranked
    assert len({p.config.layout_name() for p in ranked}) > 1       # a choice was made
    assert ranked[0].step_s == min(p.step_s for p in ranked)
    assert chosen == ranked[0].config.resolve(world)
    assert chosen.seed == 7 and chosen.batch_size == 16
    assert f"--layout auto: running {chosen.layout_name()}\n" in capsys.readouterr().out
