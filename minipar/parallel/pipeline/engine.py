"""The pipeline engine: execute one rank's list of Actions with real tensors.

For each action of ``build_schedule(kind, pp, M, chunks)[rank]``:

    F(m, c)  input  = micro-batch m's tokens (first stage) or the activation
                      received from stage s-1;  output = stage(input);
                      last stage: loss_m = CE(output, targets_m) / M,
                      else send the output to stage s+1
    B(m, c)  last stage: loss_m.backward(); else receive dL/d(output) from s+1
             and output.backward(it); send dL/d(input) to stage s-1
    W(m, c)  (ZB-H1) compute the weight gradients that B deferred

Sends are non-blocking (``isend``, completed at the end of the step), receives
block, and messages are matched by a tag built from (kind, micro-batch, stage):
with non-blocking sends a schedule that passes the validator cannot deadlock.
When stage s±1 lives on this same rank (one rank, several chunks), the array is
handed over in memory.  Every action is timed into a trace (``timeline.py``).

``evaluate`` is forward only.  Every rank takes its (micro-batch, stage) pairs sorted
by (micro-batch, stage); the input of each pair comes from an earlier pair in that order,
and sends do not wait, so the earliest unfinished pair can always proceed: no deadlock.
"""
from __future__ import annotations

import time

from minipar import backend
from minipar.backend import xp
from minipar.autograd import Tensor, WeightGradDeferral, no_grad
from minipar.nn.moe import moe_modules
from minipar.parallel.pipeline.schedules import build_schedule, stage_location, virtual_stage
from minipar.parallel.pipeline.timeline import Span


