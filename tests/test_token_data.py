"""Tokenized datasets: llm.c shards, ``minipar tokenize`` and its cache, batches through
memory maps, training on tokens under every layout (fp64 parity with one process),
the tokenizer in the checkpoint, and bad shards refused in one line."""
import json
import os
import shutil

import numpy as np
import pytest

from minipar.data import load_corpus
from minipar.data.shards import HEADER_BYTES, ShardError, read_header, write_shard
from minipar.data.tokens import TokenDataset
from minipar.tokenizer import Tokenizer
from minipar.data.build import main as tokenize_main
from tests.cli import assert_same_run, train
from tests.mpirun import REPO, run_mpi

MODEL = ["--model", "tiny", "--n-layer", "2", "--d-model", "32", "--seq-len", "16"]
SOURCES = ["minipar/data/__init__.py", "minipar/data/shards.py", "minipar/tokenizer/train.py",
           "minipar/tokenizer/split.py", "minipar/optim.py"]


def make_corpus(folder):
    folder.mkdir()
    for i, name in enumerate(SOURCES):
        shutil.copy(os.path.join(REPO, name), folder / f"{i:02d}_{os.path.basename(name)}")
    return folder


def tokenize(*args):
    return tokenize_main([str(a) for a in args] + ["--quiet", "--workers", "1"])


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return make_corpus(tmp_path_factory.mktemp("text") / "corpus")


@pytest.fixture(scope="module")
def tokens(tmp_path_factory, corpus):
    """The corpus at vocabulary 300, in training shards of 4,000 tokens."""
    out = tmp_path_factory.mktemp("tok") / "ds"
    assert tokenize("--data", corpus, "--vocab", 300, "--out", out, "--shard-tokens", 4000) == 0
    return out


def manifest_of(directory):
    with open(directory / "manifest.json") as f:
        return json.load(f)


def test_shard_format_and_its_refusals(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.array([1, 2, 65535]))
    assert read_header(path) == 3 and os.path.getsize(path) == HEADER_BYTES + 6
    header = np.fromfile(path, dtype="<i4", count=3)
    assert header.tolist() == [20240520, 1, 3]                 # llm.c's magic, version, count
    raw = path.read_bytes()
    for data, message in [(raw[:HEADER_BYTES + 4], "truncated"), (raw + b"xx", "longer"),
                          (b"\0" * 4 + raw[4:], "magic 0"), (raw[:500], "shorter than"),
                          (raw[:4] + np.int32(2).tobytes() + raw[8:], "version 2")]:
        path.write_bytes(data)
        with pytest.raises(ShardError, match=message):
            read_header(path)


