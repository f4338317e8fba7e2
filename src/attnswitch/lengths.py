"""The prompt lengths a deployment sees: a distribution read from a file, the lengths to measure it at, and
how many key lengths a run of requests meets for the first time (a plan or a compile each, for a backend
that pays per new shape). Pure and torch-free.

A file holds one length a line (``#`` comments and blank lines allowed), or JSON: ``{"512": 120, "2048":
30}`` (length -> count) or ``[[512, 120], [2048, 30]]``.
"""

from __future__ import annotations

import functools
import json
import math
import numbers
import operator
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path

from .options import MAX_LENGTH, OptionError

__all__ = ["Lengths", "read_lengths", "MEASURED", "MAX_LENGTH"]

#: lengths measured for a distribution of more distinct lengths than this: its weighted quantiles
MEASURED = 5


def _length(k) -> int | None:
    """``k`` as a prompt length (an integer of any kind, numpy's too, or a float without a fraction), or
    None for anything else (a bool, a fraction, a string)."""
    if isinstance(k, bool):
        return None
    try:
        return operator.index(k)
    except TypeError:
        pass
    if isinstance(k, numbers.Real) and math.isfinite(k) and float(k).is_integer():
        return int(k)
    return None


def _count(v) -> Fraction | None:
    """``v`` as a count, exactly (so that no sum or ratio of counts overflows): a finite real of 0 or more
    (numpy's too; not a bool), or None."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    try:
        c = Fraction(v) if isinstance(v, numbers.Rational) else Fraction(float(v))
    except (OverflowError, ValueError, TypeError):  # inf, nan
        return None
    return c if c >= 0 else None


@dataclass(frozen=True)
class Lengths:
    """Prompt length -> the fraction of requests of that length (sorted by length; the fractions sum
    to 1)."""

    weights: tuple[tuple[int, float], ...]
    source: str = ""

    @classmethod
    def of(cls, counts: Mapping[int, float] | Sequence[int], source: str = "") -> Lengths:
        """From ``{length: count}`` or a sequence of lengths (one per request). Lengths are integers (numpy's
        too) from 1 to ``MAX_LENGTH``; counts finite numbers of 0 or more (a length of count 0 is left out);
        anything else an ``OptionError`` (a ``ValueError``) of one line."""
        where = f" in {source}" if source else ""
        if isinstance(counts, (str, bytes)):
            raise _refused(f"prompt lengths are {{length: count}} or a sequence of lengths, not "
                             f"{_shown(counts)}{where}")
        if not isinstance(counts, Mapping):
            tally: dict = {}
            try:
                for n in counts:
                    tally[n] = tally.get(n, 0) + 1
            except TypeError:  # not iterable, or an item that is no length ([[512, 120]]: a file's form)
                raise _refused(f"prompt lengths are {{length: count}} or a sequence of lengths, not "
                                 f"{_shown(counts)}{where}") from None
            counts = tally
        merged: dict[int, Fraction] = {}
        for k, v in counts.items():
            n, c = _length(k), _count(v)
            if n is None or n < 1 or c is None:
                raise _refused("prompt lengths must be positive integers with finite counts of 0 or more; got "
                                 f"{_shown(k)}: {_shown(v)}{where}")
            if n > MAX_LENGTH:
                raise _refused(f"prompt length {_shown(n)}{where} is beyond any model's positions (at most "
                                 f"{MAX_LENGTH})")
            merged[n] = merged.get(n, 0) + c
        # each weight from the exact counts: counts near a float's limit (or beyond it) neither overflow their
        # sum nor round to nothing
        total = sum(merged.values())
        if not total:
            raise _refused(f"no prompt lengths{where}: at least one is needed")
        return cls(tuple(sorted((n, float(c / total)) for n, c in merged.items() if c)), source)

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

    def first_met(self, requests: int, new_tokens: int, static: bool = False) -> float:
        """The expected number of shapes a run of ``requests`` requests meets for the first time: each
        request's prompt length (its prefill) and the key lengths of its decode steps (prompt + 1 to prompt
        + ``new_tokens`` - 1; with a ``static`` cache, one: the cache's). Exact for lengths drawn independently
        from the distribution: ``sum over shapes of 1 - (1 - p)^requests``, ``p`` the chance that one request
        meets it."""
        return sum(self.first_met_phases(requests, new_tokens, static))

    def first_met_phases(self, requests: int, new_tokens: int, static: bool = False) -> tuple[float, float]:
        """``first_met`` apart: the prompt lengths, and the decode steps' key lengths."""
        if requests <= 0:
            return 0.0, 0.0
        prompts = sum(_met(w, requests) for _, w in self.weights)
        steps = sum(k * _met(p, requests) for k, p in self.step_segments(new_tokens, static))
        return prompts, steps

    def step_segments(self, new_tokens: int, static: bool = False) -> tuple[tuple[int, float], ...]:
        """The decode steps' key lengths in runs of equal chance: ``(how many key lengths, the chance that one
        request meets each)``. A request of prompt length n meets n + 1 to n + ``new_tokens`` - 1; with a
        ``static`` cache, its decode steps all meet one, the cache's length (n + ``new_tokens``)."""
        if static:
            return tuple((1, w) for _, w in self.weights) if new_tokens > 1 else ()
        return _step_segments(self.weights, new_tokens)


