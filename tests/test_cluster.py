"""A cluster on one machine (minipar/cluster): two nodes as network namespaces, a shaped
link between them.

Where root, ``ip`` and ``tc`` exist (CI has them) a 2 × 2 cluster is brought up under a
prefix of this test's own: MPI places ranks {0, 1} and {2, 3} on the two nodes, minipar's
all-reduces across them give NumPy's sum, and the bytes really crossed the link — the
veth counters grew by at least what the ring must send between the nodes.  ``down``
leaves nothing behind, also after a crash lost the state file.  Elsewhere those tests
skip with the reason; the refusals are checked everywhere."""
import json
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from minipar.cluster import ClusterError, ClusterSpec, launch, netns
from minipar.cluster.topology import state_dir
from tests.mpirun import REPO

PREFIX = f"mpt{os.getpid() % 10000}"


def can_build_namespaces():
    if os.geteuid() != 0 or not shutil.which("ip") or not shutil.which("tc"):
        return "needs root, ip and tc"
    probe = f"{PREFIX}-probe"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None if made.returncode == 0 else f"cannot create a network namespace: {made.stderr.strip()}"


WHY_NOT = can_build_namespaces()
needs_namespaces = pytest.mark.skipif(WHY_NOT is not None, reason=str(WHY_NOT))


def cluster(action, *args, prefix=PREFIX, timeout=300):
    """``python -m minipar cluster ACTION --prefix PREFIX ARGS...`` (one line on refusal)."""
    env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1", MINIPAR_COMM_CHECK="1")
    cmd = [sys.executable, "-m", "minipar", "cluster", action, "--prefix", prefix, *map(str, args)]
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def two_nodes():
    proc = cluster("up", "--nodes", 2, "--ranks-per-node", 2, "--inter-gbps", 1)
    assert proc.returncode == 0, proc.stderr
    try:
        yield ClusterSpec.load(PREFIX)
    finally:
        cluster("down")


@needs_namespaces
def test_ranks_on_two_nodes_reduce_across_the_shaped_link(two_nodes):
    before = netns.link_bytes(two_nodes)
    proc = cluster("run", "--", "tests/scripts/cluster_check.py")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(proc.stdout.split("RESULT ", 1)[1].splitlines()[0])
    assert result["nodes"] == [[0, 1], [2, 3]]
    assert all(e <= 1e-14 for e in result["errors"].values()), result
    assert result["ranks_sharing_cores"] == 4            # both nodes' ranks: one machine
    assert result["profile"] == os.path.join(state_dir(PREFIX), "profile.json")
    assert result["inter_bw"] == 1e9 / 8 and result["nodes_per_host"] == 2
    after = netns.link_bytes(two_nodes)
    # a ring all-reduce of S bytes over 4 ranks sends 2·3/4·S per rank; ranks 1 -> 2 and
    # 3 -> 0 cross between the nodes, so each node sends at least 2·(3/4)·1 MiB out
    for node in two_nodes.hosts:
        sent = after[node]["out_of"] - before[node]["out_of"]
        assert sent >= 1.5 * 2 ** 20, (node, sent)
    status = cluster("status")
    assert f"{PREFIX}-n0" in status.stdout and "MiB out" in status.stdout


@needs_namespaces
def test_two_clusters_side_by_side_take_different_subnets(two_nodes):
    other = "mpo" + PREFIX[3:]
    assert cluster("up", "--nodes", 1, "--ranks-per-node", 1, "--inter-gbps", 1, prefix=other).returncode == 0
    try:
        assert ClusterSpec.load(other).subnet != two_nodes.subnet
        assert cluster("run", "--", "tests/scripts/cluster_check.py").returncode == 0
    finally:
        cluster("down", prefix=other)


