"""all_to_all (all-to-all-v): against NumPy on 1..8 ranks, its traffic against the formulas,
its misuse answered on every rank, its name in the watchdog's report, and its cost model
against the closed forms (tests/scripts/comm_alltoall.py runs the multi-rank parts)."""
import json
import re
from dataclasses import replace

import pytest

from minipar.comm import cost_model, two_level
from minipar.comm.cost_params import CostParams
from tests.mpirun import run_mpi

CHECK = {"MINIPAR_COMM_CHECK": "1", "MINIPAR_HANG_TIMEOUT": "60"}   # a hang names who waits
HANG_S = 180   # a guard, not a speed: past the watchdog's 60 s, so a hang fails with its report
SCRIPT = "tests/scripts/comm_alltoall.py"
ARG, MISMATCH = "CollectiveArgumentError", "CollectiveMismatchError"


def slow(*values):
    return pytest.param(*values, marks=pytest.mark.slow)


# every group, algorithm and counts pattern; 4 ranks also with blocks past 1 MiB (segments
# across the pretend nodes); --full: every dtype x row shape x out on every pattern
@pytest.mark.parametrize("nprocs,extra", [
    (1, []), (2, []), (3, []), (4, ["--big", "1000"]),
    slow(3, ["--full"]), slow(4, ["--full"]), slow(5, []), slow(6, ["--big", "1000"]),
    slow(7, []), slow(8, [])])
def test_all_to_all_matches_numpy(nprocs, extra):
    proc = run_mpi(nprocs, [SCRIPT, "fuzz", *extra], timeout=HANG_S, env=CHECK)
    assert re.search(rf"OK \d+ cases on {nprocs} ranks", proc.stdout), proc.stdout


@pytest.mark.parametrize("nprocs", [4, slow(3), slow(6)])
def test_bytes_sent_are_the_formulas(nprocs):
    """pairwise: Σ_{d≠r} counts[d]·w from rank r, in one message per non-empty block;
    two_level: the bytes of its steps in the cost model, and what leaves a node is what
    its ranks send to other nodes, once."""
    proc = run_mpi(nprocs, [SCRIPT, "traffic"], timeout=HANG_S, env=CHECK)
    assert f"traffic OK on {nprocs} ranks" in proc.stdout


# case -> (error on every rank, text in its message) per mode; modes absent: not run there
THREE = "3-rank communicator"
EXPECTED = {
    "width differs, one rank": {"check": (MISMATCH, "ranks 1: dtype=float32 width=3")},
    "dtype differs, one rank": {"check": (MISMATCH, "ranks 1: dtype=float64 width=2")},
    "algorithm differs, one rank": {"check": (MISMATCH, "ranks 1: dtype=float32 width=2 "
                                                        "algorithm=two_level")},
    "counts too short, one rank": {"check": (ARG, f"rank 1: all_to_all: counts has 2 entries "
                                                  f"for a {THREE}")},
    "counts negative, one rank": {"check": (ARG, "rank 1: all_to_all: counts has a negative entry")},
    "counts do not add up, one rank": {"check": (ARG, "rank 1: all_to_all: counts add up to 4 "
                                                      "rows but send has 3")},
    "counts not integers, one rank": {"check": (ARG, "rank 1: all_to_all: counts must be 3 "
                                                     "integers")},
    "async counts do not add up, one rank": {"check": (ARG, "rank 1: all_to_all: counts add up "
                                                            "to 0 rows")},
    "out rows wrong, one rank": {mode: (ARG, "rank 1: all_to_all: out has 5 rows; the rank "
                                             "receives 3") for mode in ("check", "nocheck")},
    "row size differs, one rank (no agreement)": {
        "check": (MISMATCH, "ranks 1: dtype=float32 width=3"),
        "nocheck": (MISMATCH, "ranks disagree on the row size (width x itemsize):\n"
                              "  ranks 0,2: 8 bytes\n  ranks 1: 12 bytes")},
    "counts too long": {mode: (ARG, f"counts has 4 entries for a {THREE}")
                        for mode in ("check", "nocheck")},
    "counts not a sequence": {mode: (ARG, "counts must be 3 integers (rows for each rank), not 3")
                              for mode in ("check", "nocheck")},
    "send 0-d": {mode: (ARG, "send is 0-d") for mode in ("check", "nocheck")},
    "send object": {mode: (ARG, "send has dtype object") for mode in ("check", "nocheck")},
    "out dtype": {mode: (ARG, "out has shape (3, 2) and dtype float64; it must hold rows like "
                              "send's: shape (rows, 2) and dtype float32")
                  for mode in ("check", "nocheck")},
    "out width": {mode: (ARG, "out has shape (3, 3) and dtype float32") for mode in ("check", "nocheck")},
    "out read-only": {mode: (ARG, "out is read-only") for mode in ("check", "nocheck")},
    "unknown algorithm": {mode: (ARG, "unknown all-to-all algorithm 'bruck'; choose one of auto, "
                                      "pairwise, two_level") for mode in ("check", "nocheck")},
}
CAUGHT_BY_THE_COUNTS = ("out rows wrong, one rank", "row size differs, one rank (no agreement)")