@functools.lru_cache(maxsize=8)
def _step_segments(weights: tuple[tuple[int, float], ...], new_tokens: int) -> tuple[tuple[int, float], ...]:
    # a sweep over where the windows of key lengths start and end, the chances summed exactly (no drift, and
    # 0 where no window is): each weight an integer over one common power of two
    if new_tokens <= 1:
        return ()
    ratios = [w.as_integer_ratio() for _, w in weights]
    scale = max(d for _, d in ratios)
    events: dict[int, int] = {}
    for (n, _), (num, den) in zip(weights, ratios):
        events[n + 1] = events.get(n + 1, 0) + num * (scale // den)
        events[n + new_tokens] = events.get(n + new_tokens, 0) - num * (scale // den)
    out, chance, at = [], 0, None
    for kv in sorted(events):
        if at is not None and chance > 0:
            out.append((kv - at, min(chance / scale, 1.0)))
        chance += events[kv]
        at = kv
    return tuple(out)


def _met(chance: float, requests: int) -> float:
    """``1 - (1 - chance)^requests``, exact for tiny chances and many requests."""
    return 1.0 if chance >= 1 else -math.expm1(requests * math.log1p(-chance))


def read_lengths(path: str | Path) -> Lengths:
    """A distribution of prompt lengths from a file (one length a line, or a JSON histogram); a
    ``OptionError`` (a ``ValueError``) of one line, naming the file and the line, for anything else."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise _refused(f"{path}: cannot read it ({e.strerror or e})") from None
    except UnicodeDecodeError:
        raise _refused(f"{path}: not a text file of prompt lengths") from None
    text = text.removeprefix("\ufeff")  # (a byte-order mark some editors write)
    stripped = text.strip()
    if stripped[:1] in ("{", "["):
        try:
            data = json.loads(stripped)
        except ValueError as e:  # (a JSONDecodeError; or a number of more digits than Python converts)
            where = f"line {e.lineno}: {e.msg}" if isinstance(e, json.JSONDecodeError) else str(e).split(";")[0]
            raise _refused(f"{path}: not valid JSON ({where})") from None
        return Lengths.of(_histogram(data, path), str(path))
    counts: dict[int, float] = {}
    for i, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        n = _digits(line)
        if n is None or n < 1:
            raise _refused(f"{path}:{i}: expected one prompt length (a positive integer) a line, got "
                             f"{_shown(line)}")
        if n > MAX_LENGTH:
            raise _refused(f"{path}:{i}: prompt length {_shown(n)} is beyond any model's positions (at most "
                             f"{MAX_LENGTH})")
        counts[n] = counts.get(n, 0) + 1
    return Lengths.of(counts, str(path))


def _digits(text: str) -> int | None:
    """The integer ``text`` writes in ASCII digits (``²`` and the other digits ``int`` refuses are not);
    None for anything else, and for more digits than ``int`` converts."""
    if not (text.isascii() and text.isdigit()) or len(text) > 4000:
        return None
    return int(text)


def _refused(text: str) -> OptionError:
    """Bad lengths, in words that name no parameter (the file and the line where there is one)."""
    return OptionError("{text}", text=text)


def _shown(x) -> str:
    """``repr(x)``, cut short where it is long (a line of an error message)."""
    text = repr(x)
    return text if len(text) <= 40 else text[:37] + "..."


def _histogram(data, path) -> dict:
    """``{"512": 120}`` or ``[[512, 120]]`` as ``{512: 120}`` (a length given twice: its counts added)."""
    pairs = data.items() if isinstance(data, dict) else data
    out: dict = {}
    try:
        for k, v in pairs:
            key = _digits(k.strip()) if isinstance(k, str) else None
            key = k if key is None else key
            if key in out:  # added exactly (no sum of finite counts overflows); a bad count kept, to be refused
                before, now = _count(out[key]), _count(v)
                v = out[key] if before is None else v if now is None else before + now
            out[key] = v  # (lengths and counts checked in Lengths.of)
    except (TypeError, ValueError):
        raise _refused(f"{path}: a JSON histogram is {{\"length\": count, ...}} or [[length, count], ...]") \
            from None
    return out
