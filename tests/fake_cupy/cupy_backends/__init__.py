"""Fake cupy_backends: the cuBLAS bindings minipar calls (see ``cuda/libs/cublas.py``)."""
