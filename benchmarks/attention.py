"""Flash attention vs naive attention (and PyTorch's flash SDPA when present).

    python benchmarks/attention.py [--sizes 1024,2048,4096,8192] [--head-dims 64,128] [--causal both]

Same as ``python -m minipar bench attention``; the logic is in ``minipar/kernels/bench.py``.
Without a CuPy GPU it prints a small NumPy comparison of the tiled reference and dense attention.
"""
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from minipar.kernels.bench import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])
