"""A fake ``cupy``: a TEST DOUBLE for dry runs of minipar's GPU-only Python paths on a CPU.

Only a dry run puts ``tests/fake_cupy`` on PYTHONPATH.  ``cupy.ndarray`` wraps a NumPy array;
``RawModule`` kernels run through minipar's CPU emulator (``minipar/kernels/emulator/``).
As in CuPy: array code returns ``cupy.ndarray`` (reductions and ``a[i]`` give 0-d arrays, not
NumPy scalars), NumPy scalars and Python numbers mix in, NumPy functions on cupy arrays dispatch
back to cupy; and refused as CuPy refuses: NumPy arrays in array operations or kernel arguments
("Unsupported type"), ``numpy.asarray(a)`` (use ``a.get()``), a basic slice set from a
non-scalar NumPy array, ``a.set`` of another shape/dtype, ``add.at`` on dtypes without atomics.
Launches are checked by the emulator as the driver would (threads vs ``__launch_bounds__`` and
1024, grid limits, dynamic shared memory over 48 KiB without ``max_dynamic_shared_size_bytes``),
and for what a GPU would misread silently (argument count and kinds; a Python int or float,
which CuPy sends as 64 bits); this file adds pointer dtypes (``LaunchCheckError``).
Counted for the cost of a GPU step (``cupy._counts``, see ``_counters.py``): device->host reads
and synchronisations, launches, GEMMs, silent upcasts of half arrays.  cuBLAS's ``gemmEx`` and
``gemmStridedBatchedEx`` are modelled on raw pointers (``cupy_backends/cuda/libs/cublas.py``);
CuPy 14.2's batched ``matmul`` of bfloat16 operands fails here as it does there.

Devices: ``MINIPAR_FAKE_CUPY_DEVICES=N`` (default 1) pretends to have N GPUs, of which
``CUDA_VISIBLE_DEVICES`` leaves some visible, numbered 0..n-1 as CUDA numbers them
(``runtime.getDeviceCount``, ``Device(i).use()``, ``Device(i).pci_bus_id``: a fake bus id of
the physical card).  Every array records the device that was current when it was made
(``a.device``, ``a.data.device_id``), and ``cupy._made_on`` counts the arrays made per device.

NCCL (``cupy.cuda.nccl``, ``_nccl.py``): send/recv, groups and allReduce, carried by MPI.
Streams (``_streams.py``): kernels run at once (the null stream); copies queued on a side stream
run when waited for, so a missing wait on one reads stale bytes; ``cupy._counts.stream_log``
records them in order, and pinned allocations are counted.

Not modelled: device memory (``a.data.ptr`` is a host address; MPI reads "device" arrays only when
``MINIPAR_CUDA_AWARE=1`` or ``MINIPAR_TRANSPORT=cuda-aware`` stands in for CUDA-aware MPI), the
null stream's asynchrony (``synchronize`` of it is only counted: a missing one goes unseen),
timings (meaningless), NVRTC (g++ compiles instead),
memory-pool numbers (live bytes of fake arrays and their peak since ``free_all_blocks``),
``OutOfMemoryError`` (never raised), CuPy's type promotion and out-of-bounds indexing (wraps)
where they differ from NumPy's, NumPy functions CuPy lacks (all of NumPy is forwarded, and
lists are taken where CuPy wants arrays), CuPy's random streams (NumPy's Philox: values differ
from NumPy's default, as on a GPU), DLPack, torch interop.
"""
import collections
import os
import sys
import types
import weakref

import numpy

from cupy import _counters, _streams
from cupy._counters import counts as _counts  # fake-only: syncs, launches, GEMMs, upcasts

__version__ = "14.0.0+fake"   # what it imitates: CuPy 14 takes ml_dtypes' bfloat16
_HOST = numpy.ndarray
_live = weakref.WeakValueDictionary()  # id(NumPy array) -> the cupy.ndarray wrapping it


