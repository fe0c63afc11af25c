"""Token healing in ``sample``: a BPE prompt's last token is dropped and the first sampled
token must start with its bytes, so "def " is not read as "a lone space before a number"."""
import numpy as np

from minipar.sample import generate, healed_prompt
from minipar.tokenizer import count_chunks, train_tokenizer

TEXT = b"".join(b"def f%d(x):\n    return x + %d\n\n" % (i, i) for i in range(200))


class FavouriteToken:
    """A stand-in model whose logits always prefer one token by far."""

    def __init__(self, vocab, favourite):
        self.config = type("Config", (), {"seq_len": 8})()
        self.vocab, self.favourite = vocab, favourite

    def __call__(self, context):
        logits = np.zeros((1, context.shape[1], self.vocab))
        logits[0, -1, self.favourite] = 50.0
        return type("Out", (), {"data": logits})()


def test_the_last_token_is_healed():
    tok = train_tokenizer(count_chunks([TEXT]), 300)
    ids, first_of = healed_prompt(tok, "def ")
    assert tok.decode(ids) == "def"                        # the lone space dropped ...
    starts = {tok.token_bytes[t][:1] for t in first_of}
    assert starts == {b" "} and tok.encode(" f")[0] in first_of   # ... any " ..." token may follow
    assert tok.eot not in first_of and 48 not in first_of        # no special token, no "0"


def test_the_first_sample_obeys_the_healing_then_the_model():
    tok = train_tokenizer(count_chunks([TEXT]), 300)
    ids, first_of = healed_prompt(tok, "def ")
    digit = int(tok.encode("0")[0])
    out = generate(FavouriteToken(tok.vocab_size, digit), ids, 3, first_of=first_of)
    assert out[len(ids)] in first_of and out[len(ids) + 1:] == [digit, digit]
    assert tok.decode(out).startswith("def ")
    unhealed = generate(FavouriteToken(tok.vocab_size, digit), tok.encode("def "), 1)
    assert unhealed[-1] == digit                            # without healing: "def 0"
