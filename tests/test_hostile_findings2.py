"""Findings of a second hostile review: the decision (ties, eager, sweeps), its words, and the summary's chart.

Each test is named for the promise it shows broken, and fails until the product is fixed. Results are built
with fixed per-round times (no clock), as in ``test_decision.py`` and ``test_hostile_findings.py``.
"""

import dataclasses
import re

from test_hostile_findings import FLASH_OP, fixed, report_of, sweep_report

from attnswitch.decision import decide, decide_sweep
from attnswitch.defects import DefectMatch
from attnswitch.lengths import Lengths
from attnswitch.ranking import ranked, verdict
from attnswitch.results import BackendResult, GenerateStats, Numerics, Report, SweepPoint
from attnswitch.serving import serving_estimate

EAGER = [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]


def _failed(name):
    return BackendResult(name, "failed", reasons=("boom",))


def _sweep(shapes, workload=None):
    """A sweep over ``(batch, seq, results)`` shapes, each decided as ``compare`` decides it."""
    workload = {"mode": "prefill", "dtype": "bf16", **(workload or {})}
    points, verdicts, last = [], [], None
    for batch, seq, rs in shapes:
        d, v = decide(rs, verdict(rs), {**workload, "batch": batch, "seq": seq}, {"torch": "2.11"})
        last = tuple(ranked(rs, v))
        points.append(SweepPoint(batch, seq, last, v.order, d.ties))
        verdicts.append(verdict(last))
    wl = {**workload, "batch": shapes[-1][0], "seq": shapes[-1][1], "description": "sweep"}
    d, v, points = decide_sweep(points, verdicts, list(last), wl, {"torch": "2.11"}, None, [], ())
    return Report(tuple(ranked(list(last), v)), {"torch": "2.11"}, wl, {}, model="m", ranking=v.order, decision=d,
                  sweep=points)


def _behind_named(text):
    """The backends the "Slower than one tied for the fastest" line measures others against."""
    line = next((x for x in text.splitlines() if x.startswith("Slower than one tied for the fastest")), "")
    return re.findall(r"of `([^`]+)`'s time", line)


# -- eager, the model's own attention ---------------------------------------------------------------------------

def test_a_model_running_eager_keeps_it_where_eager_is_decidedly_faster_than_auto_the_only_candidate():
    # the model runs eager; only auto (SDPA's own choice) was asked beside it, and eager is 0.80x of its time
    r = report_of([fixed("eager", EAGER), fixed("auto", [10.0] * 6, attn_ops=FLASH_OP)],
                  {"attn_implementation": "eager"})
    # printed: "Use `auto` (ran flash): 10.000 ms per forward, the only backend here that ran (numerics not
    # checked)." / "The model's own attention (`eager`) ran faster than `auto`: 0.80x [0.79–0.82] of its time, but
    # not faster than every candidate." -- auto is the only candidate; the model is told to switch to a slower one
    assert r.decision.answer == "keep" and r.pick == "eager", r.recommendation.splitlines()[0]


def test_where_eager_is_picked_no_candidate_told_apart_from_it_is_said_not_to_be():
    # eager decidedly faster than every candidate; among the candidates flash is behind naive-inplace (the verdict
    # before eager was put first). Re-based on eager, the stale `behind` is still read.
    inplace = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
    flash = [10.3, 10.31, 10.29, 10.3, 10.32, 10.28, 10.3, 10.31]
    naive = [8.0, 12.5, 9.0, 11.5, 9.2, 10.9, 8.5, 9.4]
    eager = [7.0, 7.01, 6.99, 7.0, 7.02, 6.98, 7.0, 7.01]
    r = report_of([fixed("eager", eager), fixed("naive-inplace", inplace), fixed("flash", flash),
                   fixed("naive", naive)])
    assert r.pick == "eager" and r["flash"].margin.low > 1  # flash 1.47x [1.47–1.47] of eager's time
    # printed: "Slower than one tied for the fastest, though not told apart from `eager` itself: `flash` 1.03x
    # [1.03–1.03] of `naive-inplace`'s time." -- and flash is missing from "Slower:"
    assert "not told apart from `eager`" not in r.recommendation
    assert set(_behind_named(r.recommendation)) <= set(r.ties), r.recommendation


