"""Known silent defects of attention kernels, checked against what a report ran and what its deployment meets.

The table is a data file of the package (``defects.json``): each row a backend, the torch and cuDNN versions and
GPU architectures it was reported on, the calls it hits (a predicate over a call's shape and mask), the
direction that goes wrong (``forward``, ``backward``, ``generate``) and the public references. ``check`` reads a
result's attention call shapes (as the profiled pass recorded them) and the report's environment, and, for a
sweep or a length mix, every length the deployment meets (a generate's decode steps: every key length from the
prompt's to the prompt plus its new tokens). Each row that applies is a ``DefectMatch`` of one of three levels:

- ``wrong``: the versions, the GPU, the direction the workload runs and a call it meets all match: the backend
  is never recommended (``ranking``), and the answer's first lines say why;
- ``unrun``: everything matches but the direction: the workload runs no backward (or generates nothing), so it
  does not decide this answer, and the caution says where it would;
- ``nearby``: versions, GPU and direction match, and the call's structure too, but none of the lengths it meets:
  a caution for deployments that meet other lengths.

Conditions that depend on the data (a row's log-sum-exp) are not checked: a matching row says the backend may
go wrong there, which for a silent NaN is reason enough. Torch-free: ``attnswitch defects`` lists the table
before torch is imported.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import resources

from . import candidate, catalog
from ._versions import version_of
from .kinds import kind_of
from .options import OptionError

__all__ = ["Defect", "DefectMatch", "Stack", "Met", "Listed", "table", "load", "asked", "stack_of", "applies_to",
           "met_calls", "check", "cautions", "describe_when", "version_of", "cudnn_version", "in_range", "arch_of",
           "arch_name", "listing", "listing_lines", "LEVELS", "DIRECTIONS"]

#: how a matching row bears on a report: never recommended; another direction than the workload runs; other
#: lengths than it meets
LEVELS = ("wrong", "unrun", "nearby")
DIRECTIONS = ("forward", "backward", "generate")
#: predicate keys about lengths (a deployment meets other lengths than were measured)
_LENGTH_KEYS = ("q_len", "kv_len", "kv_len_mod")
_KEYS = (*_LENGTH_KEYS, "kv_heads_below", "head_dim", "mask", "window", "dtype")
_ARCHES = {"sm80": "Ampere (A100)", "sm89": "Ada (L4, L40S)", "sm90": "Hopper (H100, H200)",
           "sm100": "Blackwell (B200)", "sm103": "Blackwell (B300)", "sm120": "Blackwell (RTX 50)"}


@dataclass(frozen=True)
class Defect:
    """One row of the table (``defects.json``). ``torch`` and ``cudnn``: version ranges (``>=2.11,<2.14``;
    None: any); ``gpus``: architectures (``sm90``); ``when``: the calls it hits (``_KEYS``: ``q_len``, ``kv_len``,
    ``kv_len_mod`` [m, r], ``kv_heads_below``, ``head_dim`` [...], ``mask``, ``window``, ``dtype`` [...]);
    ``also``: what it needs besides that no shape shows."""

    id: str
    backend: str
    direction: str
    effect: str
    torch: str | None
    cudnn: str | None
    gpus: tuple[str, ...]
    when: Mapping
    refs: tuple[str, ...]
    also: str = ""
    note: str = ""

    @property
    def versions(self) -> str:
        parts = [f"torch {self.torch}" if self.torch else "", f"cuDNN {self.cudnn}" if self.cudnn else "",
                 ", ".join(self.gpus)]
        return ", ".join(p for p in parts if p) or "any versions"


@dataclass(frozen=True)
class DefectMatch:
    """A row of the table that bears on one backend of a report (``level``, one of ``LEVELS``). ``lengths``: the
    key lengths of the calls it hits that the workload or its deployment meets (``wrong``, ``unrun``);
    ``when``: the calls it hits, in words; ``versions``: what it was matched against here."""

    id: str
    backend: str
    direction: str
    effect: str
    level: str
    when: str
    versions: str = ""
    lengths: tuple[int, ...] = ()
    refs: tuple[str, ...] = ()
    also: str = ""

    @property
    def blocks(self) -> bool:
        """Whether it makes the backend wrong where the report's workload runs: never recommended."""
        return self.level == "wrong"


