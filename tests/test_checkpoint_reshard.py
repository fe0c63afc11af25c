"""Sharded checkpoints under MPI: a chain of reshards equals the single process (fp64,
1e-9), an async save writes the same bytes as a synchronous one, and a rank killed (-9)
inside a save leaves the previous checkpoint the latest and loadable.  The full matrix
and 20 kills: tests/scripts/reshard_matrix.py, tests/scripts/kill_during_save.py."""
import json
import os

import numpy as np
import pytest

from minipar import checkpoint
from minipar.observe.runlog import step_records
from tests.mpirun import run_mpi

MODEL = ["--model", "tiny", "--n-layer", "4", "--d-model", "32", "--seq-len", "16"]
COMMON = ["--seed", "0", "--quiet", "--eval-batches", "0", "--precision", "fp64", "--batch-size", "8",
          "--data", "stdlib-bytes"]   # the byte corpus: a 256-row head keeps the chain fast
CHAIN = [  # each segment resumes the one before under another layout: 5 reshards
    (1, []),
    (2, ["--dp", "2", "--zero", "3"]),
    (4, ["--tp", "2", "--pp", "2"]),
    (4, ["--dp", "2", "--tp", "2", "--sequence-parallel", "--zero", "2"]),
    (4, ["--cp", "2", "--dp", "2"]),
    (2, ["--pp", "2", "--chunks", "2", "--schedule", "interleaved", "--microbatches", "4"]),
]


def _train(n, tmp_path, name, *flags, env=None, check=True):
    log = tmp_path / f"{name}.json"
    proc = run_mpi(n, ["-m", "minipar", "train", *MODEL, *COMMON, "--log-json", log, *flags],
                   timeout=240, env=env, check=check)
    return proc if not check else [r["loss"] for r in step_records(log)]


def test_a_chain_of_reshards_gives_the_single_process_losses(tmp_path):
    steps = 2 * len(CHAIN)
    straight = _train(1, tmp_path, "straight", "--steps", steps)
    losses, previous = [], None
    for i, (n, layout) in enumerate(CHAIN):
        resume = ["--resume", previous] if previous else []
        previous = tmp_path / f"ckpt{i}"
        losses += _train(n, tmp_path, f"part{i}", *layout, *resume, "--steps", steps,
                         "--stop-at", 2 * (i + 1), "--save", previous)
    np.testing.assert_allclose(losses, straight, rtol=1e-9, atol=0)
    index = checkpoint.open_checkpoint(tmp_path / "ckpt1").index   # dp2 ZeRO-3: two files
    assert sorted(index["files"]) == ["rank-00000.bin", "rank-00001.bin"]
    # sample reads the pipeline's two files tensor by tensor, and the consolidated copy alike
    minipar = ["-m", "minipar"]
    run_mpi(1, [*minipar, "checkpoint", "consolidate", previous, tmp_path / "one"])
    texts = [run_mpi(1, [*minipar, "sample", "--resume", d, "--tokens", "24"]).stdout
             for d in (previous, tmp_path / "one")]
    assert texts[0] == texts[1] and len(texts[0]) > 24
    shown = run_mpi(1, [*minipar, "checkpoint", "inspect", previous]).stdout
    assert "layout pp2" in shown and "rank-00001.bin" in shown


def _checkpoint_bytes(directory, step=None):
    """{tensor key: bytes of every piece} of the latest checkpoint (or of ``step``'s), and
    its metadata without the run's own config (which names the --save-async flag and the
    log's path).  Where a piece sits in its file is left out: O_DIRECT places each piece
    by its array's address (``checkpoint/rankfile.py``), which differs between runs."""
    path = checkpoint.latest(directory) if step is None else os.path.join(directory, step)
    ckpt = checkpoint.open_checkpoint(path)
    meta = dict(ckpt.meta)
    del meta["config"]
    out = {"meta": json.dumps(meta, sort_keys=True)}
    for key, t in ckpt.index["tensors"].items():
        dtype = np.dtype(t["dtype"])
        out[key] = [(p["file"], p["box"], ckpt.piece_values(p, dtype).tobytes())
                    for p in t["pieces"]]
    return out


def test_an_async_save_writes_the_bytes_of_a_synchronous_one(tmp_path):
    flags = ["--dp", "2", "--zero", "1", "--steps", "6", "--save-every", "2"]
    sync = _train(2, tmp_path, "sync", *flags, "--save", tmp_path / "sync")
    # a slow disk: the write of step 2's checkpoint spans the steps after it
    slow = _train(2, tmp_path, "async", *flags, "--save", tmp_path / "async", "--save-async",
                  env={"MINIPAR_SAVE_SLOW_S": "0.5"})
    assert slow == sync
    assert _checkpoint_bytes(tmp_path / "async") == _checkpoint_bytes(tmp_path / "sync")
    # step 4's was written from the live state while step 5 ran, sleeping half way (the
    # slow disk): the same bytes only if step 5's optimizer update waited for the write
    step4 = "step-0000004"
    assert _checkpoint_bytes(tmp_path / "async", step4) == _checkpoint_bytes(tmp_path / "sync", step4)
    assert sorted(os.listdir(tmp_path / "async")) == ["latest", "step-0000004", "step-0000006"]


@pytest.mark.parametrize("fault", ["1:4:file", "0:4:commit", "1:4:report"])
def test_kill_9_inside_a_save_leaves_the_previous_checkpoint(tmp_path, fault):
    save = tmp_path / "ckpt"
    proc = _train(2, tmp_path, "run", "--dp", "2", "--zero", "3", "--steps", "4",
                  "--save-every", "2", "--save", save, env={"MINIPAR_SAVE_FAULT": fault},
                  check=False)
    assert proc.returncode != 0
    assert checkpoint.latest(save).endswith("step-0000002")
    params, state, meta = checkpoint.load_full(save)
    assert meta["step"] == 2 and all(np.isfinite(a).all() for a in params.values())
    assert not (save / "step-0000004").exists()


def test_a_failed_async_write_stops_the_run_at_a_step_boundary(tmp_path):
    save = tmp_path / "ckpt"
    proc = _train(2, tmp_path, "run", "--dp", "2", "--zero", "1", "--steps", "8", "--save-every", "2",
                  "--save", save, "--save-async", env={"MINIPAR_SAVE_FAULT": "1:4:enospc"},
                  check=False)
    lines = [line for line in proc.stderr.splitlines() if line.startswith("minipar train")]
    assert proc.returncode != 0 and len(lines) == 1, proc.stderr[-2000:]
    assert "step 4: could not write the checkpoint" in lines[0] and "rank 1: No space" in lines[0]
    steps = len(step_records(tmp_path / "run.json"))
    assert 4 < steps < 8                     # training went on while it was written, then stopped
    assert checkpoint.latest(save).endswith("step-0000002")
    assert sorted(os.listdir(save)) == ["latest", "step-0000002"]   # the failed one removed
