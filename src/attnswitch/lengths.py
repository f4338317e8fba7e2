"""The prompt lengths a deployment sees: a distribution read from a file, the lengths to measure it at, and
how many key lengths a run of requests meets for the first time (a plan or a compile each, for a backend
that pays per new shape). Pure and torch-free.

A file holds one length a line (``#`` comments and blank lines allowed), or JSON: ``{"512": 120, "2048":
30}`` (length -> count) or ``[[512, 120], [2048, 30]]``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Lengths", "read_lengths", "MEASURED"]

#: lengths measured for a distribution of more distinct lengths than this: its weighted quantiles
MEASURED = 5


@dataclass(frozen=True)
class Lengths:
    """Prompt length -> the fraction of requests of that length (sorted by length; the fractions sum
    to 1)."""

    weights: tuple[tuple[int, float], ...]
    source: str = ""

    @classmethod
    def of(cls, counts: Mapping[int, float] | Sequence[int], source: str = "") -> Lengths:
        """From ``{length: count}`` or a sequence of lengths (one per request)."""
        if not isinstance(counts, Mapping):
            tally: dict[int, float] = {}
            for n in counts:
                tally[n] = tally.get(n, 0) + 1
            counts = tally
        bad = [f"{k!r}: {v!r}" for k, v in counts.items()
               if isinstance(k, bool) or not isinstance(k, int) or k < 1 or not isinstance(v, (int, float))
               or isinstance(v, bool) or v < 0 or v != v]
        if bad:
            raise ValueError(f"prompt lengths must be positive integers with counts of 0 or more; got {bad[0]}"
                             + (f" in {source}" if source else ""))
        total = sum(counts.values())
        if not total:
            raise ValueError("no prompt lengths" + (f" in {source}" if source else "") + ": at least one is needed")
        return cls(tuple(sorted((int(k), v / total) for k, v in counts.items() if v)), source)

    @property
    def lengths(self) -> tuple[int, ...]:
        return tuple(n for n, _ in self.weights)

    def mean(self) -> float:
        return sum(n * w for n, w in self.weights)

    def representative(self, k: int = MEASURED) -> tuple[int, ...]:
        """The lengths to measure: every distinct length where there are at most ``k``, else the weighted
        quantiles at ``(i + 0.5) / k`` (so that each stands for an equal share of the requests)."""
        if len(self.weights) <= k:
            return self.lengths
        out, acc, i = [], 0.0, 0
        for n, w in self.weights:
            acc += w
            while i < k and acc >= (i + 0.5) / k - 1e-12:
                out.append(n)
                i += 1
        return tuple(dict.fromkeys(out))

    def first_met(self, requests: int, new_tokens: int) -> float:
        """The expected number of shapes a run of ``requests`` requests meets for the first time: each
        request's prompt length (its prefill) and the key lengths of its decode steps (prompt + 1 to prompt
        + ``new_tokens`` - 1). Exact for lengths drawn independently from the distribution:
        ``sum over shapes of 1 - (1 - p)^requests``, ``p`` the chance that one request meets it."""
        if requests <= 0:
            return 0.0
        prefill = sum(1 - (1 - w) ** requests for _, w in self.weights)
        touched: dict[int, float] = {}
        for n, w in self.weights:
            for kv in range(n + 1, n + new_tokens):
                touched[kv] = touched.get(kv, 0.0) + w
        decode = sum(1 - (1 - min(p, 1.0)) ** requests for p in touched.values())
        return prefill + decode


def read_lengths(path: str | Path) -> Lengths:
    """A distribution of prompt lengths from a file (one length a line, or a JSON histogram); a
    ``ValueError`` of one line, naming the file and the line, for anything else."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise ValueError(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file of prompt lengths") from None
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            data = json.loads(stripped)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}: not valid JSON (line {e.lineno}: {e.msg})") from None
        return Lengths.of(_histogram(data, path), str(path))
    counts: dict[int, float] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        if not line.isdigit() or int(line) < 1:
            raise ValueError(f"{path}:{i}: expected one prompt length (a positive integer) a line, got {line!r}")
        counts[int(line)] = counts.get(int(line), 0) + 1
    return Lengths.of(counts, str(path))


def _histogram(data, path) -> dict:
    """``{"512": 120}`` or ``[[512, 120]]`` as ``{512: 120}``."""
    pairs = data.items() if isinstance(data, dict) else data
    out: dict = {}
    try:
        for k, v in pairs:
            key = int(k) if isinstance(k, str) and k.strip().isdigit() else k
            out[key] = out.get(key, 0) + v if isinstance(v, (int, float)) and not isinstance(v, bool) else v
    except (TypeError, ValueError):
        raise ValueError(f"{path}: a JSON histogram is {{\"length\": count, ...}} or [[length, count], ...]") \
            from None
    return out
