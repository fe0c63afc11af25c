"""Ulysses context parallelism (and the hybrid: Ulysses inside groups of U, the ring across).

Training runs in fp64 against the single process: losses, final weights and Adam moments
to 1e-9 (relative to each array's largest entry, as tests/test_context_parallel.py) for
ulysses cp2 and cp4 and the hybrid cp4 U=2, with naive and flash attention, gpt2 (4
heads) and llama (4 query heads, 2 key/value heads: cp4 repeats each twice), and ulysses
cp2 with tp2 and with pp2 (and, slow, the hybrid with full recomputation and
ulysses cp2 × dp2 with ZeRO-3).  At op level (tests/scripts/ulysses_attention.py, every U
dividing cp, Hkv in H, 2, 1): outputs and dQ, dK, dV to 1e-12 of one process, and the
bytes the transport counted for one attention layer equal to ``ulysses.py``'s formula.
A Ulysses degree the heads cannot take is refused in one line before any message.
"""
import dataclasses
import re

import pytest

from minipar.config import ConfigError, TrainConfig
from minipar.parallel.context import positions_of, ulysses_positions
from tests.cli import train
from tests.mpirun import run_mpi
from tests.test_context_parallel import assert_close_run

GPT2 = ["--model", "tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "4", "--seq-len", "16"]
LLAMA = ["--model", "llama-tiny", "--n-layer", "2", "--d-model", "16", "--n-head", "4",
         "--n-kv-head", "2", "--seq-len", "16"]
MODELS = {"gpt2": GPT2, "llama": LLAMA}
ULYSSES_CP2 = (2, ["--cp", "2", "--cp-kind", "ulysses"])
ULYSSES_CP4 = (4, ["--cp", "4", "--cp-kind", "ulysses"])
HYBRID = (4, ["--cp", "4", "--cp-kind", "ulysses", "--cp-ulysses", "2"])
WITH_TP = (4, ["--cp", "2", "--cp-kind", "ulysses", "--tp", "2"])
WITH_PP = (4, ["--cp", "2", "--cp-kind", "ulysses", "--pp", "2", "--microbatches", "2"])


@pytest.fixture(scope="module")
def single(tmp_path_factory):
    """The single-process run of each (model, attention), trained once when first asked."""
    runs = {}

    def run(model, attention):
        if (model, attention) not in runs:
            runs[model, attention] = train(tmp_path_factory.mktemp(f"{model}_{attention}"), "single",
                                           1, "--attention", attention, model=MODELS[model], batch=8)
        return runs[model, attention]
    return run


def _cases():
    """Every (model, attention, layout): gpt2 and llama with 2 KV heads, naive and flash, ulysses cp2 and cp4, the hybrid cp4 U=2, ulysses × tp2 and × pp2; a representative few run by default."""
    default = {("gpt2", "naive", "ulysses cp4"), ("llama", "flash", "hybrid cp4 U=2"),
               ("gpt2", "naive", "ulysses cp2 tp2")}
    layouts = {"ulysses cp2": ULYSSES_CP2, "ulysses cp4": ULYSSES_CP4, "hybrid cp4 U=2": HYBRID}
    cases = [(m, a, name, layout) for m in MODELS for a in ("naive", "flash")
             for name, layout in layouts.items()]
    cases += [(m, "naive", f"ulysses cp2 {axis}", layout) for m in MODELS
              for axis, layout in (("tp2", WITH_TP), ("pp2", WITH_PP))]
    cases += [("llama", "naive", "hybrid cp4 U=2 recompute full",
               (4, HYBRID[1] + ["--recompute", "full"])),
              ("llama", "naive", "ulysses cp2 dp2 zero3", (4, ULYSSES_CP2[1] + ["--dp", "2", "--zero", "3"]))]
    return [pytest.param(*case, id=f"{case[0]} {case[1]} {case[2]}",
                         marks=() if case[:3] in default else pytest.mark.slow) for case in cases]


@pytest.mark.parametrize("model,attention,name,layout", _cases())
def test_parity_with_single_process(tmp_path, single, model, attention, name, layout):
    n, flags = layout
    run = train(tmp_path, "run", n, *flags, "--attention", attention, model=MODELS[model], batch=8,
                timeout=240)
    assert_close_run(run, single(model, attention))


@pytest.mark.parametrize("cp", [pytest.param(2, marks=pytest.mark.slow), 4])
def test_attention_and_bytes_against_one_process(cp):
    """Every (U | cp, Hkv, naive|flash) within 1e-12 of one process on every rank, and the
    counted bytes of one attention layer, forward and backward, equal to the formula."""
    output = run_mpi(cp, ["tests/scripts/ulysses_attention.py"], timeout=240).stdout
    degrees = [u for u in range(1, cp + 1) if cp % u == 0]
    parity = re.findall(r"^parity cp=\d+ U=(\d+) Hkv=(\d+) kind=(\w+) max_rel=(\S+)$", output, re.M)
    assert len(parity) == len(degrees) * 3 * 2, output
    assert all(float(error) <= 1e-12 for *_, error in parity), output
    sent = re.findall(r"^bytes cp=\d+ U=(\d+) Hkv=(\d+) kind=\w+ counted=(\d+) formula=(\d+)$",
                      output, re.M)
    assert len(sent) == len(parity) and all(c == f for *_, c, f in sent), output
    by_case = {(int(u), int(h)): int(c) for u, h, c, _ in sent}
    # Ulysses' bytes fall as 1/C where the ring's stay ~6·B·Hkv·S·d: with all heads
    # travelling (Hkv = H = 8) pure Ulysses sends less than the ring; with one KV head
    # the ring moves H times fewer numbers and wins.
    assert by_case[cp, 8] < by_case[1, 8] and by_case[cp, 1] > by_case[1, 1], by_case


def test_positions_cover_the_sequence_and_match_the_ring_where_the_ring_runs():
    for cp, ulysses in ((2, 2), (4, 4), (4, 2), (4, 1), (8, 2)):
        for zigzag in (True, False):
            held = [ulysses_positions(r, cp, ulysses, 48, zigzag) for r in range(cp)]
            assert sorted(x for h in held for x in h) == list(range(48))
            ring = cp // ulysses
            for group in range(ring):      # a Ulysses group holds one ring rank's positions
                union = sorted(x for h in held[group * ulysses:(group + 1) * ulysses] for x in h)
                assert union == sorted(positions_of(group, ring, 48, zigzag))


@pytest.mark.parametrize("fields,message", [
    (dict(cp=4, cp_kind="ulysses", n_head=6, d_model=24), "6 query heads cannot be split over a "
     "Ulysses degree of 4"),
    (dict(cp=4, cp_kind="ulysses", cp_ulysses=4, tp=2, n_head=4, d_model=16),
     "2 query heads per tensor-parallel rank cannot be split over a Ulysses degree of 4"),
    (dict(cp=4, cp_kind="ulysses", cp_ulysses=3), "`cp_ulysses` 3 must divide `cp` 4"),
    (dict(cp=2, cp_ulysses=2), "`cp_ulysses` is the Ulysses degree: it needs `cp_kind` ulysses"),
    (dict(cp_kind="ulysses"), "`cp_kind` belongs to context parallelism"),
    (dict(model="llama-tiny", cp=4, cp_kind="ulysses", n_head=12, n_kv_head=6, d_model=48),
     "6 key/value heads and a Ulysses degree of 4: one must divide the other"),
])
def test_bad_ulysses_layouts_are_refused(fields, message):
    config = TrainConfig(**{"model": "tiny", **fields})
    with pytest.raises(ConfigError, match=re.escape(message)):
        config.resolve(world_size=config.world_size)


def test_refused_in_one_line_before_any_message():
    """mpiexec -n 4 with 2 heads and cp 4: exit 2, one line on stderr per rank, nothing
    else — the rule runs before the ranks talk."""
    proc = run_mpi(4, ["-m", "minipar", "train", "--model", "tiny", "--n-head", "2", "--cp", "4",
                       "--cp-kind", "ulysses", "--steps", "1"], timeout=120, check=False)
    assert proc.returncode == 2, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    want = "minipar train: 2 query heads cannot be split over a Ulysses degree of 4"
    assert lines and all(line.startswith(want) for line in lines), proc.stderr


LONG = dict(model="tiny", n_layer=2, d_model=64, n_head=4, seq_len=2048, batch_size=4,
            data="stdlib-bytes")


def test_plan_searches_the_ring_ulysses_and_the_hybrid_where_the_sequence_is_long():
    from minipar.perf.plan import context_layouts, describe, plan
    long, short = TrainConfig(**LONG).model_config(), TrainConfig(model="tiny").model_config()
    assert list(context_layouts(4, short)) == [dict(cp=1, cp_kind="ring", cp_ulysses=None)]
    assert [(c["cp"], c["cp_kind"], c["cp_ulysses"]) for c in context_layouts(4, long)] == [
        (1, "ring", None), (2, "ring", None), (2, "ulysses", None), (4, "ring", None),
        (4, "ulysses", 2), (4, "ulysses", None)]
    ranked = plan(TrainConfig(**{**LONG, "batch_size": 1}), 4, "cpu", nodes=2).ranked  # dp 1: few
    kinds = {(p.config.cp, p.config.cp_kind, p.config.cp_ulysses) for p in ranked}
    assert {(4, "ring", None), (4, "ulysses", None), (4, "ulysses", 2)} <= kinds
    hybrid = next(p.config for p in ranked if p.config.cp_ulysses == 2)
    assert "--cp 4 --cp-kind ulysses --cp-ulysses 2" in describe(hybrid)


def test_ulysses_is_priced_as_two_all_to_alls_each_way():
    """With links only (no comm cost constants): forward = backward = the q,k,v swap and
    the output's, each (U-1)·α + (U-1)/U·bytes/B; the ring's hops are not there (R = 1)."""
    import copy
    from minipar.perf.compute import layer_shape
    from minipar.perf.context import comm_seconds_per_layer
    from minipar.perf.profile import load_profile
    prof = copy.deepcopy(load_profile("cpu"))
    prof.cost_params, prof.collectives = {}, {}
    prof.links = {"intra": {"alpha": 1e-5, "bw": 1e9}, "inter": {"alpha": 1e-4, "bw": 1e8}}
    config = TrainConfig(**LONG, cp=4, cp_kind="ulysses").resolve(4)
    x = layer_shape(config.model_config(), 4, dtype="fp32")
    n, d, e = 2048 // 4, 16, 4
    swap = lambda nbytes: 3 * 1e-5 + 3 / 4 * nbytes / 1e9   # noqa: E731  (4 ranks on one node)
    want = swap((4 + 2 * 4) * 4 * n * d * e) + swap(4 * 4 * n * d * e)
    forward, backward = comm_seconds_per_layer(prof, x, config, ranks_per_node=4)
    assert forward == pytest.approx(want) and backward == pytest.approx(want)
    across = comm_seconds_per_layer(prof, x, config, ranks_per_node=2)[0]
    assert across > forward                                 # the group spans two nodes


def test_the_ring_hides_its_hops_behind_attention_and_not_the_accumulators():
    """Forward: R-1 hops of K,V, each less the attention it overlaps; backward the same and
    R hops of the dK,dV accumulator that nothing hides (R = 4: the ring alone)."""
    import copy
    from minipar.perf.compute import layer_shape
    from minipar.perf.context import attention_core_seconds, comm_seconds_per_layer
    from minipar.perf.profile import load_profile
    prof = copy.deepcopy(load_profile("cpu"))
    prof.cost_params, prof.collectives = {}, {}
    config = TrainConfig(**LONG, cp=4).resolve(4)
    x = layer_shape(config.model_config(), 4, dtype="fp32")
    core_f, core_b = attention_core_seconds(prof, x, config)
    for bw in (1e6, 1e12):                                   # the hops longer, then shorter
        prof.links = {"intra": {"alpha": 1e-5, "bw": bw}}
        hop = 1e-5 + 2 * 4 * 4 * (2048 // 4) * 16 * 4 / bw
        forward, backward = comm_seconds_per_layer(prof, x, config, ranks_per_node=4)
        assert forward == pytest.approx(3 * max(hop - core_f / 4, 0.0))
        assert backward == pytest.approx(3 * max(hop - core_b / 4, 0.0) + 4 * hop)
    assert forward == 0.0 < backward                         # a fast link: only the accumulators


def test_the_ring_pairs_are_priced_by_their_own_curve():
    """Where the profile has ring attention's chunk-pair curve (the pair's own ops, merge
    and accumulation: ``calibrate_attention.ring_pair_curve``), the ring's core is its
    2R-1 pairs off the diagonal and 2 on it, each from that curve; without it, 2R+1
    attentions over the chunk; Ulysses alone (R = 1) runs the model's attention op."""
    import copy
    from minipar.perf.calibrate_attention import ring_pair_curve
    from minipar.perf.compute import attention_core_s, layer_shape
    from minipar.perf.context import attention_core_seconds
    from minipar.perf.profile import load_profile
    prof = copy.deepcopy(load_profile("cpu"))
    ring4 = TrainConfig(**LONG, cp=4).resolve(4)
    x = layer_shape(ring4.model_config(), 4, dtype="fp32")
    chunk = dataclasses.replace(x, s=2048 // 8)
    plain_f, plain_b = attention_core_s(prof, chunk)
    assert attention_core_seconds(prof, x, ring4) == pytest.approx((9 * plain_f, 9 * plain_b))
    size = 4 * 4 * 256 * 256 * 16
    prof.attention["ring:naive:fp32"] = [[size / 4, 1.0, 2.0, 3.0, 4.0], [size * 4, 1.0, 2.0, 3.0, 4.0]]
    assert attention_core_seconds(prof, x, ring4) == pytest.approx((7 * 1.0 + 2 * 3.0, 7 * 2.0 + 2 * 4.0))
    whole = TrainConfig(**LONG, cp=4, cp_kind="ulysses").resolve(4)
    heads = dataclasses.replace(x, t=4)
    assert attention_core_seconds(prof, x, whole) == pytest.approx(attention_core_s(prof, heads))
    [row] = ring_pair_curve("naive", [(1, 2, 8, 4)])            # measured: size, then 4 positive times
    assert row[0] == 1 * 2 * 8 * 8 * 4 and len(row) == 5 and min(row[1:]) > 0


def test_the_hybrids_rings_share_the_link_they_cross():
    """Hybrid U = 2 over 2 nodes of 2: both ranks of a node hop to the other node at once
    (two rings side by side), so a hop moves twice the block through the link; the ring
    alone (stride 1) crosses with one flow per direction."""
    import copy
    from minipar.perf.comm import Cyclic
    from minipar.perf.context import comm_seconds_per_layer, crossing_flows
    from minipar.perf.compute import layer_shape
    from minipar.perf.profile import load_profile
    assert (crossing_flows(1, 2), crossing_flows(2, 2), crossing_flows(2, 4), crossing_flows(8, 4)) == (1, 2, 2, 4)
    assert crossing_flows(1, Cyclic(2, 2)) == 2
    prof = copy.deepcopy(load_profile("cpu"))
    prof.cost_params, prof.collectives = {}, {}
    prof.links = {"intra": {"alpha": 0.0, "bw": 1e12}, "inter": {"alpha": 1e-4, "bw": 1e8}}
    prof.attention["ring:naive:fp32"] = [[1.0, 0.0, 0.0, 0.0, 0.0], [1e12, 0.0, 0.0, 0.0, 0.0]]
    config = TrainConfig(**LONG, cp=4, cp_kind="ulysses", cp_ulysses=2).resolve(4)
    x = layer_shape(config.model_config(), 4, dtype="fp32")
    block = 2 * 4 * 2 * (2048 // 2) * 16 * 4                  # K,V of 2 heads, S/R positions
    forward, backward = comm_seconds_per_layer(prof, x, config, ranks_per_node=2)
    hop = 1e-4 + 2 * block / 1e8
    swaps = comm_seconds_per_layer(prof, x, config, ranks_per_node=4)[0] - block / 1e12   # one node: less its hop
    assert forward == pytest.approx(hop + swaps, rel=1e-6)
    assert backward == pytest.approx(3 * hop + swaps, rel=1e-6)