@pytest.fixture(scope="module")
def misuse():
    proc = run_mpi(3, [SCRIPT, "misuse"], timeout=HANG_S, env=CHECK)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_the_misuse_table_covers_every_case(misuse):
    assert sorted(misuse) == sorted(EXPECTED)
    assert all(sorted(misuse[case]) == sorted(EXPECTED[case]) for case in EXPECTED)


@pytest.mark.parametrize("case", sorted(EXPECTED))
def test_misuse_is_one_error_on_every_rank_before_any_row_moves(misuse, case):
    """Check mode: every rank raises the same words, naming the rank that is wrong.  With
    check mode off, arguments wrong on every rank are refused before any message (no p2p
    call at all), and a wrong out or row size on one rank by the counts exchange, on every
    rank, before any row moves."""
    for mode, per_rank in misuse[case].items():
        kind, text = EXPECTED[case][mode]
        assert len(per_rank) == 3
        for rank, (got, message, calls, data) in enumerate(per_rank):
            assert got == kind, f"{mode}, rank {rank}: {got}: {message}"
            assert text in message, f"{mode}, rank {rank}: {message!r} lacks {text!r}"
            assert data == 0, f"{mode}, rank {rank}: {data} data messages before the error"
            if mode == "nocheck" and case not in CAUGHT_BY_THE_COUNTS:
                assert calls == 0, f"rank {rank}: {calls} messages before the error"
        if mode == "check" or case in CAUGHT_BY_THE_COUNTS:
            assert len({m for _, m, _, _ in per_rank}) == 1, per_rank


def test_the_watchdog_names_the_call_and_its_phase():
    """Rank 0 is late for a whole call (rank 1 waits in the counts exchange), then for its
    first message of rows (rank 1 waits in the pairwise exchange); the hang timeout
    (0.5 s, against 2.5 s of lateness) reports both, through ``on_hang``."""
    proc = run_mpi(2, [SCRIPT, "watchdog"], timeout=HANG_S, env={"MINIPAR_COMM_CHECK": "0"})
    reports = json.loads(proc.stdout.strip().splitlines()[-1])
    assert reports[0] == []
    assert len(reports[1]) == 2, reports
    for line, what in zip(reports[1], ("counts", "pairwise")):
        assert re.fullmatch(rf"rank 1: all_to_all \({what}\) waited \d+\.\d s for rank 0; "
                            r"ending the job \(hang timeout 0\.5 s\)", line), line


# ------------------------------------------------------------------ the cost model
FLAT = CostParams(alpha=2e-5, beta=5e-10, gamma=1e-10)                      # one β, one γ
SLOW = replace(FLAT, alpha_inter=1e-4, beta_inter=8e-9, ranks_per_node=2)   # ~1 Gbit/s


