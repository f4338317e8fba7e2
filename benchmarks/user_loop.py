"""Does ``compare`` report the step a user's own loop takes? Every backend's ranked step against a plain loop of
steps under ``attnswitch.backend(...)``, on the same model and inputs, in the same process.

    python -m benchmarks.user_loop OUT --only=device-bound       # a GPU: one shape x prefill, decode, train
    python -m benchmarks.user_loop OUT --only=host-bound         # the two others, one call each
    python -m benchmarks.user_loop OUT --only=gemma3
    python -m benchmarks.user_loop OUT --smoke    # a CPU: tiny models, the same logic, no verdict on the numbers
    python -m benchmarks.user_loop OUT --only=host-bound/train,gemma3   # some of the checks
    python -m benchmarks.user_loop OUT --only=decode --turn=5   # compare timing 5 steps per backend per round
    python -m benchmarks.user_loop OUT --total=250    # no check started that would not end within 250 s
    python -m benchmarks.user_loop --judge OUT...     # stored runs judged again by these rules
    python -m benchmarks.user_loop --judge A B C --rows-into=rows.json   # and their rows in one file

For each shape and workload (``check``): a user's loop of every backend (``user_loop``) before the compare and after
it, never inside it, and ``compare`` of every backend (its defaults, numerics left out: they run no timed step, and
their float32 copy of the model costs minutes here; ``--turn=N``: N timed steps per backend per round instead of the
default's). A row per candidate the compare ranked: ``compare_ms`` (its reported step), ``loop_ms`` (the median of
the loop's blocks, before and after pooled) and their ``ratio``. Then, side by side (``paired``), in each of 6-24
rounds (as many as fit ``PAIRED_S``) one turn of compare's timing rounds and one block of the loop per backend,
seconds apart: ``paired_ratio``, the median over rounds of the turn's step over the block's, with its 95 %
interval. A row's ``verdict`` (``verdict``) is ``within`` the band only where the evidence says so: the
side-by-side interval inside the band and, where the loops before and after agree within it and the compare
shows no change of the host's speed (its first and last shared rounds within ``ranking.BUSY_DRIFT``; the 90th
over the 10th percentile of the round medians within 3 %, this candidate's and every candidate's:
``round_spread``, ``check_spread``; no busy sign in its host record: ``host_busy``), the reported step over the
loops too; ``outside`` where either clears the
band; else ``undecided`` (a steadier host decides it). On a shared machine the host's speed moves by up to 2x
within a minute, and loops taken before and after a compare then cannot judge the reported step to 3 %.
``checked`` is the figure shown: the side-by-side one, or the reported step's ratio where farther from 1 and
the loops can judge it.

The shapes (``SHAPES``): a Qwen3-shaped model (6 layers, hidden 2048, 16 query and 8 key-value heads of 128) at
sizes where the GPU sets the step (``device-bound``) and where the host nearly or wholly does (``host-bound``: B2
S2048 training, a step the compare once reported 8-13 % slower than a user's loop, and B1 prefill and decode), and a
Gemma-3-shaped one (head dim 256, one key-value head, five sliding-window layers to one full). Each check has a time
bound (``Shape.bound_s``) and the whole run one too (``TOTAL_S``): a check that would not end within it is not
started, and one that runs past its bound is stopped and recorded as failed.

Writes ``OUT/user_loop_check.json`` (the rows) and ``OUT/user_loop_run.json`` (environment, each check's status,
seconds, the compare's settings and samples, every loop's blocks, device allocations per phase); exits 1 where a
check failed or, off ``--smoke``, where a row is outside ``LOW``-``HIGH``, and 3 where rows are undecided (none
outside).
"""

from __future__ import annotations

import contextlib
import gc
import json
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

import attnswitch
from attnswitch.comparison import compare
from attnswitch.device import device_of
from attnswitch.env import environment
from attnswitch.profiling.capture import steps_per_round
from attnswitch.ranking import BUSY_DRIFT, busy_signs
from attnswitch.request import FIRST_ROUNDS, ITERS
from attnswitch.stats import median, paired_margin, percentile
from attnswitch.switch import runs_as_auto
from attnswitch.workload import make_workload

