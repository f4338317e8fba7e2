"""The attention calls as they ran: an observer of the profiled pass (``instrument.observe``) that records each
call's shape, mask and causal structure, summed per call site into ``peak.AttnShape`` values.

Recording reads tensor shapes only (no device work, no synchronisation), after the call's profiler range has
closed: the trace and the call's host time are as they would be without it.
"""

from __future__ import annotations

from ..peak import AttnShape, call_flops, kv_bytes

__all__ = ["ShapeRecorder"]


class ShapeRecorder:
    """Shows itself to every attention call of a measured block; ``shapes(steps)`` sums what it saw per call
    site (one-row calls apart), per step of the ``steps`` it watched. Per call it only counts the call's key
    length under its shape (a few microseconds of host time, outside the call's range); the work is summed
    after."""

    def __init__(self):
        self.seen: dict[tuple, dict[int, int]] = {}  # (site, shape...) -> {key length: calls}

    def __call__(self, where, q, k, v, mask, causal, window, out, top_left=False) -> None:
        b, h, s_q, d = q.shape
        s_kv = k.shape[2]
        causal = bool(causal) and s_q > 1
        if causal and mask is None and not top_left and s_kv > s_q:  # cropped to the queries, as dispatch does
            s_kv = s_q
        key = (where, b, h, k.shape[1], s_q, d, v.shape[-1], q.dtype, causal, int(window) if window else None,
               mask is not None, top_left)
        lens = self.seen.get(key)
        if lens is None:
            lens = self.seen[key] = {}
        lens[s_kv] = lens.get(s_kv, 0) + 1

    def shapes(self, steps: int) -> tuple[AttnShape, ...]:
        """Per call site and kind of call: its calls per step (``steps`` watched), its shape and mean work."""
        out = []
        for (where, b, h, kv_heads, s_q, d, dv, dtype, causal, window, mask, top_left), lens in self.seen.items():
            n = sum(lens.values())
            name = str(dtype).replace("torch.", "")
            flops = sum(c * call_flops(b, h, s_q, s_kv, d, dv, causal, window, top_left) for s_kv, c in lens.items())
            moved = sum(c * kv_bytes(b, kv_heads, s_kv, d, dv, name, window) for s_kv, c in lens.items())
            out.append(AttnShape(where, n / max(1, steps), b, h, kv_heads, s_q, max(lens), min(lens), d, dv, name,
                                 causal, window, mask, top_left, flops / n, moved / n))
        return tuple(out)
