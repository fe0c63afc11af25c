"""The fake cupy's ``RawModule``/``RawKernel``: CUDA C run by minipar's CPU emulator, with the
launch checks of a driver plus one a GPU would not make: pointer dtypes against the kernel's
parameter types (a GPU misreads them silently).  See ``cupy/__init__.py``."""
from cupy import _HOST, _PROPS, CUDADriverError, LaunchCheckError, _counts, ndarray

_POINTEES = {"float": {"float32"}, "double": {"float64"}, "int": {"int32"}, "unsigned": {"uint32"},
             "half": {"float16"}, "__half": {"float16"}, "half_bits": {"float16", "uint16"},
             "bf16_bits": {"bfloat16"}}


class RawModule:
    """CUDA C run by minipar's CPU emulator (``-DHEAD_DIM=d`` among ``options`` where the
    source needs it)."""
    def __init__(self, code=None, path=None, options=(), backend="nvrtc", **kwargs):
        from minipar.kernels import emulator
        self.code, self.options, self._emu = code or open(path).read(), tuple(options), emulator
        self._params = {name: params for name, params, _ in emulator.source.kernels_of(self.code)}
        self._exe = None

    def get_function(self, name):
        if name not in self._params:
            raise CUDADriverError("CUDA_ERROR_NOT_FOUND: named symbol not found")
        if self._exe is None:  # CuPy compiles here too (NVRTC, cached on disk)
            # the flash kernels are built per head dim; a source without HEAD_DIM gets 0
            dims = [int(o.split("=", 1)[1]) for o in self.options if o.startswith("-DHEAD_DIM=")]
            self._exe = self._emu.build(self.code, dims[0] if dims else 0,
                                        "fake_cupy_" + next(iter(self._params)))
        return RawKernel(None, name, _module=self)


class RawKernel:
    """Launch checks (threads, grid, shared memory, argument kinds) are the emulator's."""
    def __init__(self, code, name, options=(), _module=None, **kwargs):
        module = _module or RawModule(code=code, options=options)
        if _module is None:
            module.get_function(name)  # compiles
        self.name, self._params = name, module._params[name]
        self._kernel = module._emu.EmulatedKernel(module._exe, name)

    @property
    def max_dynamic_shared_size_bytes(self):  # 48 KiB until raised, as CUDA's attribute
        return self._kernel.max_dynamic_shared_size_bytes

    @max_dynamic_shared_size_bytes.setter
    def max_dynamic_shared_size_bytes(self, value):
        if not 0 <= int(value) <= _PROPS["sharedMemPerBlockOptin"]:
            raise CUDADriverError("CUDA_ERROR_INVALID_VALUE: invalid argument")
        self._kernel.max_dynamic_shared_size_bytes = int(value)

    def __call__(self, grid, block, args, *, shared_mem=0, stream=None, enable_cooperative_groups=False):
        if type(grid) is not tuple or type(block) is not tuple:
            raise TypeError("grid and block must be tuples")
        host_args = []
        for arg, (ctype, pname) in zip(args, self._params + [("?", "?")] * len(args)):
            if isinstance(arg, _HOST):
                raise TypeError(f"Unsupported type {type(arg)}")  # CuPy's refusal
            if isinstance(arg, ndarray):
                wanted = _POINTEES.get(ctype.replace("const", "").strip(" *"), {arg.dtype.name})
                if arg.dtype.name not in wanted or not arg.flags.c_contiguous:
                    raise LaunchCheckError(f"{self.name}: {pname} ({ctype}) got a {arg.dtype} array "
                                           f"(C-contiguous: {arg.flags.c_contiguous})")
                arg = arg._a
            host_args.append(arg)
        self._kernel(grid, block, host_args, shared_mem=shared_mem)
        _counts.raw_kernel(self.name)