__all__ = ["Shape", "SHAPES", "SMOKE", "user_loop", "check", "run", "main", "folder_main", "bounded", "OverTime",
           "LOW", "HIGH", "TOTAL_S", "LOOP_S", "MAX_REPEATS", "PAIRED_ROUNDS", "PAIRED_S", "MAX_PAIRED_ROUNDS",
           "paired", "users_switch", "checked", "verdict", "judged", "judge", "round_spread", "STEADY_SPREAD",
           "model_of"]

#: the band every ratio must fall in
LOW, HIGH = 0.97, 1.03
#: the whole run's time bound (s): a check that would not end within it is not started
TOTAL_S = 520.0
#: rounds of compare's turn and the user's loop side by side (``paired``): at least 6, the fewest a 95 % interval
#: needs, and as many more as fit ``PAIRED_S`` seconds (``MAX_PAIRED_ROUNDS`` at most): a host-bound step of a few
#: milliseconds moves by 5-10 % from one turn to the next on a shared host, and only more rounds narrow its median
PAIRED_ROUNDS = 6
PAIRED_S = 20.0
MAX_PAIRED_ROUNDS = 24


#: the most the reported step's own timing rounds may spread (90th over 10th percentile of their medians) for
#: loops taken before and after the compare to judge it: a step that moved by more while it was measured is not
#: one figure to the band's precision, and only its turns side by side with a loop's blocks can judge it
STEADY_SPREAD = HIGH


def _steady(row: dict) -> bool:
    """Can the loops before and after the compare judge its reported step? They agree within the band, and the
    compare shows no change of the host's speed: neither between its first and last shared rounds
    (``round_drift``, ``ranking.BUSY_DRIFT``), nor across this candidate's rounds (``round_spread``), nor across
    any candidate's (``check_spread``: one dropped after the first rounds saw only those, while the host's speed
    moved later), nor in the compare's own reading of the host (``host_busy``: ``ranking.busy_signs`` of the
    probes around its rounds and of its rounds' drift). Not where any is unknown."""
    drift, spread, widest = row.get("round_drift"), row.get("round_spread"), row.get("check_spread")
    return _loops_agree(row) and drift is not None and drift <= BUSY_DRIFT and spread is not None and \
        spread <= STEADY_SPREAD and widest is not None and widest <= STEADY_SPREAD and row.get("host_busy") == []


def _loops_agree(row: dict) -> bool:
    before, after = row.get("loop_before_ms"), row.get("loop_after_ms")
    return bool(before and after and LOW <= after / before <= HIGH)


def _interval(row: dict) -> tuple[float, float] | None:
    """The side-by-side figure's 95 % interval, where it was measured over enough rounds to be one."""
    low, high = row.get("paired_low"), row.get("paired_high")
    if row.get("paired_ratio") is None or low is None or high is None or \
            (row.get("paired_rounds") or 0) < PAIRED_ROUNDS:
        return None
    return low, high


def checked(row: dict) -> float:
    """The figure shown for a row: compare's turn over the user's loop side by side where measured and, where
    the loops before and after can judge the reported step (``_steady``), whichever of that and the reported
    step over them is farther from 1; the reported step's ratio alone where nothing was measured side by side."""
    if row.get("paired_ratio") is None:
        return row["ratio"]
    figures = [row["paired_ratio"], row["ratio"]] if _steady(row) else [row["paired_ratio"]]
    return max(figures, key=lambda x: max(x, 1 / x))


def verdict(row: dict) -> str:
    """``within`` the band, ``outside`` it, or ``undecided``: what the evidence decides, never more.

    - Nothing measured side by side: the reported step over the loops decides.
    - Side by side over too few rounds for a 95 % interval: ``undecided``.
    - Where the loops can judge the reported step (``_steady``): ``outside`` where it is outside the band;
      else the side-by-side interval decides: inside the band ``within``, clear of it ``outside``, across an
      edge ``undecided``.
    - Where they cannot: the interval decides as above, except that a reported step outside the band while the
      loops before and after it agree makes ``within`` ``undecided`` (the two measures disagree)."""
    ratio_in = LOW <= row["ratio"] <= HIGH
    if row.get("paired_ratio") is None:
        return "within" if ratio_in else "outside"
    interval = _interval(row)
    if interval is None:
        return "undecided"
    if _steady(row) and not ratio_in:
        return "outside"
    low, high = interval
    if high < LOW or low > HIGH:
        return "outside"
    if LOW <= low and high <= HIGH:
        return "within" if ratio_in or not _loops_agree(row) else "undecided"
    return "undecided"