def test_tokenize_writes_shards_a_manifest_and_reuses_them(tokens, corpus, capsys):
    m = manifest_of(tokens)
    assert m["vocab_size"] == 300 and len(m["train"]) >= 2 and m["val"]
    assert all(read_header(tokens / s["file"]) == s["tokens"] for s in m["train"] + m["val"])
    stamp = os.path.getmtime(tokens / m["train"][0]["file"])
    assert tokenize_main(["--data", str(corpus), "--vocab", "300", "--out", str(tokens),
                          "--shard-tokens", "4000", "--workers", "1"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert os.path.getmtime(tokens / m["train"][0]["file"]) == stamp   # nothing rewritten


def test_workers_write_the_same_shards_and_a_rerun_leaves_no_stale_one(tokens, corpus, tmp_path):
    out = tmp_path / "two"
    assert tokenize_main(["--data", str(corpus), "--vocab", "300", "--out", str(out), "--shard-tokens",
                          "4000", "--workers", "2", "--quiet"]) == 0
    m = manifest_of(tokens)
    for s in m["train"] + m["val"]:
        assert (out / s["file"]).read_bytes() == (tokens / s["file"]).read_bytes()
    assert tokenize("--data", corpus, "--vocab", 300, "--out", out, "--shard-tokens", 10 ** 6) == 0
    assert sorted(p.name for p in out.glob("*.bin")) == ["train_000000.bin", "val_000000.bin"]


def test_validation_text_is_the_byte_corpus_tail(tokens, corpus):
    """The validation shard decodes to the last 5% of the byte corpus, documents joined
    by a blank line where the shard has <|endoftext|>: the same text for every tokenizer."""
    m = manifest_of(tokens)
    tok = Tokenizer.load(tokens / "tokenizer.json")
    ds = TokenDataset(str(tokens), seq_len=16)
    ids = ds.val.windows([0], len(ds.val))[0]
    pieces = [tok.decode_bytes(p[p != tok.eot]) for p in np.split(ids, np.flatnonzero(ids == tok.eot))]
    corpus_bytes = load_corpus(str(corpus)).tobytes()
    tail = corpus_bytes[len(corpus_bytes) - int(len(corpus_bytes) * 0.05):]
    pieces = [p for p in pieces if p]
    assert b"\n\n".join(pieces).lstrip(b"\n") == tail.lstrip(b"\n")   # (a cut in a blank line)
    assert m["val_bytes"] == sum(map(len, pieces))
    assert ds.bytes_per_token == m["val_bytes"] / m["val_tokens"] > 1.2


def test_batches_are_pure_and_read_across_shards(tokens):
    ds = TokenDataset(str(tokens), seq_len=16)
    every = np.concatenate([np.fromfile(tokens / s["file"], dtype="<u2", offset=HEADER_BYTES)
                            for s in manifest_of(tokens)["train"]]).astype(np.int64)
    x1, y1 = ds.batch(seed=3, step=7, batch_size=5)
    x2, _ = ds.batch(seed=3, step=7, batch_size=5)
    assert np.array_equal(x1, x2) and np.array_equal(x1[:, 1:], y1[:, :-1])
    bound = ds.train.starts[1]                        # a window across the first boundary
    np.testing.assert_array_equal(ds.train.windows([bound - 3], 10)[0], every[bound - 3:bound + 7])
    rng = np.random.default_rng([3, 7, 0])
    starts = rng.integers(0, len(every) - 17, size=5)
    np.testing.assert_array_equal(x1, every[starts[:, None] + np.arange(16)])


@pytest.fixture(scope="module")
def single(tmp_path_factory, tokens):
    return train(tmp_path_factory.mktemp("single"), "single", 1, "--data", tokens, model=MODEL,
                 batch=8, steps=4)


@pytest.mark.parametrize("n,flags", [(2, ["--dp", "2"]), (2, ["--tp", "2"]),
                                     (2, ["--pp", "2", "--microbatches", "2"]), (2, ["--cp", "2"])],
                         ids=lambda v: " ".join(v) if isinstance(v, list) else str(v))
def test_tokenized_run_equals_one_process(tmp_path, tokens, single, n, flags):
    run = train(tmp_path, "run", n, "--data", tokens, *flags, model=MODEL, batch=8, steps=4)
    assert_same_run(run, single, rtol=1e-9)        # fp64 losses within 1e-9, as every layout
    assert len(run[1]["wte.weight"]) == 300                      # the tokenizer's vocabulary


def test_resume_under_another_layout_and_sample(tmp_path, tokens, single):
    train(tmp_path, "first", 2, "--data", tokens, "--dp", "2", "--stop-at", "2", model=MODEL,
          batch=8, steps=4)
    second = train(tmp_path, "second", 2, "--data", tokens, "--tp", "2", "--resume",
                   tmp_path / "first", model=MODEL, batch=8, steps=4)
    assert_same_run((single[0][2:],) + single[1:], second, rtol=1e-9)
    proc = run_mpi(1, ["-m", "minipar", "sample", "--resume", tmp_path / "second", "--prompt",
                       "def ", "--tokens", "20"], timeout=60)
    assert proc.stdout.startswith("def ")


def _copy(tokens, tmp_path, name):
    out = tmp_path / name
    shutil.copytree(tokens, out)
    return out, manifest_of(out)


def test_bad_token_data_is_one_line_before_any_message(tmp_path, tokens, corpus):
    train(tmp_path, "bytes", 1, "--data", "stdlib-bytes", model=MODEL, batch=8, steps=1)
    cases = []
    bad, m = _copy(tokens, tmp_path, "magic")
    path = bad / m["train"][0]["file"]
    path.write_bytes(b"\1\2\3\4" + path.read_bytes()[4:])
    cases.append((["--data", bad], "not an llm.c token shard"))
    bad, m = _copy(tokens, tmp_path, "short")
    path = bad / m["val"][0]["file"]
    path.write_bytes(path.read_bytes()[:-10])
    cases.append((["--data", bad], "is truncated"))
    bad, m = _copy(tokens, tmp_path, "big")
    write_shard(bad / m["train"][1]["file"], np.full(m["train"][1]["tokens"], 300))
    cases.append((["--data", bad], "token 300, outside the vocabulary of 300"))
    bad, m = _copy(tokens, tmp_path, "empty")
    for s in m["train"]:
        write_shard(bad / s["file"], np.zeros(0))
        s["tokens"] = 0
    (bad / "manifest.json").write_text(json.dumps(m))
    cases.append((["--data", bad], "holds 0 training tokens"))
    cases.append((["--data", tokens, "--resume", tmp_path / "bytes"],
                  "trained on bytes, this run's data is cut by a BPE tokenizer of 300 tokens"))
    other = tmp_path / "other"
    assert tokenize("--data", corpus, "--vocab", 300, "--out", other, "--val-fraction", "0.2") == 0
    train(tmp_path, "tok", 1, "--data", other, model=MODEL, batch=8, steps=1)
    cases.append((["--data", tokens, "--resume", tmp_path / "tok"], "another one of that size"))
    for flags, message in cases:
        proc = run_mpi(2, ["-m", "minipar", "train", *MODEL, "--steps", "2", "--quiet", *flags],
                       timeout=60, check=False)
        lines = proc.stderr.strip().splitlines()
        assert proc.returncode != 0 and len(lines) == 1, (flags, proc.stderr[-2000:])
        assert lines[0].startswith("minipar train: ") and message in lines[0], lines[0]


def test_bad_tokenize_input_is_one_line(tmp_path, corpus, capsys):
    (tmp_path / "empty").mkdir()
    (tmp_path / "bad.json").write_text("{}")
    for args, message in [(["--data", tmp_path / "empty"], "too little"),
                          (["--data", tmp_path / "missing"], "no such file or folder"),
                          (["--vocab", "100"], "--vocab must be in [257, 65535]"),
                          (["--tokenizer", tmp_path / "bad.json"], "not a minipar-bpe-1 tokenizer")]:
        if "--data" not in args:
            args = args + ["--data", corpus]
        code = tokenize(*args, "--out", tmp_path / "out")
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and message in err[0], err


def test_auto_layout_plans_with_the_data_vocabulary(tokens, monkeypatch):
    """--layout auto ranks layouts for the model the data needs: its head has V = 300."""
    import minipar.perf.plan
    from minipar.cli import build_parser
    from minipar.cli.run_config import config_from_flags
    planned = []
    real = minipar.perf.plan.auto_layout
    monkeypatch.setattr(minipar.perf.plan, "auto_layout",
                        lambda config, size: planned.append(config) or real(config, size))
    args = build_parser().parse_args(["train", *MODEL, "--layout", "auto", "--data", str(tokens)])
    chosen = config_from_flags(args, rank_and_size=(1, 2))
    assert planned[0].model_config().vocab_size == 300 == chosen.model_config().vocab_size