# -- ties and the words ---------------------------------------------------------------------------------------

def test_a_backend_said_slower_than_one_tied_for_the_fastest_is_slower_than_a_tied_one():
    # flash beats math, math beats naive, yet naive is not told apart from flash (the rounds math and naive each
    # lost are different ones): the top is flash alone, and naive is "behind" math, which is not tied
    flash = [10.0] * 12
    math_ = [8.0, 8.0] + [10.5] * 10
    naive = [8.4] * 4 + [11.025] * 8
    r = report_of([fixed("flash", flash), fixed("math", math_), fixed("naive", naive)])
    m = r["naive"].margin
    assert m.low < 1 < m.high  # naive's interval against the pick holds 1
    # printed: "Slower than one tied for the fastest, though not told apart from `flash` itself: `naive` 1.05x
    # [1.05–1.05] of `math`'s time." while `math` is listed under "Slower:" and r.ties == ('flash',)
    # (docs/report.md: not tied only where "decidedly slower than another tied one")
    assert set(_behind_named(r.recommendation)) <= set(r.ties), (r.ties, r.recommendation)


def test_compiling_is_not_said_to_change_the_pick_where_the_uncompiled_pick_is_faster_than_every_compiled_one():
    r = report_of([fixed("flash", [9.0] * 6), fixed("math+compile", [10.0] * 6, compile="default")])
    assert r.pick == "flash" and r["math+compile"].margin.low > 1
    # printed: "Compiling changes the pick: uncompiled `flash` (9.000 ms), compiled `math+compile` (10.000 ms)."
    assert "Compiling changes the pick" not in r.recommendation, r.recommendation


def test_no_answer_for_a_backend_a_known_defect_rules_out_does_not_blame_its_numerics():
    good = Numerics(0.0, 0.0, 1.0, 1e-2, True)
    wrong = DefectMatch("pytorch#1", "cudnn", "forward", "NaN out", "wrong", "at key length 64", "torch 2.11", (64,))
    r = report_of([fixed("eager", [10.0] * 6, numerics=good), fixed("cudnn", [8.0] * 6, numerics=good,
                                                                    defects=(wrong,))])
    assert r.decision.answer == "none" and r["cudnn"].numerics.ok
    # printed: "No backend ran these inputs with acceptable numerics." -- cudnn ran, with acceptable numerics; a
    # known defect rules it out (the next line says so)
    assert "acceptable numerics" not in r.decision.headline, r.decision.headline


# -- sweeps -----------------------------------------------------------------------------------------------------