def round_spread(rounds) -> float | None:
    """The 90th over the 10th percentile of a candidate's round medians (``BackendResult.time_rounds_ms``:
    the rounds it sat out are empty); None with fewer than two rounds."""
    meds = [median(r) for r in rounds if r]
    if len(meds) < 2:
        return None
    return round(percentile(meds, 90) / percentile(meds, 10), 4)


def _host_moved(host, rounds: dict | None) -> dict:
    """A check's fields on the host's speed through its compare, the same in each of its rows, from what the run
    recorded: ``check_spread``, the widest ``round_spread`` of its candidates (``rounds``: each one's round
    samples; None: not recorded), and ``host_busy``, the kinds of ``ranking.busy_signs`` its host record shows
    (the probes of a fixed task before and after the rounds, and ``round_drift``: none, ``[]``; None where no
    probe was recorded). A field the run has nothing for is left out."""
    out = {}
    if rounds is not None:
        spreads = [x for x in (round_spread(r or []) for r in rounds.values()) if x is not None]
        out["check_spread"] = max(spreads, default=None)
    if isinstance(host, dict):
        probed = bool(host.get("probe_before_ms")) and bool(host.get("probe_after_ms"))
        out["host_busy"] = sorted(busy_signs(host)) if probed else None
    return out


def _side_by_side(pairs) -> dict:
    """A row's side-by-side fields: the median over rounds of compare's turn over the loop's block, and its 95 %
    interval (``stats.paired_margin``)."""
    if not pairs:
        return {}
    m = paired_margin([[a] for a, _ in pairs], [[b] for _, b in pairs], "loop")
    return {"paired_ratio": round(m.ratio, 4), "paired_low": round(m.low, 4), "paired_high": round(m.high, 4),
            "paired_rounds": m.pairs}


#: seconds of the user's loop of all backends, before and after the compare each (blocks per backend from it)
LOOP_S = 4.0
MAX_REPEATS = 20
#: steps per block of the user's loop (after one untimed step)
STEPS = 5
WORKLOADS = ("prefill", "decode", "train")
GPU_BACKENDS = ["flash", "cudnn", "efficient", "math", "naive-inplace", "auto"]
CPU_BACKENDS = ["math", "naive-inplace"]


@dataclass(frozen=True)
class Shape:
    """A model and, per workload, its ``(batch, seq)`` (decode: the cache's length); ``repeats``: blocks per
    backend in each of the loops before and after the compare; ``bound_s``: each of its checks' time bound."""

    name: str
    model: str
    sizes: dict[str, tuple[int, int]] = field(default_factory=dict)
    repeats: int = 3
    bound_s: float = 60.0


# bounds: a compare of six backends (up to 30 s of more rounds for those still tied), three loops and the rounds
# side by side; on an H200 the host-bound training check took 50 s, the Gemma-3 one 49 s with two loops and none
# side by side; on an H100 with 6-11 rounds side by side the checks took 44-68 s, but device-bound prefill 144 s and
# training 194 s (the host-bound and Gemma-3 shapes fit TOTAL_S, one call of the device tool each; the device-bound
# one takes two: --only=device-bound/prefill,device-bound/decode, then device-bound/train)
SHAPES = (
    Shape("device-bound", "qwen3", {"prefill": (8, 4096), "decode": (32, 8192), "train": (4, 4096)}, 2, 215.0),
    Shape("host-bound", "qwen3", {"prefill": (1, 1024), "decode": (1, 1024), "train": (2, 2048)}, 5, 110.0),
    Shape("gemma3", "gemma3", {"prefill": (4, 2048), "decode": (8, 2048), "train": (2, 2048)}, 4, 110.0),
)
SMOKE = tuple(Shape(s.name, s.model, {"prefill": (2, 16), "decode": (1, 16), "train": (2, 16)}, 1, 60.0)
              for s in SHAPES)