class PipelineEngine:
    def __init__(self, rank_stages, pp_comm, kind, microbatches, chunks=1,
                 activation_shape=None, dtype=None):
        """The last stage's loss is the model's own ``loss`` (cross-entropy; the
        tensor-parallel model's is vocab-parallel).  ``activation_shape(rows,
        seq_len)``: the shape of what stages exchange (default (rows, seq_len, d_model);
        sequence parallelism holds seq_len/tp tokens)."""
        self.stages = rank_stages.stages
        d_model = self.stages[0].model.config.d_model
        self.loss_fn = self.stages[0].model.loss
        self.moe = moe_modules(self.stages[0].model)     # this rank's: others' are dropped
        if self.moe:     # the MoE layers' balancing losses are added here, stage by stage
            self.stages[0].model.aux_in_loss = False
        self.activation_shape = activation_shape or (lambda rows, seq: (rows, seq, d_model))
        self.dtype = dtype    # of the activations exchanged (default: the default dtype)
        self.comm = pp_comm
        self.pp, self.chunks, self.M = pp_comm.size, chunks, microbatches
        self.S = self.pp * chunks
        self.rank = pp_comm.rank
        self.after_compute = []   # hooks f(seconds) after each piece of compute (train/faults.py)
        self.actions = build_schedule(kind, self.pp, microbatches, chunks)[self.rank]
        self.split = any(a.kind == "W" for a in self.actions)
        self.spans = []

    def _computed(self, start):
        for hook in self.after_compute:
            hook(self._now() - start)

    # ------------------------------------------------------------ messaging
    def _tag(self, kind, mb, stage):
        return (0 if kind == "act" else 1) * self.S * self.M + stage * self.M + mb

    def _send(self, array, kind, mb, to_stage):
        rank, _ = stage_location(to_stage, self.pp)
        if rank == self.rank:
            self.local[(kind, mb, to_stage)] = array
            return
        buf = xp.ascontiguousarray(array)
        t0 = self._now()
        # a completed send's buffer can go now: holding each one to the end of the step
        # would keep every micro-batch's sent activations (or gradients) alive at once
        self.pending_sends = [(r, b) for r, b in self.pending_sends if not r.test()]
        self.pending_sends.append((self.comm.isend(buf, rank, tag=self._tag(kind, mb, to_stage)), buf))
        self.spans.append(Span("send", mb, 0, t0, self._now()))

    def _recv(self, kind, mb, my_stage, from_stage, shape, dtype):
        rank, _ = stage_location(from_stage, self.pp)
        if rank == self.rank:
            return self.local.pop((kind, mb, my_stage))
        buf = xp.empty(shape, dtype=dtype)
        t0 = self._now()
        self.comm.recv(buf, rank, tag=self._tag(kind, mb, my_stage))
        self.spans.append(Span("recv", mb, 0, t0, self._now()))
        return buf

    def _now(self):
        return time.perf_counter() - self.t0

    # ------------------------------------------------------------ one step
    def run(self, inputs, targets, t0=None, loss_scale=1.0):
        """Forward and backward of M micro-batches (row slices of inputs/targets).
        Returns the sum over micro-batches of loss_m/M on the last stage, else 0, plus
        the balancing losses of the MoE layers this rank holds (their mean over the
        micro-batches): summed over the stages, the step's loss (``train_step``).
        Gradients are left accumulated in the parameters; with ``loss_scale`` S (fp16)
        the last stage back-propagates S·loss, so every gradient is S times larger."""
        rows = inputs.shape[0] // self.M
        self.t0 = time.perf_counter() if t0 is None else t0
        self.spans, self.local, self.pending_sends = [], {}, []
        saved, deferred, loss_total = {}, {}, 0.0
        for moe in self.moe:      # dL/d(aux) of every micro-batch: the seed of its loss
            moe.seed.value = loss_scale / self.M
        act_shape = self.activation_shape(rows, inputs.shape[1])
        dtype = self.dtype or backend.default_dtype()
        for action in self.actions:
            c, mb = action.chunk, action.microbatch
            s = virtual_stage(self.rank, c, self.pp)
            stage = self.stages[c]
            # an op's span covers its compute only: the receive before it and the send after
            # it are spans of their own (``_recv``/``_send``), so waits never hide in F or B
            if action.kind == "F":
                if s == 0:
                    x = backend.to_device(inputs[mb * rows:(mb + 1) * rows])
                else:
                    x = Tensor(self._recv("act", mb, s, s - 1, act_shape, dtype), requires_grad=True)
                start = self._now()
                out = stage(x)
                if s == self.S - 1:
                    y = backend.to_device(targets[mb * rows:(mb + 1) * rows])
                    out = self.loss_fn(out, y) * (1.0 / self.M)
                    loss_total += out.item()
                self._computed(start)
                self.spans.append(Span("F", mb, c, start, self._now()))
                if s < self.S - 1:
                    self._send(out.data, "act", mb, s + 1)
                saved[(mb, c)] = (x, out)
            elif action.kind == "B":
                x, out = saved.pop((mb, c))
                if s == self.S - 1:
                    grad = xp.full(out.shape, loss_scale, dtype=out.dtype)
                else:
                    grad = self._recv("grad", mb, s, s + 1, out.shape, out.dtype)
                start = self._now()
                if self.split:
                    d = deferred[(mb, c)] = WeightGradDeferral()
                    out.backward(grad, deferral=d)
                else:
                    out.backward(grad)
                self._computed(start)
                self.spans.append(Span("B", mb, c, start, self._now()))
                if s > 0:
                    self._send(x.grad, "grad", mb, s - 1)
            else:
                start = self._now()
                deferred.pop((mb, c)).run()
                self._computed(start)
                self.spans.append(Span("W", mb, c, start, self._now()))
        t0 = self._now()
        for request, _ in self.pending_sends:
            request.wait()
        self.pending_sends = []
        drain = self._now() - t0          # waiting for the last sends to be received
        self.comm_wait_s = drain + sum(s.end - s.start for s in self.spans
                                       if s.kind in ("send", "recv"))
        aux = sum(m.step_load.aux_sum / m.step_load.sequences for m in self.moe
                  if m.step_load.sequences)
        return (loss_total if self.stages[-1].is_last else 0.0) + float(aux)

    # ------------------------------------------------------------ evaluation
    def evaluate(self, inputs, targets):
        """The mean loss of M micro-batches, forward only (no graph kept); returned on the
        last stage, else None."""
        rows = inputs.shape[0] // self.M
        self.t0, self.local, self.pending_sends = time.perf_counter(), {}, []
        training_spans, self.spans = self.spans, []  # the last step's trace stays as it was
        act_shape = self.activation_shape(rows, inputs.shape[1])
        dtype = self.dtype or backend.default_dtype()
        loss_total = 0.0
        try:
            with no_grad():
                for mb in range(self.M):
                    for c, stage in enumerate(self.stages):
                        s = virtual_stage(self.rank, c, self.pp)
                        if s == 0:
                            x = backend.to_device(inputs[mb * rows:(mb + 1) * rows])
                        else:
                            x = Tensor(self._recv("act", mb, s, s - 1, act_shape, dtype))
                        out = stage(x)
                        if s == self.S - 1:
                            y = backend.to_device(targets[mb * rows:(mb + 1) * rows])
                            loss_total += self.loss_fn(out, y).item() / self.M
                        else:
                            self._send(out.data, "act", mb, s + 1)
            for request, _ in self.pending_sends:
                request.wait()
        finally:
            self.pending_sends, self.spans = [], training_spans
        return loss_total if self.stages[-1].is_last else None
