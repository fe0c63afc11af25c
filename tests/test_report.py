"""``minipar report`` (minipar/observe/report.py): every figure the page references exists, and
the summary table's numbers are the logs' own - for new logs (header, per_rank, final)
and for older ones without them."""
import html.parser
import io
import json
import os
import sys

import pytest

from minipar.observe import monitor, report, report_runs
from minipar.cli_checks import CommandError


def monitored_log(path, layout, fp16=False, val_loss=1.9):
    """A log written by RunMonitor itself (one process standing in for ``ranks``)."""
    mon = monitor.RunMonitor(None, header=dict(layout=layout, params=1e5, tokens_per_step=256,
                                               batch_size=4, backend="numpy",
                                               precision="fp16" if fp16 else "fp32"),
                             flops_per_step=1e8, peak_tflops=0.1, log_path=str(path),
                             progress=False, total_steps=5, out=io.StringIO())
    mon.start()
    for s in range(5):
        shared = dict(loss=3.0 - 0.2 * s, lr=1e-3, grad_norm=1.0, model_state_bytes=64)
        if fp16:
            shared.update(loss_scale=2.0 ** 16 / (2 if s >= 3 else 1), skipped=int(s == 3))
        mon.step(s, shared=shared, mine=dict(step_time_s=0.05 + 0.01 * s, comm_time_s=0.01,
                                             pipeline_wait_s=None, optimizer_s=0.005,
                                             peak_mem_bytes=2 ** 20 * (s + 1)))
    mon.finish(val_loss=val_loss)
    return str(path)


def old_log(path):
    """The step records the training loop wrote before the monitor: no header, no final."""
    with open(path, "w") as f:
        for s in range(4):
            f.write(json.dumps({"step": s, "loss": 4.0 - s * 0.5, "lr": 1e-3, "grad_norm": 1.0,
                                "tokens_per_s": 1000.0 + s, "step_time_s": 0.5, "comm_time_s": 0.1,
                                "comm_share": 0.2, "peak_mem_bytes": 5000 + s,
                                "peak_mem_bytes_per_rank": [5000 + s, 4000],
                                "model_state_bytes": 10}) + "\n")
    return str(path)


class Page(html.parser.HTMLParser):
    """The img sources and the summary table's cells (label, [data-value...], [text...])."""

    def __init__(self):
        super().__init__()
        self.images, self.rows, self._cell = [], [], None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "img":
            self.images.append(attrs["src"])
        elif tag == "tr" and "data-log" in attrs:
            self.rows.append({"log": attrs["data-log"], "values": [], "texts": []})
        elif tag == "td" and self.rows:
            self.rows[-1]["values"].append(attrs.get("data-value"))
            self._cell = ""

    def handle_data(self, data):
        if self._cell is not None:
            self._cell += data

    def handle_endtag(self, tag):
        if tag == "td" and self._cell is not None:
            self.rows[-1]["texts"].append(self._cell)
            self._cell = None


def render(tmp_path, logs, *extra):
    out = tmp_path / "out"
    assert report.main([*logs, "--out", str(out), *extra]) == 0
    page = Page()
    page.feed((out / "index.html").read_text())
    return out, page


def table(page):
    keys = [k for k, _, _ in report.COLUMNS]
    return {row["log"]: dict(zip(keys, row["values"])) for row in page.rows}


def test_every_figure_exists_and_the_table_is_the_logs(tmp_path):
    logs = [monitored_log(tmp_path / "a.json", "dp2"),
            monitored_log(tmp_path / "b.json", "tp2", fp16=True, val_loss=None),
            old_log(tmp_path / "old.json")]
    out, page = render(tmp_path, logs)
    assert {"loss.png", "throughput.png", "memory.png", "loss_scale.png",
            "time_split_1.png", "time_split_2.png", "time_split_3.png"} <= set(page.images)
    for src in page.images:
        assert (out / src).is_file() and (out / src).stat().st_size > 1000, src
    rows = table(page)
    for log in logs[:2]:
        final = [json.loads(line) for line in open(log)][-1]["final"]
        for key in ("steps", "train_loss", "train_loss_last10", "val_loss", "val_bits_per_byte",
                    "tokens_per_s", "mfu", "comm_share", "wall_s", "skipped_steps"):
            shown = rows[log][key]
            assert (shown == "" if final[key] is None else shown == repr(final[key])), key
        assert rows[log]["peak_mem_bytes"] == repr(max(final["peak_mem_bytes_per_rank"]))
    assert rows[logs[1]]["skipped_steps"] == "1"
    old = rows[logs[2]]                                  # computed from the step records
    assert old["steps"] == "4" and old["train_loss"] == repr(2.5)
    assert old["train_loss_last10"] == repr((4.0 + 3.5 + 3.0 + 2.5) / 4)
    assert float(old["tokens_per_s"]) == pytest.approx(1001.5)
    assert old["peak_mem_bytes"] == "5003" and old["val_loss"] == "" and old["mfu"] == ""


def test_displayed_text_is_the_value_formatted(tmp_path):
    log = monitored_log(tmp_path / "a.json", "dp2", val_loss=1.7)
    _, page = render(tmp_path, [log])
    (row,) = page.rows
    cells = dict(zip([k for k, _, _ in report.COLUMNS], row["texts"]))
    assert cells["val_loss"] == "1.7000" and cells["val_bits_per_byte"] == "2.453"
    assert cells["peak_mem_bytes"] == "5.0 MiB"


def test_labels_from_header_flag_or_file(tmp_path):
    a = monitored_log(tmp_path / "a.json", "dp2")
    b = monitored_log(tmp_path / "b.json", "dp2")
    old = old_log(tmp_path / "old.json")
    assert [report_runs.LoggedRun(p).label for p in (a, old)] == ["dp2", "old"]
    out, _ = render(tmp_path, [a, b])                    # same layout: told apart by file
    text = (out / "index.html").read_text()
    assert "dp2 (a)" in text and "dp2 (b)" in text
    half = monitored_log(tmp_path / "h.json", "dp2", fp16=True)
    out, _ = render(tmp_path, [a, half])                 # ... or by precision
    text = (out / "index.html").read_text()
    assert "<th>dp2 fp32</th>" in text and "<th>dp2 fp16</th>" in text
    out, _ = render(tmp_path, [a, b], "--label", "first", "--label", "second")
    assert "<th>first</th>" in (out / "index.html").read_text()
    with pytest.raises(CommandError, match="1 --label for 2 logs"):   # the CLI: one line, exit 2
        report.main([a, b, "--out", str(tmp_path / "x"), "--label", "one"])


def test_without_matplotlib_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import fails
    with pytest.raises(SystemExit) as err:
        report.main([old_log(tmp_path / "old.json"), "--out", str(tmp_path / "o")])
    assert "pip install matplotlib" in str(err.value)
    assert not os.path.exists(tmp_path / "o")
