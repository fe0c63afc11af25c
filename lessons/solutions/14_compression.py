"""Solutions of lesson 14's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "topk_feedback": r'''
def my_topk_with_feedback(grad, residual, k):
    x = grad + residual
    idx = np.argpartition(np.abs(x), x.size - k)[x.size - k:]
    left = x.copy()
    left[idx] = 0.0                       # what is sent leaves the residual
    return idx, x[idx], left
''',
    "quantise": r'''
def my_quantise(x, chunk):
    rows = np.concatenate([x, np.zeros(-x.size % chunk)]).reshape(-1, chunk)
    scale = (np.abs(rows).max(axis=1) / 127).astype(np.float32)
    safe = np.where(scale > 0, scale, 1).astype(x.dtype)
    q = np.clip(np.rint(rows / safe[:, None]), -127, 127).astype(np.int8)
    return q.reshape(-1)[:x.size], scale
''',
    "my_diloco": r'''
%%writefile {MINE}/diloco.py
"""Your DiLoCo outer step (lesson 14): run under mpiexec by 14_yours.py."""
from minipar.comm import all_reduce


class MyDiLoCo:
    """Every ``inner_steps`` calls of ``step()``: the outer step of DiLoCo's Algorithm 1."""

    def __init__(self, model, optimizer, comm, inner_steps, lr=0.7, momentum=0.9):
        self.params = list(model.named_parameters())
        self.comm, self.H, self.lr, self.mu = comm, inner_steps, lr, momentum
        self.calls = 0
        self.theta = {n: p.data.copy() for n, p in self.params}          # θ^(t-1), global
        self.buf = {n: 0.0 * p.data for n, p in self.params}            # Nesterov's b

    def step(self):
        """After an inner optimizer step; every H-th call, the outer step."""
        self.calls += 1
        if self.calls % self.H:
            return
        for n, p in self.params:
            delta = self.theta[n] - p.data                               # the pseudo-gradient
            delta = all_reduce(self.comm, delta) / self.comm.size        # its mean over groups
            self.buf[n] = self.mu * self.buf[n] + delta                  # b <- mu b + delta
            self.theta[n] = self.theta[n] - self.lr * (delta + self.mu * self.buf[n])
            p.data[...] = self.theta[n]                 # the group continues from theta; AdamW's
                                                        # m and v are left as they are
''',
}