def _unwrap(x, host_ok=False):
    if isinstance(x, ndarray):
        return x._a
    if isinstance(x, _HOST) and not host_ok:
        raise TypeError(f"Unsupported type {type(x)}")  # CuPy's words
    if type(x) in (list, tuple):
        return type(x)(_unwrap(i, host_ok) for i in x)
    return {k: _unwrap(v, host_ok) for k, v in x.items()} if type(x) is dict else x


def _wrap(x):
    if isinstance(x, (numpy.generic, _HOST)):
        return ndarray._of(numpy.asarray(x))  # CuPy returns 0-d arrays, not NumPy scalars
    return type(x)(_wrap(i) for i in x) if type(x) in (list, tuple) else x


def _arrays(args):
    """The device arrays among ``args`` (lists and tuples opened), for the counters."""
    out = []
    for a in args:
        out += [a] if isinstance(a, ndarray) else _arrays(a) if type(a) in (list, tuple) else []
    return out


def _function(f, host_ok=False, owner=None):
    name = getattr(f, "__name__", "function")

    def call(*args, **kwargs):
        arrays = ([owner] if owner is not None else []) + _arrays(args)
        _counters.check_gemm(name, arrays)
        if name in _counters.SYNC_READS:
            _counts.read()
        result = _wrap(f(*_unwrap(args, host_ok), **_unwrap(kwargs, host_ok)))
        _counts.op(name, arrays, result, explicit=name == "astype" or kwargs.get("dtype") is not None,
                   writes=kwargs.get("out") is not None)
        return result
    call.__name__ = call.__qualname__ = name
    return call


