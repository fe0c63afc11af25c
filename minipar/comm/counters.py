"""What a communicator has moved: data bytes and messages, sent and received.

Every data message a ``transport.Transport`` sends or receives adds here (check mode's
and setup's small metadata exchanges do not), so textbook volumes can be checked: a ring
all-reduce of S bytes over n ranks sends 2(n-1)/n·S from every rank.
"""
from __future__ import annotations


class Counters:
    """Bytes and messages moved by one communicator (its contexts and internal
    sub-communicators keep their own, and the owner's totals add them up — so a
    progress thread never races the main thread on the same counter)."""

    __slots__ = ("bytes_sent", "bytes_recv", "msgs_sent", "msgs_recv")

    def __init__(self):
        self.reset()

    def reset(self):
        self.bytes_sent = self.bytes_recv = self.msgs_sent = self.msgs_recv = 0

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}