def test_a_sweeps_pick_that_failed_at_a_shape_of_another_batch_size_is_said_not_to_have_run_there():
    r = _sweep([(1, 64, [fixed("flash", [1.0] * 6), _failed("math")]),
                (1, 128, [fixed("flash", [2.0] * 6), fixed("math", [4.0] * 6)]),
                (4, 64, [fixed("flash", [3.0] * 6), fixed("math", [6.0] * 6)]),
                (4, 128, [_failed("flash"), fixed("math", [8.0] * 6)])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash"
    # printed: "Use `flash` over seq 64–128: the fastest (or tied) at 3 of 4 shapes, and of those the least time
    # over all." -- flash failed at batch 4, seq 128 (the last shape, the summary's); with one batch size the line
    # says "it did not run at seq 128"
    assert "did not run" in first, first


def test_a_sweeps_summary_never_calls_tied_a_backend_decidedly_faster_than_the_pick():
    p1 = (64, [fixed("flash", [1.0] * 6), fixed("naive", [3.0] * 6)])
    p2 = (128, [fixed("flash", [2.0] * 6), fixed("naive", [1.9, 1.91, 1.89, 1.9, 1.92, 1.88])])
    p3 = (256, [fixed("flash", [4.0] * 6), fixed("naive", [8.0] * 6)])
    r = sweep_report([p1, p3, p2])  # the last shape measured (seq 128): naive decidedly faster than flash there
    assert r.pick == "flash" and r["naive"].margin.high < 1
    # printed in the summary: "naive  1.900  ≈ 0.95 [0.94–0.96]" (≈: "the interval holds 1"), and
    # decision.ties == policy.json's ties == ('flash', 'naive')
    assert "naive" not in r.ties, (r.ties, r["naive"].margin.text())


def test_a_sweep_where_only_eager_ran_says_so_not_that_nothing_had_acceptable_numerics():
    good = Numerics(0.0, 0.0, 1.0, 1e-2, True)
    r = sweep_report([(16, [fixed("eager", EAGER, numerics=good)]), (32, [fixed("eager", EAGER, numerics=good)])])
    assert r.decision.answer == "none"
    # printed: "No backend ran with acceptable numerics at any measured shape." and "seq 16: no backend with
    # acceptable numerics" -- eager ran at both, max rel err 0; one shape alone says "Only `eager` ran"
    assert "acceptable numerics" not in r.decision.headline and "eager" in r.decision.headline, r.decision.headline


def test_a_sweeps_summary_without_a_pick_names_no_pick():
    r = sweep_report([(16, [fixed("eager", EAGER)]), (32, [fixed("eager", EAGER)])])
    assert r.pick is None
    # printed under Summary: "The last shape of the sweep (batch 2, seq 32), in full, against the sweep's pick
    # `None`; every shape's time is in the Sweep section."
    assert "`None`" not in str(r)


def test_a_generate_sweep_with_a_length_mix_keeps_eager_where_eager_is_decidedly_fastest_at_every_shape():
    g = GenerateStats(new_shape_step_ms=1.0, seen_shape_step_ms=1.0, ttft_ms=1.0, step_ms_p50=0.5)
    workload = {"mode": "generate", "dtype": "bf16", "batch": 1, "new_tokens": 4, "attn_implementation": "eager"}
    points, verdicts, last = [], [], None
    for seq in (16, 32):
        rs = [fixed("eager", EAGER, generate=g), fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0], generate=g),
              fixed("math", [20.0] * 6, generate=g)]
        d, v = decide(rs, verdict(rs), {**workload, "prompt_lens": [seq]}, {})
        assert d.answer == "keep" and d.pick == "eager"  # each shape keeps the model's own eager attention
        last = tuple(ranked(rs, v))
        points.append(SweepPoint(1, seq, last, v.order, d.ties, new_tokens=4))
        verdicts.append(verdict(last))
    s = serving_estimate(points, Lengths.of({16: 1, 32: 1}), 10, 4)
    d, _, _ = decide_sweep(points, verdicts, list(last), {**workload, "prompt_lens": [16, 32]}, {},
                           dataclasses.asdict(s), s.text(), ())
    # printed: "Use `flash` over prompt 16–32: the cheapest for the length mix." / "Best per length at batch 1, 4
    # new tokens: prompt 16–32: `eager`." -- the estimate never priced eager, 0.80x of flash's time at every shape
    assert d.pick == "eager" and d.answer == "keep", d.text


# -- the summary's chart ----------------------------------------------------------------------------------------

def test_the_ranked_time_chart_draws_no_backend_whose_interval_holds_1_as_told_apart():
    from attnswitch.render.document import Figure, walk
    from attnswitch.render.sections import sections

    inplace = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
    flash = [10.3, 10.31, 10.29, 10.3, 10.32, 10.28, 10.3, 10.31]
    naive = [8.0, 12.5, 9.0, 11.5, 9.2, 10.9, 8.5, 9.4]
    r = report_of([fixed("naive-inplace", inplace), fixed("flash", flash), fixed("naive", naive)])
    fig = next(b for b in walk(sections(r)) if isinstance(b, Figure))  # the summary's first figure
    assert "against the pick" in fig.chart.title
    apart = next((vals for label, vals in fig.chart.series if "told apart" in label), ())  # none drawn: none apart
    drawn_apart = [n for n, x in zip(fig.chart.categories, apart) if x is not None]
    # printed: flash in the series "told apart (slower)" with its interval [0.82–1.29] against the pick, under the
    # caption "a backend whose interval holds 1 is tied with the pick", beside the answer's "not told apart from
    # `naive` itself"
    for name in drawn_apart:
        m = r[name].margin
        assert m.low > 1, (name, m.text(), fig.caption)
    assert "flash" in fig.chart.categories and "flash" not in drawn_apart  # drawn, as behind a tied one
