"""Solutions of lesson 02's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "to_bf16": r'''
def to_bf16(x):
    """float32 array -> float32 array of the nearest bfloat16 values (ties to even)."""
    bits = np.asarray(x, dtype=np.float32).view(np.uint32)
    last_kept = (bits >> 16) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + last_kept) & np.uint32(0xFFFF0000)
    return rounded.view(np.float32)
''',
    "activation_bytes": r'''
def activation_bytes(B, N, L, d, H, V):
    """Bytes a float32 training forward keeps alive: B sequences of N tokens, L blocks."""
    per_token = L * (25 * d + 2 * H * N + 2) + 2 * d + (2 * d + 1) + (V + V + 1)
    return 4 * (B * N * per_token + N * d) + 4
''',
    "MyMemoryCounter": r'''
import weakref


class MyMemoryCounter:
    """Bytes held by live tracked arrays, in all and per dtype, and the peak since the last reset."""

    def __init__(self):
        self.live = 0
        self.peak = 0
        self.live_by_dtype = {}        # dtype name -> live bytes
        self._counted = {}             # id of each counted owner -> a weak reference to it

    def track(self, a):
        """Count the bytes of the array that owns a's memory, once; uncount them when it is freed."""
        if not hasattr(a, "nbytes"):
            return a
        owner = a
        while getattr(owner, "base", None) is not None and hasattr(owner.base, "nbytes"):
            owner = owner.base         # a view: the memory is its base's
        key = id(owner)
        if key in self._counted:
            return a
        nbytes, dtype = owner.nbytes, str(owner.dtype)
        try:                           # the callback runs when the owner is freed
            self._counted[key] = weakref.ref(owner, lambda _ref: self._release(key, nbytes, dtype))
        except TypeError:              # NumPy scalars have no weak references: not counted
            return a
        self.live += nbytes
        self.live_by_dtype[dtype] = self.live_by_dtype.get(dtype, 0) + nbytes
        self.peak = max(self.peak, self.live)
        return a

    def _release(self, key, nbytes, dtype):
        if self._counted.pop(key, None) is not None:
            self.live -= nbytes
            self.live_by_dtype[dtype] -= nbytes

    def reset_peak(self):
        self.peak = self.live
''',
}
