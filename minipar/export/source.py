"""A checkpoint's parameters, one tensor at a time, for exporters.

A run padded its vocabulary (``pad_vocab_to``: the embedding's rows and the head's columns
rounded up to a multiple, zero, never a logit); an exported model has the V real ones:
``VOCAB_AXIS`` says which axis of which tensor is cut back to V."""
from __future__ import annotations

from minipar import checkpoint


VOCAB_AXIS = {"wte.weight": 0, "lm_head.weight": 1}


class CheckpointTensors:
    """names(), shape(name), tensor(name) of a checkpoint's parameters; ``model`` is its
    model config (dict), ``tokenizer`` its tokenizer (dict) or None.  Each tensor is read
    from its pieces when asked for (``checkpoint.open_checkpoint``): one in memory at a time."""

    def __init__(self, directory):
        self._ckpt = checkpoint.open_checkpoint(directory)
        self.model = self._ckpt.meta.get("model", {})
        self.tokenizer = self._ckpt.meta.get("tokenizer")

    def names(self):
        return sorted(self._ckpt.names("param"))

    def shape(self, name):
        shape = list(self._ckpt.shape("param", name))
        if name in VOCAB_AXIS:
            shape[VOCAB_AXIS[name]] = self.model["vocab_size"]
        return tuple(shape)

    def tensor(self, name):
        array = self._ckpt.tensor(name)
        if name in VOCAB_AXIS:
            array = array[(slice(None),) * VOCAB_AXIS[name] + (slice(0, self.model["vocab_size"]),)]
        return array


def open_tensors(directory):
    return CheckpointTensors(directory)
