"""Parallelism strategies: data, ZeRO, tensor and pipeline, each in its own module."""
