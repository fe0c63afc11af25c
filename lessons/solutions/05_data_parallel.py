"""Solutions of lesson 05's exercises (the test suite runs the notebook with them)."""

SOLUTIONS = {
    "replica_average": r'''
def replica_average(grads, rows):
    total = sum(rows)
    return {name: sum(g[name] * (n / total) for g, n in zip(grads, rows)) for name in grads[0]}
''',
    "bucket_hook": r'''
class MyBucketHooks:
    """DDP's bookkeeping: launch(i) as soon as every parameter of bucket i has its gradient."""

    def __init__(self, buckets, launch):
        self.buckets, self.launch = buckets, launch
        self.bucket_of = {id(p): i for i, b in enumerate(buckets) for p in b.params}
        self.count = [0] * len(buckets)

    def grad_ready(self, param):
        i = self.bucket_of[id(param)]
        self.count[i] += 1
        if self.count[i] == len(self.buckets[i].params):
            self.count[i] = 0                 # ready for the next backward
            self.launch(i)
''',
    "my_ddp": r'''
%%writefile {MINE}/ddp.py
"""Your overlapped DDP (lesson 05): run under mpiexec by 05_yours.py."""
from minipar.backend import xp
from minipar.comm import all_reduce_async
from minipar.parallel.buckets import make_buckets


class MyDDP:
    """Gradients in buckets; each bucket's all-reduce started the moment its last gradient
    arrives, and waited for only after backward."""

    def __init__(self, model, comm, bucket_bytes):
        self.comm = comm
        self.buckets = make_buckets(model.parameters(), bucket_bytes)
        self.bucket_of = {id(p): b for b in self.buckets for p in b.params}
        self.arrived = {id(b): 0 for b in self.buckets}
        self.in_flight = []                               # (bucket, its flat buffer, handle)
        for p in model.parameters():
            p.register_hook(self.grad_ready)

    def grad_ready(self, param):
        bucket = self.bucket_of[id(param)]
        self.arrived[id(bucket)] += 1
        if self.arrived[id(bucket)] == len(bucket.params):
            self.arrived[id(bucket)] = 0                  # ready for the next backward
            flat = xp.concatenate([p.grad.reshape(-1) for p in bucket.params])
            handle = all_reduce_async(self.comm, flat, algorithm="ring")   # returns at once
            self.in_flight.append((bucket, flat, handle))

    def finish(self):
        """After backward: wait for every bucket, then every .grad is the mean over the ranks."""
        for bucket, flat, handle in self.in_flight:
            handle.wait()                                 # the sum over ranks, in place
            flat /= self.comm.size                        # ... and the mean
            offset = 0
            for p in bucket.params:
                p.grad = flat[offset:offset + p.size].reshape(p.shape)
                offset += p.size
        self.in_flight = []
''',
}
