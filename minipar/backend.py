"""The one seam between minipar and an array library.

Every other module computes with ``xp`` from here, never with ``numpy`` or ``cupy``
directly, so the same model code runs on a laptop (NumPy) and on a GPU (CuPy):

    from minipar.backend import xp
    y = xp.tanh(x) * 2

``xp`` is a thin proxy: attribute look-ups are forwarded to whichever module
``set_backend("numpy" | "cupy")`` selected (default: the ``MINIPAR_BACKEND``
environment variable, else NumPy).  The rest of this file is what a training
framework needs around that choice:

- host/device transfers: ``to_host`` (always a NumPy array), ``to_device``;
- ``sync()``: wait for the device, so timers measure work rather than launches;
- a dtype policy: names such as ``"fp32"`` or ``"bf16"`` map to dtypes
  (bfloat16 comes from ``ml_dtypes``, on NumPy and on CuPy >= 14), and half-precision
  values are widened to float32 for their statistics (``widened``);
- a byte counter of live tracked arrays with its peak, which the memory figures
  of ZeRO, recomputation and the training log are read from.
"""
from __future__ import annotations

import os
import weakref

import numpy

_BACKENDS = ("numpy", "cupy")
_module = numpy
_name = "numpy"


class _ArrayModuleProxy:
    """Forwards ``xp.anything`` to the selected array module."""

    def __getattr__(self, attr):
        return getattr(_module, attr)

    def __repr__(self):
        return f"<minipar xp -> {_name}>"


xp = _ArrayModuleProxy()


def set_backend(name: str) -> None:
    """Select the array library: ``"numpy"`` or ``"cupy"``."""
    global _module, _name
    if name not in _BACKENDS:
        raise ValueError(f"unknown backend {name!r}; choose one of {', '.join(_BACKENDS)}")
    if name == "cupy":
        try:
            import cupy
            cupy.cuda.runtime.getDeviceCount()
        except Exception as err:  # ImportError, or no driver / no device
            raise RuntimeError(
                "backend 'cupy' needs CuPy and a CUDA GPU "
                "(pip install 'minipar[gpu]'); it could not be used: " f"{err}") from err
        _module = cupy
    else:
        _module = numpy
    _name = name


def backend_name() -> str:
    return _name


def cupy_available() -> bool:
    """True when CuPy imports and sees at least one GPU."""
    try:
        import cupy
        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


def device_count() -> int:
    """The GPUs this process may use: CuPy numbers the ones ``CUDA_VISIBLE_DEVICES`` leaves
    visible 0..n-1 and counts only those.  0 on NumPy."""
    if _name != "cupy":
        return 0
    return int(_module.cuda.runtime.getDeviceCount())


def use_device(index: int) -> None:
    """Make visible GPU ``index`` this process's current device: every array, kernel and
    stream made afterwards lives there.  Call it before the first device allocation (the
    first one creates a CUDA context on whichever device is current, GPU 0 by default)."""
    if _name == "cupy":
        _module.cuda.Device(index).use()


def device_bus_id(index: int):
    """GPU ``index``'s PCI bus id (``0000:01:00.0``): which physical card it is, whatever
    its number in this process; None where CuPy cannot tell."""
    if _name != "cupy":
        return None
    try:
        return str(_module.cuda.Device(index).pci_bus_id)
    except Exception:
        return None


def is_device_array(a) -> bool:
    return type(a).__module__.startswith("cupy")


def to_host(a) -> numpy.ndarray:
    """A NumPy copy (or view) of ``a``, wherever it lives."""
    if is_device_array(a):
        return a.get()
    return numpy.asarray(a)


def to_device(a, dtype=None):
    """``a`` as an array of the selected backend."""
    if _name == "numpy":
        return numpy.asarray(a, dtype=dtype)
    if not is_device_array(a):
        a = numpy.asarray(a)
    return _module.asarray(a, dtype=dtype)


def sync() -> None:
    """Block until queued device work is done (no-op on NumPy)."""
    if _name == "cupy":
        _module.cuda.get_current_stream().synchronize()