@needs_namespaces
def test_down_removes_everything_also_after_a_crash():
    assert cluster("up", "--nodes", 3, "--ranks-per-node", 1, "--inter-gbps", 0.5).returncode == 0
    again = cluster("up", "--nodes", 3, "--ranks-per-node", 1, "--inter-gbps", 0.5)
    assert again.returncode == 2 and "already up" in again.stderr
    shutil.rmtree(state_dir(PREFIX))                                    # the crash lost the state
    down = cluster("down")
    assert down.returncode == 0 and "removed 3 nodes" in down.stdout, down.stderr
    assert netns.existing(PREFIX) == {"namespaces": [], "links": []}
    assert "nothing is up" in cluster("status").stdout


@pytest.mark.parametrize("kwargs,says", [
    (dict(nodes=0, ranks_per_node=1, inter_gbps=1), "--nodes must be between 1"),
    (dict(nodes=2, ranks_per_node=0, inter_gbps=1), "--ranks-per-node must be >= 1"),
    (dict(nodes=2, ranks_per_node=1, inter_gbps=0), "--inter-gbps must be a number in (0, 1000]"),
    (dict(nodes=2, ranks_per_node=1, inter_gbps=float("nan")), "--inter-gbps"),
    (dict(nodes=2, ranks_per_node=1, inter_gbps=1, prefix="Bad-Name"), "--prefix must be"),
])
def test_bad_specs_are_refused(kwargs, says):
    with pytest.raises(ClusterError, match=re.escape(says)):
        ClusterSpec(**kwargs)