def model_of(kind: str, tiny: bool, device: str, dtype: torch.dtype) -> torch.nn.Module:
    """A random-weight model of ``kind`` (``qwen3``, ``gemma3``), full size or tiny (the smoke run's)."""
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig, Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(0)
    if kind == "qwen3":
        size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=16) if tiny else \
            dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=6, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128)
        model = Qwen3ForCausalLM(Qwen3Config(vocab_size=32000 if not tiny else 211, max_position_embeddings=16384,
                                             **size))
    else:
        size = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=1, head_dim=32, sliding_window=8,
                    layer_types=["sliding_attention", "full_attention"]) if tiny else \
            dict(hidden_size=1152, intermediate_size=6912, num_hidden_layers=6, num_attention_heads=4,
                 num_key_value_heads=1, head_dim=256, sliding_window=512,
                 layer_types=["sliding_attention"] * 5 + ["full_attention"])
        model = Gemma3ForCausalLM(Gemma3TextConfig(vocab_size=32000 if not tiny else 211,
                                                   max_position_embeddings=16384, **size))
    return model.to(device, dtype).eval()


@contextlib.contextmanager
def _grad_mode(model: torch.nn.Module, mode: str):
    """What a user's loop holds around its steps: training mode and gradients for training, no gradients else."""
    if mode != "train":
        with torch.no_grad():
            yield
        return
    model.train()
    try:
        yield
    finally:
        model.eval()


def _step(model: torch.nn.Module, mode: str):
    if mode == "train":
        def train(kw):
            loss = model(**kw).loss
            loss.backward()
            model.zero_grad(set_to_none=True)
        return train
    return lambda kw: model(**kw)


