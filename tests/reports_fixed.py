"""Results and reports built from fixed per-round times (no clock), decided as ``compare`` and a sweep decide
them: the timing rounds each test states are what the decision reads."""

from attnswitch.decision import decide, decide_sweep
from attnswitch.profiling.rounds import Timing
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import ranked, verdict
from attnswitch.results import BackendResult, Report, SweepPoint

FLASH_OP = ("aten::_scaled_dot_product_flash_attention",)
#: the rounds of an ``eager`` (8 ms) decidedly faster than a backend of 10 ms
EAGER = [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]


def fixed(name, per_round, **kw):
    t = Timing(samples=list(per_round), units=[[x] for x in per_round])
    return with_timing(BackendResult(name, "ok", timer="cuda-events", attn_calls=kw.pop("attn_calls", 4.0), **kw), t)


def report_of(results, workload=None):
    workload = {"mode": "prefill", "batch": 2, "seq": 64, "dtype": "bf16", **(workload or {})}
    d, v = decide(results, verdict(results), workload, {"torch": "2.11"})
    return Report(tuple(ranked(results, v)), {"torch": "2.11"}, workload, {}, model="m", ranking=v.order, decision=d)


def sweep_report(shapes, workload=None):
    """A sweep's report as ``compare_sweep`` builds it: each shape decided as ``compare`` decides it."""
    workload = {"mode": "prefill", "batch": 2, "dtype": "bf16", **(workload or {})}
    points, verdicts, last = [], [], None
    for seq, rs in shapes:
        d, v = decide(rs, verdict(rs), {**workload, "seq": seq}, {"torch": "2.11"})
        last = tuple(ranked(rs, v))
        points.append(SweepPoint(workload["batch"], seq, last, v.order, d.ties))
        verdicts.append(verdict(last))
    wl = {**workload, "seq": shapes[-1][0], "description": "sweep"}
    d, v, points = decide_sweep(points, verdicts, list(last), wl, {"torch": "2.11"}, None, [], ())
    return Report(tuple(ranked(list(last), v)), {"torch": "2.11"}, wl, {}, model="m", ranking=v.order, decision=d,
                  sweep=points)


def _steady(ms):
    return [ms * (1 + d) for d in (0.0, 0.001, -0.001, 0.0, 0.002, -0.002)]