class ndarray:
    """An array "on the device": a NumPy array underneath, never handed out implicitly."""
    __slots__ = ("_a", "_base", "_device", "__weakref__")
    __hash__ = None

    @classmethod
    def _of(cls, a):
        w = _live.get(id(a))
        if w is not None and w._a is a:
            return w  # same NumPy array, same cupy array (out=, in-place ops, no-op asarray)
        w, owner = object.__new__(cls), a.base
        while isinstance(owner, _HOST) and isinstance(owner.base, _HOST):
            owner = owner.base
        w._a, w._base = a, cls._of(owner) if isinstance(owner, _HOST) else None  # a view: its owner
        w._device = _current_device if w._base is None else w._base._device
        if w._base is None:
            _pool._alloc(w, a.nbytes)
            _made_on[_current_device] += 1
        _live[id(a)] = w
        return w

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_a", "_base", "_device", "ctypes", "itemset", "tostring", "resize"):
            raise AttributeError(f"'cupy.ndarray' object has no attribute {name!r}")
        attr = getattr(self._a, name)
        if not callable(attr):
            return _wrap(attr)
        return _function(attr, host_ok=name in ("take", "put"), owner=self)

    base = property(lambda self: self._base)
    data = property(lambda self: types.SimpleNamespace(ptr=self._a.ctypes.data, device_id=self._device))
    device = property(lambda self: cuda.Device(self._device))
    shape = property(lambda self: self._a.shape, lambda self, v: setattr(self._a, "shape", v))
    # CuPy's flags hold these three and nothing else (no ``writeable``: device arrays always are)
    flags = property(lambda self: types.SimpleNamespace(
        c_contiguous=self._a.flags.c_contiguous, f_contiguous=self._a.flags.f_contiguous,
        owndata=self._base is None))

    @property
    def __cuda_array_interface__(self):
        if os.environ.get("MINIPAR_CUDA_AWARE", "0").lower() in ("0", "", "false", "no", "off") \
                and os.environ.get("MINIPAR_TRANSPORT") != "cuda-aware":
            raise AttributeError("fake cupy: only MINIPAR_CUDA_AWARE=1 or MINIPAR_TRANSPORT="
                                 "cuda-aware (as CUDA-aware MPI) reads it")
        a = self._a
        return {"shape": a.shape, "typestr": a.dtype.str, "data": (a.ctypes.data, False),
                "strides": None if a.flags.c_contiguous else a.strides, "version": 3}

    def get(self, stream=None, order="C", out=None, blocking=True):
        if _streams.copy_to_host(self._a, out, stream, blocking):
            return out
        _counts.read()
        host = numpy.array(self._a, order=order, copy=True)
        if out is not None:
            out[...] = host
        return host if out is None else out

    def set(self, arr, stream=None):
        if not isinstance(arr, _HOST):
            raise TypeError("Only numpy.ndarray can be set to cupy.ndarray")
        if arr.dtype != self.dtype:
            raise TypeError(f"{arr.dtype} array cannot be set to {self.dtype} array")
        if arr.shape != self.shape:
            raise ValueError(f"Shape mismatch. Old shape: {self.shape}, new shape: {arr.shape}")
        if not (self._a.flags.c_contiguous or self._a.flags.f_contiguous):
            raise RuntimeError("Cannot set to non-contiguous array")
        _counts.h2d += 1
        if not _streams.copy_to_device(self._a, arr, stream):
            self._a[...] = arr

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed. "
                        "Please use `.get()` to construct a NumPy array explicitly.")

    def __array_ufunc__(self, ufunc, method, *inputs, **kwargs):
        f = _Ufunc(ufunc)
        return f(*inputs, **kwargs) if method == "__call__" else getattr(f, method)(*inputs, **kwargs)

    def __array_function__(self, func, types_, args, kwargs):
        if getattr(numpy, func.__name__, None) is not func:
            return NotImplemented
        return getattr(sys.modules[__name__], func.__name__)(*args, **kwargs)

    def __getitem__(self, key):
        result = _wrap(self._a[_unwrap(key, host_ok=True)])  # CuPy copies host index arrays over
        if any(isinstance(k, (_HOST, ndarray, list)) for k in (key if type(key) is tuple else (key,))):
            _counts.op("take", [self], result)   # advanced indexing: a gather kernel
        return result

    def __setitem__(self, key, value):
        key = _unwrap(key, host_ok=True)
        advanced = any(isinstance(k, (_HOST, list)) for k in (key if type(key) is tuple else (key,)))
        if isinstance(value, _HOST) and value.ndim and not advanced:
            raise ValueError("non-scalar numpy.ndarray cannot be used for fill")
        self._a[key] = _unwrap(value, host_ok=True)
        _counts.op("__setitem__", [self], None, writes=True)

    __iter__ = lambda self: (self[i] for i in range(len(self)))  # noqa: E731
    __len__ = lambda self: len(self._a)  # noqa: E731
    __repr__ = lambda self: repr(self._a)  # noqa: E731
    __str__ = lambda self: str(self._a)  # noqa: E731
    __format__ = lambda self, spec: format(self._a, spec)  # noqa: E731
    __copy__ = lambda self: self.copy()  # noqa: E731
    __deepcopy__ = lambda self, memo: self.copy()  # noqa: E731


def _forward(name):
    def call(self, *args):
        _counters.check_gemm(name, [self, *_arrays(args)])
        if name in _counters.SYNC_READS:
            _counts.read()
        result = _wrap(getattr(self._a, name)(*_unwrap(args)))
        _counts.op(name, [self, *_arrays(args)], result,
                   writes=name.startswith("__i") and name not in ("__int__", "__invert__"))
        return result
    return call


for _op in "add sub mul truediv floordiv mod pow matmul and or xor lshift rshift divmod".split():
    for _name in (f"__{_op}__", f"__r{_op}__", f"__i{_op}__"):
        if hasattr(_HOST, _name):
            setattr(ndarray, _name, _forward(_name))
for _op in "lt le eq ne gt ge neg pos abs invert bool float int complex".split():
    setattr(ndarray, f"__{_op}__", _forward(f"__{_op}__"))


