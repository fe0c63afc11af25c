"""A padded vocabulary under the layouts the test suite leaves out, against the unpadded
single process in fp64 (``tests/test_vocab_padding.py`` runs one rank and tp=2 + sp):

    PYTHONPATH=. python tests/scripts/pad_vocab_layouts.py [WORKDIR]

pp=2 (the head on the last stage), ZeRO-3 on dp=2 (the head gathered in its unit, 320 rows:
not a multiple of the bucket's), tp=2 with tied weights (the padding rows of wte are the
head's columns).  Prints the largest relative loss difference of each over 3 steps.
"""
import pathlib
import sys
import tempfile

import numpy as np

from tests.cli import train


def main():
    work = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp())
    plain = {False: train(work, "plain", 1, steps=3)[0],
             True: train(work, "plain_tied", 1, "--tie-weights", steps=3)[0]}
    for name, ranks, tied, flags in (
            ("pp2 pad 384", 2, False, ["--pad-vocab-to", "384", "--pp", "2", "--microbatches", "2"]),
            ("zero3 dp2 pad 320", 2, False, ["--pad-vocab-to", "320", "--zero", "3"]),
            ("tp2 tied pad 384", 2, True, ["--pad-vocab-to", "384", "--tp", "2", "--tie-weights"])):
        losses = np.array(train(work, name.replace(" ", "_"), ranks, *flags, steps=3)[0])
        ref = np.array(plain[tied])
        print(f"{name:20s} max relative loss difference vs unpadded: "
              f"{np.max(np.abs(losses - ref) / np.abs(ref)):.1e}")


if __name__ == "__main__":
    main()
