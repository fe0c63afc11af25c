"""A background save on a GPU (``checkpoint/device_snapshot.py``), on the fake CuPy: the
state is copied into pinned host buffers on a side stream — queued, not waited for by
the training thread — the buffers are kept from one save to the next, and the files are
byte for byte those of synchronous saves.  The fake runs a side stream's copies only
when something waits for them, and then reads the source as it is at that moment: had
the optimizer step not waited for the copy, the async save would hold the next step's
weights and differ."""
import json
import os
import subprocess
import sys

import numpy as np

from minipar import checkpoint
from tests.mpirun import REPO

FAKE = os.path.join(REPO, "tests", "fake_cupy")
RUN = ["--backend", "cupy", "--model", "tiny", "--n-layer", "1", "--d-model", "16", "--n-head", "2",
       "--seq-len", "16", "--batch-size", "2", "--data", "stdlib-bytes", "--steps", "3",
       "--save-every", "1", "--eval-batches", "0", "--quiet"]
ENV = dict(os.environ, PYTHONPATH=os.pathsep.join([FAKE, REPO]), MINIPAR_CUDA_KERNELS="0",
           MINIPAR_FAKE_CUPY_DEVICES="1")

# one process, the trainer's own run: two background saves, what the fake's streams did
SAVES = r"""
import json, sys
from cupy import _counts
from minipar import backend
from minipar.train import TrainConfig, setup
backend.set_backend("cupy")
run = setup(TrainConfig(backend="cupy", model="tiny", n_layer=1, d_model=16, n_head=2, seq_len=16,
                        batch_size=2, data="stdlib-bytes", steps=2, save=sys.argv[1], save_async=True,
                        eval_batches=0, quiet=True))
import threading
import cupy._streams as streams
ran_here = []                 # copies the training thread itself carried out (waited for)
run_copies = streams.Stream._run
def _run(stream, position):
    if threading.current_thread() is threading.main_thread():
        ran_here.append(max(position - stream.ran, 0))
    run_copies(stream, position)
streams.Stream._run = _run
out = []
for step in (1, 2):
    before = (len(_counts.stream_log), _counts.pinned_allocs)
    ran_here.clear()
    run.saver.save(step)
    waited_in_save = sum(ran_here)
    queued = [e for e in _counts.stream_log[before[0]:] if e[0] == "queue" and e[2] == "d2h"]
    run.saver.before_update()
    run.saver.wait()
    out.append({"queued_d2h": len(queued), "side": sorted({str(e[1]) for e in queued}),
                "waited_in_save": waited_in_save, "new_pinned": _counts.pinned_allocs - before[1]})
print(json.dumps(out))
"""


def _train(folder, *extra):
    out = subprocess.run([sys.executable, "-m", "minipar", "train", *RUN, "--save", str(folder), *extra],
                         cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]


def _saved(folder):
    """{(step, kind, name): values} of every checkpoint under ``folder``."""
    out = {}
    for step in sorted(os.listdir(folder)):
        if step.startswith("step-"):
            ckpt = checkpoint.open_checkpoint(os.path.join(folder, step))
            for kind in ("param", "adam_m", "adam_v"):
                out.update({(step, kind, name): ckpt.tensor(name, kind) for name in ckpt.names(kind)})
    return out


def test_a_background_save_copies_on_a_side_stream_into_kept_pinned_buffers(tmp_path):
    out = subprocess.run([sys.executable, "-c", SAVES, str(tmp_path / "ck")], cwd=REPO, env=ENV,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    first, second = json.loads(out.stdout.splitlines()[-1])
    assert first["queued_d2h"] > 0 and first["side"] and "null" not in first["side"][0].lower(), first
    assert first["waited_in_save"] == 0, "the training thread waited for the copies inside save()"
    assert first["new_pinned"] == first["queued_d2h"], first       # one pinned buffer per array copied
    assert second["queued_d2h"] == first["queued_d2h"] and second["new_pinned"] == 0, second  # kept


def test_background_saves_on_a_gpu_write_what_synchronous_ones_write(tmp_path):
    _train(tmp_path / "sync")
    _train(tmp_path / "async", "--save-async")
    sync, background = _saved(tmp_path / "sync"), _saved(tmp_path / "async")
    assert sync and sync.keys() == background.keys()
    differ = [key for key in sync if not np.array_equal(sync[key], background[key])]
    assert not differ, f"background saves differ from synchronous ones in {differ[:5]}"