@pytest.mark.parametrize("p,q", [(4, 2), (6, 2), (6, 3), (8, 4)])
@pytest.mark.parametrize("S", [4096, 3 << 20])
def test_one_kind_of_link_is_the_closed_form(p, q, S):
    """cost_model.predict_all_to_all's docstring, with sizes on both sides of 1 MiB."""
    sized = replace(FLAT, beta_large=2e-9, gamma_large=4e-10, cache_bytes=float(1 << 20))
    for c in (FLAT, sized):
        a, m, block = c.alpha, p // q, S / p
        pairwise = (p - 1) * (a + block * cost_model.beta_of(c, block)) + \
            block * cost_model.gamma_of(c, block)
        two = ((q - 1) * (a + m * block * cost_model.beta_of(c, m * block))
               + (m - 1) * (a + q * block * cost_model.beta_of(c, q * block))
               + 2 * S * cost_model.gamma_of(c, S))
        assert cost_model.predict_all_to_all("pairwise", p, S, c, q) == pytest.approx(pairwise)
        assert cost_model.predict_all_to_all("two_level", p, S, c, q) == pytest.approx(two)
    # every rank its own node, the wire as fast as the node: per link is the flat pairwise
    same = replace(FLAT, alpha_inter=FLAT.alpha, beta_inter=FLAT.beta, ranks_per_node=1)
    assert cost_model.predict_all_to_all("pairwise", p, S, same) == pytest.approx(
        cost_model.predict_all_to_all("pairwise", p, S, FLAT))


def test_two_nodes_of_two_per_link_class():
    """two_level.predict_all_to_all's docstring, p = 4 over nodes {0, 1} and {2, 3}: the
    pairwise exchange crosses the link in all 3 rounds (S/4, S/2, S/4 through each node's
    link), two_level once (S through it) after one swap of S/2 inside."""
    S, c = 1 << 20, SLOW
    assert cost_model.predict_all_to_all("pairwise", 4, S, c) == pytest.approx(
        3 * c.alpha_inter + S * c.beta_inter + S / 4 * c.gamma)
    assert cost_model.predict_all_to_all("two_level", 4, S, c) == pytest.approx(
        c.alpha + S / 2 * c.beta + c.alpha_inter + S * c.beta_inter + 2 * S * c.gamma)


@pytest.mark.parametrize("p,q", [(4, 2), (8, 2), (8, 4), (9, 3)])
def test_two_level_crosses_the_link_once_per_node_pair_per_round(p, q):
    """The same bytes leave every node in both algorithms (each byte crosses once); the
    pairwise exchange crosses in all of its p-1 rounds, two_level in m-1."""
    m, S = p // q, 6000.0 * p
    sizes = [[S / p] * p for _ in range(p)]

    def across(steps):
        rounds = [sum(n for src, dst, n in msgs if src // q == 0 != dst // q) for msgs, _ in steps]
        return sum(rounds), sum(1 for n in rounds if n)
    pairwise = across(two_level.all_to_all_steps("pairwise", sizes, q))
    two = across(two_level.all_to_all_steps("two_level", sizes, q))
    leaving = q * (p - q) * S / p
    assert pairwise[0] == pytest.approx(leaving) and two[0] == pytest.approx(leaving)
    assert two[1] == m - 1 and pairwise[1] == p - 1


def test_auto_takes_two_levels_where_the_links_alpha_dominates():
    """Over a slow link, small blocks: two_level (fewer crossings); large: pairwise (no
    packing, no second trip inside the node)."""
    def cheaper(p, S):
        return min(cost_model.ALL_TO_ALL_ALGORITHMS,
                   key=lambda a: cost_model.predict_all_to_all(a, p, S, SLOW))
    assert cheaper(8, 1 << 12) == "two_level"
    assert cheaper(4, 16 << 20) == "pairwise"
    with pytest.raises(ValueError, match="no all-to-all cost model for 'ring'"):
        cost_model.predict_all_to_all("ring", 4, 1024, FLAT)


@pytest.mark.parametrize("argv,message", [
    (["--collective", "all_to_all", "--algorithms", "pairwise,ring"],
     "--algorithms: unknown 'ring'; choose from auto, pairwise, two_level"),
    (["--collective", "all_to_all", "--check-overhead"],
     "--check-overhead times all_reduce, all_gather and barrier; leave out --collective all_to_all"),
])
def test_bench_refuses_flags_that_do_not_fit_the_collective(argv, message):
    from minipar.cli_checks import CommandError
    from minipar.comm.bench import main
    with pytest.raises(CommandError, match=re.escape(message)):
        main(argv)
