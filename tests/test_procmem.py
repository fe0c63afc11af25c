"""What the process holds (minipar/observe/procmem.py): peak RSS per phase, in the run's log."""
import json

import numpy as np

from minipar.observe import procmem
from tests.mpirun import run_mpi

MiB = 2 ** 20


def test_a_phase_sees_its_own_peak_and_the_next_starts_afresh():
    memory = procmem.ProcessMemory()
    with memory.phase("steps"):
        big = np.ones(64 * MiB // 8)          # 64 MiB, touched
        del big
    with memory.phase("save"):
        pass
    steps, save = memory.of("steps"), memory.of("save")
    assert steps >= memory.floor + 60 * MiB, (steps, memory.floor)
    if memory.exact:                          # Linux: the peak was reset between phases
        assert save < steps - 40 * MiB, (save, steps)
    assert memory.of("construction") is None
    vector = memory.vector()
    assert len(vector) == 3 * len(procmem.PHASES) and vector[3] == steps


def test_summary_of_two_ranks():
    nan = float("nan")
    rows = [[100.0, nan, nan, 300.0, nan, nan, nan, nan, nan],
            [110.0, nan, nan, 290.0, nan, nan, nan, nan, nan]]
    s = procmem.summarize(rows, exact=True, floor=[50, 60], predicted=[200, 210])
    assert s["phases"] == {"construction": {"rss": [100, 110]}, "steps": {"rss": [300, 290]}}
    assert s["peak_rss_bytes_per_rank"] == [300, 290]
    assert s["predicted_bytes_per_rank"] == [200, 210] and s["floor_bytes_per_rank"] == [50, 60]
    text = "\n".join(procmem.summary_lines(s, str))
    assert "300, 290" in text and "1.50, 1.38" in text


def test_a_run_reports_construction_steps_and_save_per_rank(tmp_path):
    log = tmp_path / "run.json"
    out = run_mpi(2, ["-m", "minipar", "train", "--model", "tiny", "--steps", "2", "--batch-size",
                      "4", "--quiet", "--eval-batches", "0", "--zero", "3", "--log-json", log,
                      "--save", tmp_path / "ckpt"], timeout=180).stdout
    records = [json.loads(line) for line in open(log)]
    steps, final = records[1:-1], records[-1]["final"]
    for r in steps:
        assert len(r["peak_rss_bytes_per_rank"]) == 2 and r["peak_rss_bytes"] > 50 * MiB
    process = final["process_memory"]
    assert set(process["phases"]) == {"construction", "steps", "save"}
    for figures in process["phases"].values():
        assert len(figures["rss"]) == 2 and min(figures["rss"]) > 0
    peaks = process["peak_rss_bytes_per_rank"]
    assert peaks == [max(p["rss"][r] for p in process["phases"].values()) for r in range(2)]
    assert all(f < p for f, p in zip(process["floor_bytes_per_rank"], process["predicted_bytes_per_rank"]))
    assert "process peak (RSS) per rank" in out and "memory model" in out
