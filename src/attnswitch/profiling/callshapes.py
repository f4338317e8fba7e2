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
    site (one-row calls apart), per step of the ``steps`` it watched."""

    def __init__(self):
        self.seen: dict[tuple, list] = {}  # (site, shape...) -> [calls, min kv, max kv, flops, bytes]

    def __call__(self, where, q, k, v, mask, causal, window, out, top_left=False) -> None:
        b, h, s_q, d = q.shape
        kv_heads, s_kv, dv = k.shape[1], k.shape[2], v.shape[-1]
        causal = bool(causal) and s_q > 1
        if causal and mask is None and not top_left and s_kv > s_q:  # cropped to the queries, as dispatch does
            s_kv = s_q
        window = int(window) if window else None
        dtype = str(q.dtype).replace("torch.", "")
        key = (where, s_q == 1, b, h, kv_heads, s_q if s_q > 1 else 1, d, dv, dtype, causal, window,
               mask is not None, top_left)
        rec = self.seen.get(key)
        if rec is None:
            rec = self.seen[key] = [0, s_kv, s_kv, 0.0, 0.0]
        rec[0] += 1
        rec[1], rec[2] = min(rec[1], s_kv), max(rec[2], s_kv)
        rec[3] += call_flops(b, h, s_q, s_kv, d, dv, causal, window, top_left)
        rec[4] += kv_bytes(b, kv_heads, s_kv, d, dv, dtype, window)

    def shapes(self, steps: int) -> tuple[AttnShape, ...]:
        """Per call site and kind of call: its calls per step (``steps`` watched), its shape and mean work."""
        out = []
        for (where, _, b, h, kv_heads, s_q, d, dv, dtype, causal, window, mask, top_left), (n, lo, hi, fl, by) \
                in self.seen.items():
            out.append(AttnShape(where, n / max(1, steps), b, h, kv_heads, s_q, hi, lo, d, dv, dtype, causal, window,
                                 mask, top_left, fl / n, by / n))
        return tuple(out)