class _Ufunc:
    """A NumPy ufunc on cupy arrays: ``cupy.add(...)``, ``cupy.add.at(...)``."""
    _ADD_AT = {"int32", "float16", "float32", "float64", "uint32", "uint64"}  # CuPy's atomics

    def __init__(self, ufunc):
        self._u, self.__name__ = ufunc, ufunc.__name__

    def __call__(self, *args, **kwargs):
        return _function(self._u)(*args, **kwargs)

    def __getattr__(self, name):
        attr = getattr(self._u, name)
        return _function(attr) if callable(attr) else attr

    def at(self, a, indices, b=None):
        if not isinstance(a, ndarray):
            raise TypeError(f"Unsupported type {type(a)}")
        if self.__name__ == "add" and a.dtype.name not in self._ADD_AT:
            raise TypeError(f"cupy.add.at only supports {sorted(self._ADD_AT)} (got {a.dtype})")
        self._u.at(a._a, _unwrap(indices, True), *(() if b is None else (_unwrap(b, True),)))
        _counts.op(f"{self.__name__}.at", [a], None, writes=True)


def __getattr__(name):  # everything else is NumPy's, on cupy arrays
    obj = getattr(numpy, name) if not name.startswith("__") else None
    if obj is None or isinstance(obj, types.ModuleType):
        raise AttributeError(f"fake cupy does not model cupy.{name}")
    if isinstance(obj, numpy.ufunc):
        obj = _Ufunc(obj)
    elif callable(obj) and not isinstance(obj, type):  # dtypes (cupy.float32 ...) stay NumPy's
        obj = _function(obj)
    globals()[name] = obj
    return obj


def array(obj, dtype=None, copy=True, order="K", subok=False, ndmin=0, blocking=False):
    if not isinstance(obj, ndarray):
        _counts.h2d += 1
    return _wrap(numpy.array(_unwrap(obj, host_ok=True), dtype=dtype, order=order, ndmin=ndmin))


def asarray(a, dtype=None, order=None, *, blocking=False):
    if isinstance(a, ndarray):
        result = _wrap(numpy.asarray(a._a, dtype=dtype, order=order))
        _counts.op("asarray", [a], result, explicit=True)
        return result
    return array(a, dtype=dtype, order=order or "K")  # host -> device: always a copy


def asnumpy(a, stream=None, order="C", out=None, blocking=True):
    return a.get(order=order, out=out) if isinstance(a, ndarray) else numpy.asarray(a, order=order)


def get_array_module(*args):
    return sys.modules[__name__] if any(isinstance(a, ndarray) for a in args) else numpy


# ---------------------------------------------------------------------------- CUDA side
class MemoryPool:
    """used_bytes: live bytes of fake arrays; total_bytes: their peak since free_all_blocks."""
    _used = _total = 0
    used_bytes, total_bytes = (lambda self: self._used), (lambda self: self._total)

    def _alloc(self, array, nbytes):
        self._used += nbytes
        self._total = max(self._total, self._used)
        weakref.finalize(array, self._release, nbytes)

    def _release(self, nbytes):
        self._used -= nbytes

    def free_all_blocks(self, stream=None):
        self._total = self._used


class CUDADriverError(RuntimeError):
    pass


class LaunchCheckError(RuntimeError):
    """Fake-only: a launch a GPU would run while misreading its arguments, silently."""


def _module(name, **members):
    mod = sys.modules[f"{__name__}.{name}"] = types.ModuleType(f"{__name__}.{name}")
    mod.__dict__.update(members)
    return mod


def _visible_devices():
    """The physical cards this process sees, in CUDA's order: ``MINIPAR_FAKE_CUPY_DEVICES``
    of them, filtered and reordered by ``CUDA_VISIBLE_DEVICES`` where it is set."""
    cards = range(int(os.environ.get("MINIPAR_FAKE_CUPY_DEVICES", "1")))
    chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return list(cards)
    visible = []
    for item in chosen.split(","):      # as CUDA: the list stops at the first invalid entry
        if not item.strip().isdigit() or int(item) not in cards or int(item) in visible:
            break
        visible.append(int(item))
    return visible


class CUDARuntimeError(RuntimeError):
    pass


