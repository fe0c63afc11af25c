"""minipar: distributed LLM training built from scratch, one idea per module.

Importing it changes nothing about the process; ``minipar.setup_process()`` sets the
thread budget and the allocator for a rank (``process/``), and every command calls it.
"""
__version__ = "0.1.0"

from minipar.process import setup_process  # noqa: E402,F401  (minipar.setup_process())