# ---------------------------------------------------------------- dtype policy
def bfloat16():
    """The bfloat16 dtype: ``ml_dtypes``' (NumPy has none of its own).  CuPy >= 14 takes the
    same dtype where ``ml_dtypes`` is installed (and NumPy >= 2.1.2); an older CuPy refuses
    to allocate it, and so does this.  A CuPy with a ``bfloat16`` of its own gives that."""
    if _name == "cupy" and hasattr(_module, "bfloat16"):
        return numpy.dtype(_module.bfloat16)
    try:
        import ml_dtypes
    except ImportError as err:
        raise RuntimeError("bf16 needs the ml_dtypes package (pip install ml_dtypes)") from err
    dtype = numpy.dtype(ml_dtypes.bfloat16)
    if _name == "cupy" and not (_major(_module.__version__) >= 14 and
                                tuple(map(_major, numpy.__version__.split(".")[:3])) >= (2, 1, 2)):
        # asked of the versions, not by allocating: a test allocation would make a CUDA
        # context on GPU 0 of every rank before its own device is chosen
        raise RuntimeError(f"CuPy {_module.__version__} with NumPy {numpy.__version__} has no "
                           "bfloat16 (CuPy >= 14 with ml_dtypes and NumPy >= 2.1.2 has); use "
                           "--precision fp16 or fp32")
    return dtype


def _major(version):
    """The leading integer of a version string ("14.0.0rc1" -> 14; none -> 0)."""
    digits = ""
    for ch in str(version):
        if not ch.isdigit():
            break
        digits += ch
    return int(digits or 0)


_PRECISIONS = {"fp64": numpy.float64, "fp32": numpy.float32, "fp16": numpy.float16}


def dtype_of(precision: str):
    """Map a precision name (fp64, fp32, fp16, bf16) to a dtype."""
    if precision == "bf16":
        return bfloat16()
    if precision not in _PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; choose fp64, fp32, fp16 or bf16")
    return numpy.dtype(_PRECISIONS[precision])


def is_half(dtype) -> bool:
    """True for the 2-byte floats (float16, bfloat16): the dtypes whose matmuls
    accumulate in float32 and whose reductions and statistics are taken in float32."""
    dtype = numpy.dtype(dtype)
    return dtype.itemsize == 2 and (dtype.kind == "f" or dtype.name == "bfloat16")


def wide_dtype(dtype):
    """The dtype a ``dtype`` array's statistics (max, sums, variance, log-sum-exp) are
    taken in: float32 for the half-precision floats, ``dtype`` itself otherwise."""
    return numpy.dtype(numpy.float32) if is_half(dtype) else numpy.dtype(dtype)


def widened(a):
    """``a`` in its ``wide_dtype``: a half-precision array converted to float32, any
    other returned as it is (no copy).  Tested by item size, the cheapest test, since
    the fused ops call it for every block of rows."""
    return a.astype(xp.float32) if a.dtype.itemsize < 4 else a


_default_dtype = numpy.dtype(numpy.float32)


def default_dtype():
    """The dtype new parameters and float inputs get (float32 unless changed)."""
    return _default_dtype


def set_default_dtype(dtype) -> None:
    global _default_dtype
    _default_dtype = numpy.dtype(dtype)


# ---------------------------------------------------------------- memory counter
class MemoryCounter:
    """Bytes held by live tracked arrays, and the peak since the last reset.

    The autograd ``Tensor`` tracks its data, gradients and saved activations
    through ``track``; a weak reference subtracts an array's bytes when it is
    freed.  Views share their base's memory: tracking a view tracks the array
    that owns the memory, so nothing is counted twice.
    """

    def __init__(self):
        self.live = 0
        self.peak = 0
        self._seen = {}

    def track(self, a):
        if not hasattr(a, "nbytes"):
            return a
        owner = a
        while getattr(owner, "base", None) is not None and hasattr(owner.base, "nbytes"):
            owner = owner.base    # count the array that owns the memory, once
        key = id(owner)
        if key in self._seen:
            return a
        try:
            ref = weakref.ref(owner, lambda _r, k=key, n=owner.nbytes: self._release(k, n))
        except TypeError:  # scalars and other objects without weak references
            return a
        self._seen[key] = ref
        self.live += owner.nbytes
        self.peak = max(self.peak, self.live)
        return a      # the array itself (the view, if it is one), unchanged

    def _release(self, key, nbytes):
        if self._seen.pop(key, None) is not None:
            self.live -= nbytes

    def reset_peak(self):
        self.peak = self.live


memory = MemoryCounter()

set_backend(os.environ.get("MINIPAR_BACKEND", "numpy"))
