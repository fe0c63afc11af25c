"""minipar's BPE against Hugging Face ``tokenizers`` on the standard library.

    python benchmarks/tokenizer.py [--vocab 4096] [--max-files N]

Trains both at the same vocabulary on the same text (every stdlib .py file, bytes that
are not UTF-8 replaced so both read the same strings), then encodes all of it and prints
training time, encoding MB/s and bytes per token.  HF is run twice: with its own
byte-level pre-split (GPT-2's regex) and with minipar's (GPT-4-style) regex, which
compares the merge learning alone.  More bytes per token is better (fewer tokens for the
same text); the last lines check the bounds: minipar's training plus encoding of
the whole stdlib within 90 s, and its bytes per token not more than 3% below HF's.
``tokenizers`` is not a dependency of minipar:
``pip install tokenizers`` to include it.  Timings on a shared machine are noisy;
HF's encoder uses all cores (Rayon threads), minipar's here one process.
"""
from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from minipar.data import stdlib_files  # noqa: E402
from minipar.tokenizer import END_OF_TEXT, count_chunks, train_tokenizer  # noqa: E402
from minipar.tokenizer.split import SPLIT_PATTERN  # noqa: E402


def minipar_run(texts, vocab):
    data = [t.encode() for t in texts]
    t0 = time.perf_counter()
    counts = count_chunks(data)
    t1 = time.perf_counter()
    tok = train_tokenizer(counts, vocab)
    t2 = time.perf_counter()
    n_tokens = sum(len(tok.encode_bytes(d)) for d in data)
    t3 = time.perf_counter()
    exact = all(tok.decode_bytes(tok.encode_bytes(d)) == d for d in data)
    return {"split_count_s": t1 - t0, "train_s": t2 - t0, "encode_s": t3 - t2,
            "tokens": n_tokens, "round_trip": exact}


def hf_run(texts, vocab, own_split):
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=own_split)
    tok.pre_tokenizer = byte_level if own_split else pre_tokenizers.Sequence(
        [pre_tokenizers.Split(Regex(SPLIT_PATTERN), behavior="isolated"), byte_level])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[END_OF_TEXT], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    t0 = time.perf_counter()
    tok.train_from_iterator(texts, trainer)
    t1 = time.perf_counter()
    encoded = tok.encode_batch(texts)
    t2 = time.perf_counter()
    exact = all(tok.decode(e.ids) == t for e, t in zip(encoded, texts))
    return {"train_s": t1 - t0, "encode_s": t2 - t1, "tokens": sum(len(e.ids) for e in encoded),
            "round_trip": exact, "vocab": tok.get_vocab_size()}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--vocab", type=int, default=4096)
    p.add_argument("--max-files", type=int, default=None)
    args = p.parse_args(argv)
    files = stdlib_files()[:args.max_files]
    texts = []
    for path in files:
        with open(path, "rb") as f:
            texts.append(f.read().decode("utf-8", errors="replace"))
    n_bytes = sum(len(t.encode()) for t in texts)
    print(f"{len(texts)} files, {n_bytes / 1e6:.1f} MB, vocabulary {args.vocab}; "
          f"{os.cpu_count()} cores (timings on a shared machine are noisy)")
    rows = [("minipar (GPT-4-style split)", minipar_run(texts, args.vocab))]
    try:
        import tokenizers
        rows.append((f"HF tokenizers {tokenizers.__version__} (GPT-2 byte-level split)",
                     hf_run(texts, args.vocab, own_split=True)))
        rows.append(("HF tokenizers (minipar's split)", hf_run(texts, args.vocab, own_split=False)))
    except ImportError:
        print("HF tokenizers not installed (pip install tokenizers): minipar alone")
    print(f"{'':44s} {'train s':>8s} {'encode s':>9s} {'MB/s':>7s} {'bytes/token':>12s} round trip")
    for name, r in rows:
        print(f"{name:44s} {r['train_s']:8.1f} {r['encode_s']:9.1f} {n_bytes / 1e6 / r['encode_s']:7.2f} "
              f"{n_bytes / r['tokens']:12.3f} {'exact' if r['round_trip'] else 'NOT exact'}")
    if len(rows) > 1:
        for name, r in rows[1:]:
            ratio = (n_bytes / rows[0][1]["tokens"]) / (n_bytes / r["tokens"])
            print(f"bytes/token, minipar / {name.split(' (')[0]} ({name.split('(')[1][:-1]}): {ratio:.4f}")
    mine = rows[0][1]
    print(f"minipar: split and count {mine['split_count_s']:.1f} s of the training time")
    total = mine["train_s"] + mine["encode_s"]
    print(f"minipar: trained to {args.vocab} and the whole corpus encoded in {total:.1f} s "
          f"({'within' if total <= 90 else 'OVER'} 90 s; load {os.getloadavg()[0]:.1f})")
    if len(rows) > 1:
        ratio = (n_bytes / mine["tokens"]) / (n_bytes / rows[1][1]["tokens"])
        verdict = "within" if ratio >= 0.97 else "OVER"
        print(f"minipar's bytes/token is {100 * (ratio - 1):+.1f}% of HF's byte-level BPE "
              f"({verdict} the 3% a worse tokenizer may lose; positive: minipar packs more bytes a token)")


if __name__ == "__main__":
    main()
