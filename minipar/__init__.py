"""minipar: distributed LLM training built from scratch, one idea per module."""
__version__ = "0.1.0"