class Device:
    """A visible GPU by its number 0..n-1 (None: the current one)."""

    def __init__(self, device=None):
        self.id = _current_device if device is None else int(device)
        if not 0 <= self.id < len(_VISIBLE):
            raise CUDARuntimeError("cudaErrorInvalidDevice: invalid device ordinal")

    def use(self):
        global _current_device
        _current_device = self.id

    def synchronize(self):
        _counts.synchronize()
        _streams.synchronize_all()

    @property
    def pci_bus_id(self):
        return f"0000:{_VISIBLE[self.id] + 1:02x}:00.0"   # fake: card k on bus k + 1

    def __enter__(self):
        self._previous = _current_device
        self.use()
        return self

    def __exit__(self, *exc):
        Device(self._previous).use()

    __eq__ = lambda self, other: isinstance(other, Device) and other.id == self.id  # noqa: E731
    __hash__ = lambda self: hash(self.id)  # noqa: E731
    __repr__ = lambda self: f"<CUDA Device {self.id}>"  # noqa: E731


def _set_device(index):
    Device(index).use()


_VISIBLE = _visible_devices()
_current_device = 0
_made_on = collections.Counter()   # fake-only: arrays made per device
_pool = MemoryPool()
get_default_memory_pool = lambda: _pool  # noqa: E731
_PROPS = {"name": b"fake-cupy (NumPy + minipar CPU emulator)", "major": 9, "minor": 0,
          "sharedMemPerBlockOptin": 227 * 1024}  # as an H100/H200
cuda = _module("cuda", Stream=_streams.Stream, Event=_streams.Event, Device=Device,
               get_current_stream=_streams.get_current_stream,
               alloc_pinned_memory=_streams.alloc_pinned_memory,
               PinnedMemoryPointer=_streams.PinnedMemoryPointer,
               get_device_id=lambda: _current_device,
               driver=_module("cuda.driver", CUDADriverError=CUDADriverError),
               runtime=_module("cuda.runtime", getDeviceCount=lambda: len(_VISIBLE),
                               getDevice=lambda: _current_device, setDevice=_set_device,
                               CUDARuntimeError=CUDARuntimeError, CUDA_R_32F=0, CUDA_R_16F=2,
                               CUDA_R_16BF=14, getDeviceProperties=lambda device: dict(_PROPS)),
               device=_module("cuda.device", get_cublas_handle=lambda: 1),  # cupy_backends: cuBLAS
               memory=_module("cuda.memory", MemoryPool=MemoryPool,
                              OutOfMemoryError=type("OutOfMemoryError", (MemoryError,), {})))
from cupy._raw import RawKernel, RawModule  # noqa: E402  (needs ndarray, defined above)
from cupy import _nccl  # noqa: E402
cuda.nccl = sys.modules[f"{__name__}.cuda.nccl"] = _nccl   # NCCL's p2p, carried by MPI


# ---------------------------------------------------------------------------- random
class XORWOW:
    """Stands in for cupy.random.XORWOW, whose ``state()`` is a method giving a device pointer."""
    def __init__(self, seed=None):
        self._gen = numpy.random.Generator(numpy.random.Philox(numpy.random.SeedSequence(seed)))
        self._state = numpy.zeros(48, numpy.uint8)

    def state(self):
        return self._state.ctypes.data


class Generator:
    def __init__(self, bit_generator):
        self.bit_generator = bit_generator

    def __getattr__(self, name):  # random, standard_normal, integers (with dtype=, as in CuPy)
        if name not in ("random", "standard_normal", "integers"):
            raise AttributeError(f"fake cupy does not model Generator.{name}")
        draw = getattr(self.bit_generator._gen, name)
        return lambda *args, **kwargs: _wrap(numpy.asarray(draw(*args, **kwargs)))


random = _module("random", Generator=Generator, XORWOW=XORWOW, default_rng=lambda seed=None: (
    seed if isinstance(seed, Generator) else Generator(seed if isinstance(seed, XORWOW) else XORWOW(seed))))