def user_loop(work, names: list[str], repeats: int, steps: int = STEPS) -> dict[str, list[float]]:
    """A user's loop per backend, outside attnswitch's measurement: ``attnswitch.backend(name, model=...)``
    (``users_switch``: none for ``auto`` on an sdpa model) entered once around one untimed step and ``steps`` steps
    back to back, their inputs made first (a decode step's copy of its cache each: a forward appends to it); CUDA
    events before the first timed step and after the last, the device synchronized once, at the end (the wall clock
    on a CPU); ms per step. The backends in turn, ``repeats`` times; garbage collected before each turn and not
    inside it, as ``timeit`` does (this process holds compare's parsed traces: a collection in a step would time
    them). A backend that cannot run here is left out (its error recorded as its value)."""
    model = work.model
    cuda = device_of(model).type == "cuda"
    step = _step(model, work.mode)
    out: dict[str, list] = {n: [] for n in names}
    gc.collect()
    freeze = gc.get_freeze_count() == 0  # (a caller's freeze, or collector turned off, is the caller's to undo)
    enabled = gc.isenabled()
    if freeze:
        gc.freeze()  # what lives now is not scanned again: a collection per turn costs no more than its garbage
    with _grad_mode(model, work.mode), contextlib.ExitStack() as stack:
        if freeze:
            stack.callback(gc.unfreeze)
        for _ in range(repeats):
            for name in [n for n in names if isinstance(out[n], list)]:
                args = list(work.calls(steps + 1))
                gc.collect()
                gc.disable()
                try:
                    with users_switch(name, model):
                        step(args[0])
                        out[name].append(_block(step, args[1:], cuda))
                except Exception as e:  # (a backend that cannot run these inputs: compare says why)
                    out[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
                finally:
                    if enabled:
                        gc.enable()
                    del args
    return out


def users_switch(name: str, model: torch.nn.Module):
    """What a user runs ``name`` with: ``attnswitch.backend(name, model=model)``; for ``auto`` where the model run
    unswitched runs what ``auto`` runs (``attnswitch.switch.runs_as_auto``), nothing: keeping the model's own
    attention needs no switch."""
    if name == "auto" and runs_as_auto(model):
        return contextlib.nullcontext()
    return attnswitch.backend(name, model=model)


def paired(work, names: list[str], turn: int, seconds: float = PAIRED_S, least: int = PAIRED_ROUNDS,
           most: int = MAX_PAIRED_ROUNDS, clock=time.perf_counter) -> dict[str, list[tuple[float, float]]]:
    """Compare's timed turn and a user's loop, side by side: in each round, for each backend in
    turn, one turn of the timing rounds compare's numbers come from (``capture.timed_rounds`` of that backend
    alone, two rounds of ``turn`` timed steps, the second's kept: the switch, an untimed step that does not wait
    for the device, the steps back to back) and one
    block of the user's loop (``user_loop``), in an order that alternates from round to round. Per backend,
    per round: (the turn's median step, the block's step), ms, taken seconds apart, so that the host's speed
    is the same for both, where compare's figure against loops taken before and after it carries whatever
    the speed did in between. Rounds: as many as fit ``seconds`` at the first round's length (``clock``; the
    turns' and blocks' garbage collections and untimed steps included), ``least`` to ``most``."""
    from attnswitch.profiling.capture import Target, timed_rounds

    target = Target.of(work)
    out: dict[str, list] = {n: [] for n in names}

    def turn_of(name: str) -> float:
        # two rounds, the second's turn kept: a candidate's first turn waits for the device after its untimed
        # step, its later ones go on from it, as in compare's rounds
        done = timed_rounds(target, [name], iters=2 * turn, rounds=2, budget_s=0).timings[name]
        return median(done.by_round[1])

    def block_of(name: str) -> float | None:
        got = user_loop(work, [name], 1)[name]
        return got[0] if isinstance(got, list) else None

    rounds, r = least, 0
    while r < rounds:
        t0 = clock()
        for name in [n for n in names if isinstance(out[n], list)]:
            if r % 2 == 0:
                a, b = turn_of(name), block_of(name)
            else:
                b, a = block_of(name), turn_of(name)
            if b is None:  # its loop failed here: no figure side by side (its row keeps the others)
                out[name] = None
                continue
            out[name].append((a, b))
        if r == 0:
            took = clock() - t0
            rounds = max(least, min(most, int(seconds / took))) if took > 0 else least
        r += 1
    return {n: v for n, v in out.items() if v}


def _block(step, args: list, cuda: bool) -> float:
    """``step`` on each of ``args`` back to back: ms per step."""
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for a in args:
            step(a)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / len(args)
    t0 = time.perf_counter()
    for a in args:
        step(a)
    return (time.perf_counter() - t0) * 1e3 / len(args)


class OverTime(BaseException):
    """A check ran past its time bound (a ``BaseException``: no handler of a backend's errors takes it)."""


@contextlib.contextmanager
def bounded(seconds: float):
    """``OverTime`` raised in the block once it has run ``seconds`` (SIGALRM; attnswitch's switch completes any
    change of its state that the exception interrupts)."""
    def over(signum, frame):
        raise OverTime(f"over its time bound of {seconds:.0f} s")

    previous = signal.signal(signal.SIGALRM, over)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def check(model, shape: Shape, mode: str, names: list[str], turn: int | None = None,
          loop_s: float = LOOP_S, paired_s: float = PAIRED_S) -> dict:
    """One shape and workload: a user's loop of every backend once (each warm at this shape; how long its steps take),
    the loop again (``before``), ``compare`` (``turn``: timed steps per backend per round, its default where
    None), and the loop of every candidate the compare ranked (``after``: its per-kind ones too). No loop runs
    inside the compare: one started from its progress line ran under the switch of its turn and its finiteness
    watch, and read up to 20 % slow. A row per ranked candidate: ``loop_ms`` the median of all its blocks
    (before and after pooled; a per-kind candidate's after alone, the compare names it: the host's speed drifts
    by tens of percent within a minute on a shared machine, so more blocks, spread over the run, make the
    steadier figure); blocks per backend from the steps' length (``_repeats``: ``loop_s`` seconds a loop). The
    compare's samples and each phase's device allocations (``cudaMalloc``s: a step that allocates device memory
    waits for it) go with the rows."""
    batch, seq = shape.sizes[mode]
    work = make_workload(model, batch=batch, seq=seq, mode=mode)
    warm = user_loop(work, names, 1)
    ok = [n for n in names if isinstance(warm[n], list)]
    repeats = _repeats(warm, ok, shape.repeats, loop_s)
    mallocs = _Mallocs()
    before = mallocs.of("loop before", lambda: user_loop(work, ok, repeats))
    steps = {} if turn is None else {"iters": FIRST_ROUNDS * turn, "rounds": FIRST_ROUNDS}
    report = mallocs.of("compare", lambda: compare(model, work, backends=names, check_numerics=False,
                                                   model_name=f"{shape.model} ({shape.name})", **steps))
    ranked = [b.backend for b in report.backends if b.ok and b.time_ms is not None]
    after = mallocs.of("loop after", lambda: user_loop(work, ranked, repeats))
    per_turn = turn or steps_per_round(ITERS, FIRST_ROUNDS)[-1]  # compare's timed steps per backend per round
    side = mallocs.of("side by side", lambda: paired(work, ranked, per_turn, paired_s))
    rows, loops = [], {}
    host = report.settings.get("host")
    moved = {"check_spread": None, "host_busy": None,
             **_host_moved(host, {b.backend: b.time_rounds_ms for b in report.backends if b.ok})}
    for b in report.backends:
        sets = {k: v.get(b.backend) for k, v in (("before", before), ("after", after), ("warm", warm))}
        loops[b.backend] = sets
        blocks = [x for k in ("before", "after") if isinstance(sets[k], list) for x in sets[k]]
        if b.backend not in ranked or not isinstance(sets["after"], list) or not sets["after"]:
            continue
        loop_ms = median(blocks)
        rows.append({"backend": b.backend, "shape": shape.name, "workload": mode, "compare_ms": round(b.time_ms, 4),
                     "loop_ms": round(loop_ms, 4), "ratio": round(b.time_ms / loop_ms, 4),
                     "loop_before_ms": round(median(sets["before"]), 4) if isinstance(sets["before"], list)
                     and sets["before"] else None,
                     "loop_after_ms": round(median(sets["after"]), 4), "blocks": len(blocks),
                     **_side_by_side(side.get(b.backend)),
                     "round_drift": (host or {}).get("round_drift"),
                     "round_spread": round_spread(b.time_rounds_ms), **moved,
                     "batch": batch, "seq": seq, **({"turn": turn} if turn else {})})
    left_out = {b.backend: (b.status, b.reasons[:1]) for b in report.backends if not b.ok}
    samples = {b.backend: {"samples": [round(x, 4) for x in b.time_samples_ms],
                           "rounds": [[round(x, 4) for x in r] for r in b.time_rounds_ms]}
               for b in report.backends if b.ok}
    return {"rows": rows, "loops": loops, "left_out": left_out, "workload": report.workload, "repeats": repeats,
            "side_by_side": {n: [[round(a, 4), round(b, 4)] for a, b in v] for n, v in side.items()},
            "turn": turn, "compare_samples": samples, "device_mallocs": mallocs.counts,
            "host": host, "time_s": report.settings.get("time_s")}


def _repeats(warm: dict, names: list[str], least: int, loop_s: float = LOOP_S) -> int:
    """Blocks per backend in each loop: as many as fill ``loop_s`` at the steps' length in the warm-up loop
    (an untimed step and ``STEPS`` timed ones a block), at least ``least``, at most ``MAX_REPEATS``."""
    per_repeat_s = sum((STEPS + 1) * median(warm[n]) for n in names) / 1e3
    if per_repeat_s <= 0:
        return least
    return max(least, min(MAX_REPEATS, int(loop_s / per_repeat_s)))


class _Mallocs:
    """Device allocations (``cudaMalloc``s, from the caching allocator's counters) in each phase of a check."""

    def __init__(self):
        self.counts: dict[str, int] = {}

    def of(self, phase: str, fn):
        cuda = torch.cuda.is_available() and torch.cuda.is_initialized()
        n0 = torch.cuda.memory_stats().get("num_device_alloc", 0) if cuda else 0
        out = fn()
        if cuda:
            self.counts[phase] = torch.cuda.memory_stats().get("num_device_alloc", 0) - n0
        return out


def _wanted(only: str | None, shapes) -> list[tuple[Shape, str]]:
    todo = [(s, m) for s in shapes for m in WORKLOADS]
    if not only:
        return todo
    keys = only.split(",")
    return [(s, m) for s, m in todo if s.name in keys or f"{s.name}/{m}" in keys or m in keys]


def run(out: Path, smoke: bool = False, only: str | None = None, total_s: float = TOTAL_S,
        turn: int | None = None) -> int:
    """Every check wanted, in turn, within the run's time bound; the files written after each; the exit code.
    ``turn``: the compare's timed steps per backend per round (its default where None)."""
    out.mkdir(parents=True, exist_ok=True)
    cuda = torch.cuda.is_available() and not smoke
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    names = GPU_BACKENDS if cuda else CPU_BACKENDS
    t_start, rows, checks, models = time.perf_counter(), [], [], {}
    meta = {"environment": environment(), "smoke": smoke, "band": [LOW, HIGH], "steps_per_block": STEPS,
            "turn": turn, "checks": checks}
    for shape, mode in _wanted(only, SMOKE if smoke else SHAPES):
        key, left = f"{shape.name}/{mode}", total_s - (time.perf_counter() - t_start)
        if left < shape.bound_s:
            checks.append({"check": key, "status": "not run", "why": f"{left:.0f} s of the run's bound left"})
            continue
        t0 = time.perf_counter()
        try:
            with bounded(shape.bound_s):
                if shape.model not in models:
                    models.clear()  # one model held at a time
                    models[shape.model] = model_of(shape.model, smoke, device, dtype)
                done = check(models[shape.model], shape, mode, names, turn,
                             *((0.5, 0.0) if smoke else (LOOP_S, PAIRED_S)))
            rows += [judged(r) for r in done.pop("rows")]
            checks.append({"check": key, "status": "ok", **done})
        except (OverTime, Exception) as e:
            checks.append({"check": key, "status": "failed", "error": f"{type(e).__name__}: {e}"})
        finally:
            if cuda:
                torch.cuda.synchronize()
                torch.cuda.empty_cache()
        checks[-1]["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"{key}: {checks[-1]['status']} in {checks[-1]['seconds']} s " +
              " ".join(f"{r['backend']} {r['ratio']:.3f}/{r['checked']:.3f}{_MARK[r['verdict']]}" for r in rows
                       if f"{r['shape']}/{r['workload']}" == key),
              flush=True)
        _write(out, rows, meta)
    meta["seconds"] = round(time.perf_counter() - t_start, 1)
    return _conclude(out, rows, meta, smoke)


#: after a row's figures in the progress lines: outside the band, or undecided
_MARK = {"within": "", "outside": " (outside)", "undecided": " (undecided)"}


def judged(row: dict) -> dict:
    """``row`` with the figure the band holds (``checked``) and its ``verdict``."""
    return {**row, "checked": round(checked(row), 4), "verdict": verdict(row)}


def _conclude(out: Path, rows: list, meta: dict, smoke: bool) -> int:
    """The run's status from its rows and checks, written and said; its exit code: 0 every row within the band,
    1 a row outside it or a check not ok, 3 rows undecided (and none outside)."""
    outside = [r for r in rows if r["verdict"] == "outside"]
    undecided = [r for r in rows if r["verdict"] == "undecided"]
    failed = [c.get("check", "(unnamed)") for c in meta["checks"] if c.get("status") != "ok"]
    status = "failed" if failed or (outside and not smoke) else "undecided" if undecided and not smoke else "ok"
    meta.update(outside_band=outside, undecided=undecided, failed_checks=failed, status=status)
    _write(out, rows, meta)
    print(f"user loop check: {status}, {len(rows)} rows, {len(outside)} outside {LOW}-{HIGH}, {len(undecided)} "
          f"undecided (the host's speed moved too much to tell), {len(failed)} checks not ok"
          + (f", {meta['seconds']} s" if meta.get("seconds") is not None else ""), flush=True)
    return {"ok": 0, "failed": 1, "undecided": 3}[status]


def judge(out: Path) -> int:
    """A stored run (``OUT/user_loop_check.json`` and ``OUT/user_loop_run.json``) judged again by this module's
    rules: each row's ``round_spread`` from its compare's rounds where the run did not record it, its check's
    ``check_spread`` and ``host_busy`` from what the run recorded (a row's stored value where it recorded
    nothing, else None), its ``checked`` figure and ``verdict``; both files rewritten; the exit code as
    ``run``'s."""
    rows = json.loads((out / "user_loop_check.json").read_text())
    meta = json.loads((out / "user_loop_run.json").read_text())
    rounds, moved = {}, {}
    for c in meta.get("checks") or []:
        if not isinstance(c, dict) or "check" not in c:
            continue
        samples = c.get("compare_samples")
        got = {n: v.get("rounds") for n, v in samples.items() if isinstance(v, dict)} \
            if isinstance(samples, dict) else None
        if c.get("status") == "ok" or c["check"] not in rounds:  # (a check's entry that ran wins)
            rounds[c["check"]], moved[c["check"]] = got or {}, _host_moved(c.get("host"), got)
    for i, r in enumerate(rows):
        key = f"{r['shape']}/{r['workload']}"
        if "round_spread" not in r:
            r = {**r, "round_spread": round_spread(rounds.get(key, {}).get(r["backend"]) or [])}
        r = {**r, **moved.get(key, {})}
        for name in ("check_spread", "host_busy"):
            r.setdefault(name, None)
        rows[i] = judged(r)
    return _conclude(out, rows, meta, bool(meta.get("smoke")))


def _write(out: Path, rows: list, meta: dict) -> None:
    (out / "user_loop_check.json").write_text(json.dumps(rows, indent=1))
    (out / "user_loop_run.json").write_text(json.dumps(meta, indent=1, default=str))


def folder_main(argv, doc: str, run_in) -> int:
    """A check's command line: ``OUT [--smoke] [--only=a,b]`` to ``run_in(Path(OUT), smoke=, only=)``; its
    ``doc`` and exit 2 without a folder."""
    args = list(sys.argv[1:] if argv is None else argv)
    only = next((a.split("=", 1)[1] for a in args if a.startswith("--only=")), None)
    folders = [a for a in args if not a.startswith("--")]
    unknown = [a for a in args if a.startswith("--") and not a.startswith("--only=") and a != "--smoke"]
    if len(folders) != 1 or unknown:  # (``--only gemma3`` would run every check, into a folder named gemma3)
        why = f"not an option here: {' '.join(unknown)}" if unknown else \
            f"one output folder, not {len(folders)} ({' '.join(folders)})" if folders else "an output folder is needed"
        print(f"{why} (options take their value after '=')\n\n{doc}", file=sys.stderr)
        return 2
    folder = folders[0]
    return run_in(Path(folder), smoke="--smoke" in args, only=only)


def _judge_main(args: list[str]) -> int:
    """``--judge OUT... [--rows-into=FILE]``: stored runs judged again, and their rows in one list."""
    into = [a.split("=", 1)[1] for a in args if a.startswith("--rows-into=")]
    folders = [Path(a) for a in args if a != "--judge" and not a.startswith("--rows-into=")]
    bad = [str(f) for f in folders if str(f).startswith("--") or not (f / "user_loop_run.json").is_file()
           or not (f / "user_loop_check.json").is_file()]
    why = f"not a folder of a stored run: {', '.join(bad)}" if bad else "no folder given" if not folders else \
        "the same folder twice" if len({f.resolve() for f in folders}) < len(folders) else \
        "one --rows-into=FILE at most" if len(into) > 1 or "" in into else None
    target = Path(into[0]).expanduser() if into and why is None else None
    if target is not None:  # refused before any run is rewritten
        inputs = {(f / n).resolve() for f in folders for n in ("user_loop_check.json", "user_loop_run.json")}
        wrong = "is a folder" if target.is_dir() else "is one of the runs' own files" \
            if target.resolve() in inputs else "its folder does not exist" if not target.parent.is_dir() else None
        why = f"--rows-into={into[0]} {wrong}" if wrong else None
    if why is not None:
        print(f"--judge takes folders of a stored run (user_loop_run.json and user_loop_check.json in each) and at "
              f"most one --rows-into=FILE: {why}\n\n{__doc__}", file=sys.stderr)
        return 2
    codes = [judge(f) for f in folders]
    if target is not None:  # the calls of one run (a call of the device tool each) as one list of rows
        rows = [r for f in folders for r in json.loads((f / "user_loop_check.json").read_text())]
        target.write_text(json.dumps(rows, indent=1))
        print(f"{len(rows)} rows of {len(folders)} runs in {target}: " + ", ".join(
            f"{sum(r['verdict'] == v for r in rows)} {v}" for v in ("within", "undecided", "outside")))
    return 1 if 1 in codes else 3 if 3 in codes else 0


def main(argv=None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if "--judge" in args:
        return _judge_main(args)
    try:
        turn = next((int(a.split("=", 1)[1]) for a in args if a.startswith("--turn=")), None)
        total = next((float(a.split("=", 1)[1]) for a in args if a.startswith("--total=")), TOTAL_S)
        if (turn is not None and turn < 1) or not 0 < total < float("inf"):
            raise ValueError
    except ValueError:
        print("--turn takes a whole number of steps (1 or more), --total a number of seconds above 0\n\n" + __doc__,
              file=sys.stderr)
        return 2
    return folder_main([a for a in args if not a.startswith(("--turn=", "--total="))], __doc__,
                       lambda out, **kw: run(out, turn=turn, total_s=total, **kw))


if __name__ == "__main__":
    sys.exit(main())
