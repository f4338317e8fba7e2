"""Words the reports and messages share."""

from __future__ import annotations

__all__ = ["counted", "clauses"]


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural unless ``n`` is 1 (``counted(1, "new token")``: "1 new token")."""
    return f"{n} {noun}" + ("" if n == 1 else "s")


def clauses(reasons) -> str:
    """Reasons as one sentence's clauses, joined by "; " (PyTorch's own end with a period: dropped)."""
    return "; ".join(str(r).rstrip().removesuffix(".") for r in reasons)