def test_refusals_are_one_line(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(ClusterError, match="needs root"):
        netns.require_tools()
    spec = ClusterSpec(2, 2, 1.0, prefix=PREFIX)
    with pytest.raises(ClusterError, match="-n must be between 1 and 4"):
        launch.mpiexec_command(spec, ["train"], nprocs=5)
    with pytest.raises(ClusterError, match="needs a command"):
        launch.program([])
    proc = cluster("run", "--", "train", prefix="nosuch", timeout=60)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1 and "no cluster 'nosuch'" in proc.stderr


def test_the_launch_command_places_ranks_through_the_wrapper():
    spec = ClusterSpec(2, 3, 1.0, prefix=PREFIX)
    cmd = launch.mpiexec_command(spec, ["train", "--dp", "6"])
    assert cmd[cmd.index("-hosts") + 1] == f"{PREFIX}-n0,{PREFIX}-n1"
    assert cmd[cmd.index("-ppn") + 1] == "3" and cmd[cmd.index("-n") + 1] == "6"
    assert cmd[cmd.index("-bootstrap-exec") + 1] == spec.wrapper
    assert cmd[cmd.index("UCX_TLS") + 1] == "tcp,self"
    assert cmd[-6:] == [sys.executable, "-m", "minipar", "train", "--dp", "6"]
    assert launch.program(["x.py", "-k"]) == [sys.executable, "x.py", "-k"]
    cyclic = launch.mpiexec_command(spec, ["train"], placement="cyclic")
    assert cyclic[cyclic.index("-hosts") + 1] == f"{PREFIX}-n0:1,{PREFIX}-n1:1" and "-ppn" not in cyclic
    assert launch.program(["env"]) == ["env"]
    supervised = launch.command(spec, ["launch", "--np", "6", "--", "train", "--hosts-like", "x"])
    assert supervised[:5] == [sys.executable, "-m", "minipar", "launch", "--hosts"]   # ours added
    assert supervised[5] == spec.hosts_file and "mpiexec" not in " ".join(supervised)
    given = launch.command(spec, ["launch", "--hosts", "mine", "--np", "6", "--", "train"])
    assert given.count("--hosts") == 1 and "mine" in given


def test_the_ranks_get_the_users_settings_or_their_own(tmp_path, monkeypatch):
    """The ranks' environment: the cluster's profile unless the user named one; the thread
    variables the user set, but not those the launcher's own process budget wrote (each
    rank counts the ranks on this machine itself)."""
    spec = ClusterSpec(2, 1, 1.0, prefix=PREFIX)
    monkeypatch.setattr(ClusterSpec, "state_dir", property(lambda self: str(tmp_path)))
    (tmp_path / "profile.json").write_text("{}")
    ours = {"OMP_NUM_THREADS": "2", "OPENBLAS_NUM_THREADS": "2", "MINIPAR_BLAS_THREADS": "2"}
    env = launch.run_environment(spec, base=dict(ours, PATH="/bin"))
    assert not any(name in env for name in ours) and env["PATH"] == "/bin"
    assert env["MINIPAR_PROFILE"] == str(tmp_path / "profile.json")
    mine = launch.run_environment(spec, base={"OMP_NUM_THREADS": "3", "MINIPAR_PROFILE": "p.json"})
    assert mine["OMP_NUM_THREADS"] == "3" and mine["MINIPAR_PROFILE"] == "p.json"


def test_the_wrapper_runs_only_this_clusters_nodes(tmp_path, monkeypatch):
    """mpiexec calls it as ssh: options first, then the host, then the command."""
    from minipar.cluster import topology
    monkeypatch.setattr(topology.tempfile, "gettempdir", lambda: str(tmp_path))
    spec = ClusterSpec(2, 1, 1.0, prefix=PREFIX)
    spec.save()
    assert open(spec.hosts_file).read() == f"{PREFIX}-n0 1\n{PREFIX}-n1 1\n"
    proc = subprocess.run([spec.wrapper, "-x", "other-host", "echo", "hi"], capture_output=True, text=True)
    assert proc.returncode == 255 and "other-host is not a node of cluster" in proc.stderr


@needs_namespaces
def test_a_lost_node_and_the_run_finishes_on_the_survivor(tmp_path):
    """Node 1 of 2 lost at step 10 of 30 (fp64, tiny): ``launch`` finds the failure names
    no rank, asks the launcher which node still answers, drops the dead one and resumes
    from the step-10 checkpoint on node 0 alone — the uninterrupted single process's
    losses, step for step."""
    from minipar.observe.runlog import step_records
    assert cluster("up", "--nodes", 2, "--ranks-per-node", 1, "--inter-gbps", 1).returncode == 0
    try:
        train = ["--model", "tiny", "--n-layer", 2, "--precision", "fp64", "--steps", 30,
                 "--batch-size", 8, "--eval-batches", 0, "--quiet", "--seed", 0]
        log, run_dir = tmp_path / "log.json", tmp_path / "run"
        env = dict(os.environ, PYTHONPATH=REPO, OMP_NUM_THREADS="1")
        job = subprocess.Popen(
            [sys.executable, "-m", "minipar", "cluster", "run", "--prefix", PREFIX, "--", "launch",
             "--np", "2", "--hang-timeout", "5", "--run-dir", run_dir, "--", "train", *map(str, train),
             "--save-every", "5", "--save", tmp_path / "ckpt", "--log-json", log, "--hang-timeout", "15"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        first = run_dir / "attempt-1" / "log.json"
        deadline = time.time() + 240
        while time.time() < deadline and job.poll() is None:
            if first.exists() and first.read_text().count('"step"') >= 10:
                break
            time.sleep(0.05)
        lost = cluster("fail-node", 1)
        assert lost.returncode == 0, lost.stderr
        out, _ = job.communicate(timeout=300)
        assert job.returncode == 0, out[-3000:]
        assert f"host {PREFIX}-n1 removed" in out and "1 rank(s)" in out, out[-3000:]
        single = tmp_path / "single.json"
        subprocess.run([sys.executable, "-m", "minipar", "train", *map(str, train), "--log-json", single],
                       cwd=REPO, env=env, check=True, capture_output=True, timeout=120)
        got = {r["step"]: r["loss"] for r in step_records(log)}
        want = {r["step"]: r["loss"] for r in step_records(single)}
        assert sorted(got) == sorted(want) == list(range(30)), sorted(got)
        assert max(abs(got[k] - want[k]) / abs(want[k]) for k in want) <= 1e-9
        assert netns.existing(PREFIX)["namespaces"] == [f"{PREFIX}-n0"]
    finally:
        cluster("down")
    assert netns.existing(PREFIX) == {"namespaces": [], "links": []}
