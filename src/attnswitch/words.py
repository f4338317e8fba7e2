"""Words the reports and messages share."""

from __future__ import annotations

__all__ = ["counted", "clauses"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``counted(1, "new token")``: "1 new token")."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def clauses(reasons) -> str:
    """Reasons as one sentence's clauses, joined by "; " (PyTorch's own end with a period: dropped)."""
    return "; ".join(_unstopped(str(r).rstrip()) for r in reasons)


def _unstopped(reason: str) -> str:
    """A reason without its full stop (an ellipsis kept)."""
    return reason[:-1] if reason.endswith(".") and not reason.endswith("..") else reason