def _row(d: Mapping) -> Defect:
    unknown = set(d.get("when") or {}) - set(_KEYS)
    if unknown or d.get("direction") not in DIRECTIONS:
        raise ValueError(f"defects.json: row {d.get('id')!r}: unknown key(s) {sorted(unknown)} or direction "
                         f"{d.get('direction')!r}")
    return Defect(d["id"], d["backend"], d["direction"], d["effect"], d.get("torch"), d.get("cudnn"),
                  tuple(d.get("gpus") or ()), dict(d.get("when") or {}), tuple(d.get("refs") or ()),
                  d.get("also") or "", d.get("note") or "")


def load(text: str) -> tuple[Defect, ...]:
    """The rows of a table in ``defects.json``'s form."""
    return tuple(_row(d) for d in json.loads(text)["defects"])


@functools.lru_cache(maxsize=1)
def table() -> tuple[Defect, ...]:
    """The package's table of known defects."""
    return load(resources.files("attnswitch").joinpath("defects.json").read_text(encoding="utf-8"))


# -- versions and the GPU ---------------------------------------------------------------------------

def _cmp(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = max(len(a), len(b))
    a, b = a + (0,) * (n - len(a)), b + (0,) * (n - len(b))
    return (a > b) - (a < b)


_OPS = {">=": lambda c: c >= 0, ">": lambda c: c > 0, "<=": lambda c: c <= 0, "<": lambda c: c < 0,
        "==": lambda c: c == 0}


def in_range(version: tuple[int, ...] | None, spec: str | None) -> bool:
    """Whether ``version`` is within ``spec`` (``>=9.20,<9.21``; None: any, even an unknown version)."""
    if not spec:
        return True
    if version is None:
        return False
    for clause in spec.split(","):
        m = re.fullmatch(r"\s*(>=|<=|==|>|<)\s*([\d.]+)\s*", clause)
        if m is None:
            raise ValueError(f"defects.json: a version range is like '>=2.11,<2.14', not {spec!r}")
        if not _OPS[m.group(1)](_cmp(version, version_of(m.group(2)))):
            return False
    return True


@dataclass(frozen=True)
class Stack:
    """What a defect's versions are matched against: torch, cuDNN, the GPU's architecture (``sm90``) and name."""

    torch: tuple[int, ...] | None = None
    cudnn: tuple[int, ...] | None = None
    arch: str | None = None
    gpu: str | None = None

    def text(self) -> str:
        show = lambda v: ".".join(map(str, v))  # noqa: E731
        parts = [f"torch {show(self.torch)}" if self.torch else "", f"cuDNN {show(self.cudnn)}" if self.cudnn else "",
                 f"{self.gpu} ({self.arch})" if self.gpu and self.arch else (self.arch or "")]
        return ", ".join(p for p in parts if p)


def arch_of(capability) -> str | None:
    """``"9.0"`` (a compute capability) -> ``sm90``; an ``smNN`` name as it is."""
    if not capability:
        return None
    text = str(capability).strip().lower()
    if re.fullmatch(r"sm_?\d+[a-z]?", text):  # sm90, sm_90, and nvcc's sm_90a (the same GPUs as sm90)
        return re.sub(r"[a-z]$", "", text.replace("_", "")[2:]).join(("sm", ""))
    m = re.fullmatch(r"(\d+)\.(\d+)", text)
    return f"sm{m.group(1)}{m.group(2)}" if m else None


def asked(torch=None, cudnn=None, arch=None) -> Stack:
    """The stack a listing is asked for (each None: not given), each given value checked: ``OptionError``
    naming the parameters that are not a version (``2.13.0``; cuDNN ``9.20`` or ``92000``) or an architecture
    (``sm90``, ``9.0``)."""
    stack = Stack(version_of(torch), cudnn_version(cudnn), arch_of(arch))
    bad = [name for name, given, got in (("torch", torch, stack.torch), ("cudnn", cudnn, stack.cudnn),
                                         ("arch", arch, stack.arch)) if given is not None and got is None]
    if bad:
        raise OptionError(", ".join("{" + b + "}" for b in bad) + ": a version is like 2.13.0 (cuDNN: 9.20 or 92000), "
                          "an architecture like sm90 or 9.0")
    return stack


def cudnn_version(value) -> tuple[int, ...] | None:
    """A cuDNN version as given: ``9.20`` (dotted) or its integer ``92000`` / ``8907``; None for anything else
    (``920`` and ``0`` are neither: read as an integer, 920 would be 0.9.20)."""
    text = str(value).strip() if value is not None else ""
    if text.isdigit():
        return version_of(int(text)) if int(text) >= 1000 else None
    return version_of(value) if "." in text else None


def stack_of(environment: Mapping) -> Stack:
    """The stack a report (or this process: ``env.environment()``) ran on."""
    return Stack(version_of(environment.get("torch")), version_of(environment.get("cudnn")),
                 arch_of(environment.get("compute_capability")), environment.get("gpu"))


def applies_to(d: Defect, stack: Stack) -> str | None:
    """None where ``d``'s versions and GPUs take ``stack``; else why not, in words."""
    if d.gpus and stack.arch not in d.gpus:
        return f"GPU {stack.arch or 'none'}, not {', '.join(d.gpus)}"
    if not in_range(stack.torch, d.torch):
        return f"torch {'.'.join(map(str, stack.torch or ())) or 'unknown'}, not {d.torch}"
    if not in_range(stack.cudnn, d.cudnn):
        return f"cuDNN {'.'.join(map(str, stack.cudnn or ())) or 'none'}, not {d.cudnn}"
    return None


# -- calls ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Met:
    """An attention call a workload or its deployment meets: its query length, the range of key lengths its
    steps span (``kv``: a decode step's key length grows by one per token), and what else a predicate reads."""

    q_len: int
    kv: tuple[int, int]
    heads: int
    kv_heads: int
    head_dim: int
    dtype: str
    mask: bool
    window: int | None
    measured: bool = True


def met_calls(shapes: Iterable, deployed: Sequence[int] = (), new_tokens: int | None = None) -> list[Met]:
    """The calls of the recorded ``shapes`` (``peak.AttnShape``), and the same calls at every ``deployed``
    length: a prefill's (or a training step's) with that many queries and keys, a decode step's with one query
    against every key length from the prompt's plus one to the prompt's plus ``new_tokens``."""
    out: dict[Met, None] = {}
    for s in shapes:
        base = dict(heads=s.heads, kv_heads=s.kv_heads, head_dim=s.head_dim, dtype=s.dtype, mask=s.mask,
                    window=s.window)
        out[Met(s.q_len, (s.kv_len_min, s.kv_len), **base)] = None
        for n in deployed:
            if s.one_row:
                out[Met(1, (n + 1, n + max(1, new_tokens or 1)), **base, measured=False)] = None
            else:
                out[Met(n, (n, n), **base, measured=False)] = None
    return list(out)


def _first_in(lo: int, hi: int, mod: int, rem: int) -> int | None:
    x = lo + (rem - lo) % mod
    return x if x <= hi else None


def _length(when: Mapping, m: Met) -> int | None:
    """The key length of ``m`` that the length keys of ``when`` hit (its longest where they name none); None:
    none of its lengths."""
    if "q_len" in when and m.q_len != when["q_len"]:
        return None
    lo, hi = m.kv
    if "kv_len" in when:
        if not lo <= when["kv_len"] <= hi:
            return None
        lo = hi = when["kv_len"]
    if "kv_len_mod" in when:
        mod, rem = when["kv_len_mod"]
        return _first_in(lo, hi, mod, rem)
    return hi


def _structure(when: Mapping, m: Met) -> bool:
    """Whether ``m`` holds ``when``'s conditions other than lengths."""
    return (("kv_heads_below" not in when or m.kv_heads < when["kv_heads_below"])
            and ("head_dim" not in when or m.head_dim in when["head_dim"])
            and ("mask" not in when or m.mask == when["mask"])
            and ("window" not in when or bool(m.window) == when["window"])
            and ("dtype" not in when or m.dtype in when["dtype"]))


def describe_when(when: Mapping) -> str:
    """A predicate in words: ``key length ≡ 64 (mod 128), with a mask``."""
    parts = []
    if "q_len" in when:
        parts.append("one query row" if when["q_len"] == 1 else f"{when['q_len']} queries")
    if "kv_len" in when:
        parts.append(f"{when['kv_len']} keys")
    if "kv_len_mod" in when:
        mod, rem = when["kv_len_mod"]
        parts.append(f"key length ≡ {rem} (mod {mod})")
    if "kv_heads_below" in when:
        parts.append(f"fewer than {when['kv_heads_below']} key/value heads")
    if "window" in when:
        parts.append("a sliding window" if when["window"] else "no sliding window")
    if "head_dim" in when:
        parts.append("head dim " + "/".join(map(str, when["head_dim"])))
    if "dtype" in when:
        parts.append("/".join(when["dtype"]))
    if "mask" in when:
        parts.append("with a mask" if when["mask"] else "no mask")
    return ", ".join(parts) or "every call"


def _runs(direction: str, kind) -> bool:
    """Whether a workload of ``kind`` (``kinds.Kind``) runs calls in ``direction``."""
    if direction == "backward":
        return kind.grads
    if direction == "generate":
        return kind.generates or kind.name == "decode"
    return True


def _backend_at(result, q_len: int) -> str | None:
    """The built-in backend whose kernels a result's call with ``q_len`` queries ran: its own, a policy's phase's,
    or, for SDPA's own choice, the family its ops and kernels name."""
    c = candidate.parse(result.backend)
    name = c.policy.choose(q_len) if c.policy is not None else c.backend
    if name == "auto":
        return catalog.kernel_family(tuple(result.attn_ops) + tuple(result.attn_kernel_names))
    return name


def _match(d: Defect, result, calls: list[Met], kind) -> tuple[str, tuple[int, ...]] | None:
    """``(level, lengths)`` of a row whose versions hold, for ``result``'s calls; None: it does not bear."""
    mine = [m for m in calls if _backend_at(result, m.q_len) == d.backend and _structure(d.when, m)]
    if not mine:
        return None
    hits = [(n, m.measured) for m in mine if (n := _length(d.when, m)) is not None]
    runs = _runs(d.direction, kind)
    if hits:
        return ("wrong" if runs else "unrun"), tuple(sorted({n for n, _ in hits}))
    if runs and any(k in d.when for k in _LENGTH_KEYS):
        return "nearby", ()
    return None


def check(result, environment: Mapping, workload: Mapping | None, deployed: Sequence[int] = (), shapes=None,
          rows: Iterable[Defect] | None = None) -> tuple[DefectMatch, ...]:
    """The rows of the table (``rows``: another table) that bear on one result: its backend, the report's
    ``environment``, the calls it ran (``shapes``: those of another result of the same model, where its own were
    not recorded, as under ``torch.compile``) and every ``deployed`` length."""
    if not getattr(result, "ok", False):
        return ()
    stack = stack_of(environment)
    kind = kind_of(workload)
    new = (workload or {}).get("new_tokens")
    new = max(new) if isinstance(new, (list, tuple)) and new else new
    calls = met_calls(shapes if shapes is not None else result.attn_shapes, deployed, new)
    out = []
    for d in (table() if rows is None else rows):
        if applies_to(d, stack) is not None:
            continue
        found = _match(d, result, calls, kind)
        if found is not None:
            level, lengths = found
            out.append(DefectMatch(d.id, d.backend, d.direction, d.effect, level, describe_when(d.when),
                                   stack.text(), lengths, d.refs, d.also))
    return tuple(out)


# -- words ------------------------------------------------------------------------------------------

def _lengths_text(lengths: tuple[int, ...]) -> str:
    shown = ", ".join(map(str, lengths[:4]))
    return shown + (f" and {len(lengths) - 4} more" if len(lengths) > 4 else "")


def _who(name: str, m: DefectMatch) -> str:
    return f"`{name}`" + (f" (it runs {m.backend} here)" if name != m.backend and candidate.parse(name).backend
                          in (None, "auto") else "")


def _line(name: str, m: DefectMatch) -> str:
    what = f"{m.id} ({m.direction}: {m.effect}) holds for {m.versions} at {m.when}" + (f", given {m.also}" if m.also
                                                                                      else "")
    if m.level == "wrong":
        return f"{_who(name, m)} is not recommended: {what}; met here at key lengths {_lengths_text(m.lengths)}."
    if m.level == "unrun":
        runs = {"backward": "runs no backward", "generate": "generates nothing"}.get(m.direction, "does not run it")
        return (f"Caution on {_who(name, m)}: {what}; met here at key lengths {_lengths_text(m.lengths)}, but this "
                f"workload {runs}, so it does not decide this answer; a {m.direction} with `{name}` at these lengths "
                "would meet it.")
    return (f"Caution on {_who(name, m)}: {what}, lengths this comparison did not meet: measure at the lengths you "
            "deploy.")


def cautions(results: Iterable) -> list[str]:
    """One line per backend and matching row (the lengths of every shape of a sweep together), those that make
    a backend wrong first."""
    merged: dict[tuple[str, str, str], DefectMatch] = {}
    for b in results:
        for m in getattr(b, "defects", ()) or ():
            key = (b.backend, m.id, m.level)
            old = merged.get(key)
            merged[key] = m if old is None else DefectMatch(
                **{**old.__dict__, "lengths": tuple(sorted(set(old.lengths) | set(m.lengths)))})
    # a backend wrong at one shape is wrong for the deployment: its other levels are said no more
    wrong = {(name, i) for name, i, level in merged if level == "wrong"}
    keep = [(k, m) for k, m in merged.items() if k[2] == "wrong" or (k[0], k[1]) not in wrong]
    keep.sort(key=lambda km: LEVELS.index(km[0][2]))
    return [_line(name, m) for (name, _, _), m in keep]


@dataclass(frozen=True)
class Listed:
    """One row of ``attnswitch defects``: the defect, and whether it applies to a stack (``why_not``: None)."""

    defect: Defect
    why_not: str | None = field(default=None)


def listing(stack: Stack, rows: Iterable[Defect] | None = None) -> list[Listed]:
    """Every row of the table, with whether its versions and GPUs take ``stack``."""
    return [Listed(d, applies_to(d, stack)) for d in (table() if rows is None else rows)]


def arch_name(arch: str) -> str:
    return _ARCHES.get(arch, arch)


def listing_lines(stack: Stack, rows: Iterable[Defect] | None = None) -> list[str]:
    """``attnswitch defects``: every row of the table, what it hits, its references, and whether it applies to
    ``stack``; the rows that apply first."""
    listed = sorted(listing(stack, rows), key=lambda x: x.why_not is not None)
    here = stack.text() or "no GPU, no cuDNN"
    n = sum(x.why_not is None for x in listed)
    lines = [f"Known defects: {len(listed)} in attnswitch's table; {n} apply to {here}.", ""]
    for x in listed:
        d = x.defect
        gpus = ", ".join(arch_name(a) for a in d.gpus) or "any GPU"
        versions = ", ".join(p for p in (f"torch {d.torch}" if d.torch else "", f"cuDNN {d.cudnn}" if d.cudnn else "")
                             if p) or "any version"
        lines += [f"{d.id}  [{'applies here' if x.why_not is None else 'not here: ' + x.why_not}]",
                  f"  {d.backend}, {d.direction}: {d.effect}",
                  f"  on {gpus}, {versions}; calls with {describe_when(d.when)}"
                  + (f"; also needs {d.also} (not checked)" if d.also else ""),
                  *([f"  {d.note}"] if d.note else []), *(f"  {r}" for r in d.refs), ""]
    lines.append("A report checks the rows against its own versions, GPU and the calls it measured (and every length "
                 "a sweep or a length mix deploys): a backend a row makes wrong there is never recommended.")
    return lines
