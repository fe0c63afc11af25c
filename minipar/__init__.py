"""minipar: distributed LLM training built from scratch, one idea per module."""
__version__ = "0.1.0"

# Before anything imports NumPy: give this rank its share of the node's cores for
# BLAS, so N ranks on N cores do not start N*N threads (see minipar/threads.py).
from minipar.threads import budget_threads as _budget_threads

_budget_threads()

# Freed activation buffers stay mapped for the next step instead of going back to the
# kernel and coming back as page faults (see minipar/allocator.py).
from minipar.allocator import keep_freed_blocks as _keep_freed_blocks

_keep_freed_blocks()
