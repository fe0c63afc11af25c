"""As in CuPy, ``cupy_backends.cuda.api.runtime`` is ``cupy.cuda.runtime`` (the fake's)."""
import sys

import cupy

sys.modules[__name__] = cupy.cuda.runtime
