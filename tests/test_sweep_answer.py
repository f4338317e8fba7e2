"""A sweep's one answer against its shapes: the pick (eager kept where it is decidedly fastest everywhere, a pick
that failed at a shape said not to have run there), its first line's rule, the summary of its last shape, and
its CSV ranked and set against the sweep's pick as the summary is.

Results are built with fixed per-round times (no clock), each shape decided as ``compare`` decides it.
"""

import csv
import dataclasses
import io

import pytest
from reports_fixed import EAGER, FLASH_OP, _steady, fixed, sweep_report

from attnswitch.decision import decide, decide_sweep
from attnswitch.lengths import Lengths
from attnswitch.ranking import ranked, verdict
from attnswitch.results import BackendResult, GenerateStats, Numerics, Report, SweepPoint
from attnswitch.serving import serving_estimate


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


# -- the pick ----------------------------------------------------------------------------------------------------------

def test_a_sweep_where_eager_is_decidedly_fastest_at_every_shape_keeps_the_models_own_attention():
    def shape(seq):
        return seq, [fixed("eager", [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]),
                     fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]), fixed("math", [20.0] * 6)]

    r = sweep_report([shape(64), shape(128)], {"attn_implementation": "eager"})
    first = r.recommendation.splitlines()[0]
    # eager is the best at every length and is kept. A wrong first line would read "Use `flash` over seq 64–128: the
    # fastest (or tied) at 0 of 2 shapes, and of those the least time over all." while the report's own lines say
    # "Best per length at batch 2: seq 64–128: `eager`."
    assert "at 0 of" not in first
    assert r.pick == "eager" and r.decision.answer == "keep", first
    # and the summary never shows a backend decidedly faster than the pick (a wrong one: eager 0.80 [0.80–0.80])
    for b in r.backends:
        if b.margin is not None and b.backend != r.pick:
            assert not (b.margin.decided and b.margin.high < 1), (b.backend, b.margin.text())


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
    # eager, 0.80x of flash's time at every shape, is kept. A wrong answer, from an estimate that never priced
    # eager, would read "Use `flash` over prompt 16–32: the cheapest for the length mix." / "Best per length at
    # batch 1, 4 new tokens: prompt 16–32: `eager`."
    assert d.pick == "eager" and d.answer == "keep", d.text


def test_a_sweep_where_only_eager_ran_says_so_not_that_nothing_had_acceptable_numerics():
    good = Numerics(0.0, 0.0, 1.0, 1e-2, True)
    r = sweep_report([(16, [fixed("eager", EAGER, numerics=good)]), (32, [fixed("eager", EAGER, numerics=good)])])
    assert r.decision.answer == "none"
    # eager ran at both, max rel err 0: the headline names eager, as one shape's "Only `eager` ran" does. A wrong
    # one would read "No backend ran with acceptable numerics at any measured shape." and "seq 16: no backend with
    # acceptable numerics"
    assert "acceptable numerics" not in r.decision.headline and "eager" in r.decision.headline, r.decision.headline


# -- a pick that failed at a shape -------------------------------------------------------------------------------------

def test_a_sweeps_pick_that_failed_at_the_last_shape_is_first_of_its_ties_and_not_said_to_cover_it():
    def failed(name):
        return BackendResult(name, "failed", reasons=("boom",))

    r = sweep_report([(64, [fixed("flash", [1.0] * 6), failed("math")]),
                      (128, [failed("flash"), fixed("math", [2.0] * 6)])])
    first = r.recommendation.splitlines()[0]
    # the pick is first of its ties, and the first line does not say it covers seq 128, where it failed. A wrong
    # answer would read "Use `flash` over seq 64–128: ..." with decision.ties == ('math',), and a summary whose
    # `math` is "≈ 1.00 [1.00–1.00]" against itself while `flash`, the pick, failed there
    assert r.ties and r.ties[0] == r.pick, (r.pick, r.ties)
    assert "64–128" not in first, first


def test_a_sweeps_pick_that_failed_at_a_shape_of_another_batch_size_is_said_not_to_have_run_there():
    r = _sweep([(1, 64, [fixed("flash", [1.0] * 6), _failed("math")]),
                (1, 128, [fixed("flash", [2.0] * 6), fixed("math", [4.0] * 6)]),
                (4, 64, [fixed("flash", [3.0] * 6), fixed("math", [6.0] * 6)]),
                (4, 128, [_failed("flash"), fixed("math", [8.0] * 6)])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash"
    # flash failed at batch 4, seq 128 (the last shape, the summary's): the first line says it did not run there,
    # as it does with one batch size ("it did not run at seq 128"). A wrong one would read "Use `flash` over seq
    # 64–128: the fastest (or tied) at 3 of 4 shapes, and of those the least time over all."
    assert "did not run" in first, first


# -- the first line ----------------------------------------------------------------------------------------------------

def test_a_sweeps_first_line_says_least_time_over_all_only_of_the_pick_that_took_it():
    # auto is the fastest at seq 64 (5 ms against 10), flash at seq 128 (20 ms against 30): each the fastest at
    # one shape; over both, flash took 30 ms and auto 35. The pick is auto (it changes least: the rule), and the
    # first line gives that rule, not the least time.
    r = sweep_report([(64, [fixed("auto", _steady(5.0), attn_ops=FLASH_OP), fixed("flash", _steady(10.0))]),
                      (128, [fixed("auto", _steady(30.0), attn_ops=FLASH_OP), fixed("flash", _steady(20.0))])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "auto"
    # a wrong first line: "Keep the model's own attention (`auto`) over seq 64–128: the fastest (or tied) at 1 of 2
    # shapes, and of those the least time over all; nothing to change."
    assert "least time over all" not in first or "changes least" in first, first  # the rule that picked it


def test_a_sweeps_first_line_does_not_say_least_time_of_a_fused_pick_that_eager_beat_in_total():
    # eager decidedly fastest at seq 64 (5 ms, flash 10), flash the fastest at seq 128 (10 ms, eager 10.5): over
    # both, eager took 15.5 ms and flash 20
    r = sweep_report([(64, [fixed("eager", _steady(5.0)), fixed("flash", _steady(10.0)), fixed("math", _steady(20.0))]),
                      (128, [fixed("eager", _steady(10.5)), fixed("flash", _steady(10.0)),
                             fixed("math", _steady(20.0))])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash"
    # a wrong first line: "Use `flash` over seq 64–128: the fastest (or tied) at 1 of 2 shapes, and of those the
    # least time over all."
    assert "least time over all" not in first or "changes least" in first, first  # the rule that picked it


# -- the summary: the last shape against the sweep's pick --------------------------------------------------------------

def test_a_sweeps_summary_never_calls_tied_a_backend_decidedly_faster_than_the_pick():
    p1 = (64, [fixed("flash", [1.0] * 6), fixed("naive", [3.0] * 6)])
    p2 = (128, [fixed("flash", [2.0] * 6), fixed("naive", [1.9, 1.91, 1.89, 1.9, 1.92, 1.88])])
    p3 = (256, [fixed("flash", [4.0] * 6), fixed("naive", [8.0] * 6)])
    r = sweep_report([p1, p3, p2])  # the last shape measured (seq 128): naive decidedly faster than flash there
    assert r.pick == "flash" and r["naive"].margin.high < 1
    # a wrong summary would read "naive  1.900  ≈ 0.95 [0.94–0.96]" (≈: "the interval holds 1"), with
    # decision.ties == policy.json's ties == ('flash', 'naive')
    assert "naive" not in r.ties, (r.ties, r["naive"].margin.text())


def test_a_sweeps_summary_without_a_pick_names_no_pick():
    r = sweep_report([(16, [fixed("eager", EAGER)]), (32, [fixed("eager", EAGER)])])
    assert r.pick is None
    # a wrong Summary would read "The last shape of the sweep (batch 2, seq 32), in full, against the sweep's pick
    # `None`; every shape's time is in the Sweep section."
    assert "`None`" not in str(r)


def test_a_generate_sweeps_summary_names_its_last_shape_as_a_generate_shape():
    # a generate sweep over --new-tokens 2,4 at prompt 16: the summary is its last shape, 4 new tokens
    g = GenerateStats(new_shape_step_ms=1.0, seen_shape_step_ms=1.0, ttft_ms=1.0, step_ms_p50=0.5)
    workload = {"mode": "generate", "dtype": "bf16", "batch": 1}
    points, verdicts, last = [], [], None
    for new in (2, 4):
        rs = [fixed("flash", _steady(10.0), generate=g), fixed("math", _steady(20.0), generate=g)]
        d, v = decide(rs, verdict(rs), {**workload, "prompt_lens": [16], "new_tokens": new}, {})
        last = tuple(ranked(rs, v))
        points.append(SweepPoint(1, 16, last, v.order, d.ties, new_tokens=new))
        verdicts.append(verdict(last))
    wl = {**workload, "prompt_lens": [16], "new_tokens": [2, 4], "description": "sweep"}
    d, v, points = decide_sweep(points, verdicts, list(last), wl, {}, None, [], ())
    r = Report(tuple(ranked(list(last), v)), {}, wl, {}, model="m", ranking=v.order, decision=d, sweep=points)
    note = next(x for x in str(r).splitlines() if x.startswith("The last shape of the sweep"))
    # a generate has no --seq (it is refused) and every other line says "prompt": the note names the prompt and the
    # new tokens. A wrong one would read "The last shape of the sweep (batch 1, seq 16), in full, ...", where both
    # shapes are batch 1 at 16: which one is not said
    assert "prompt 16" in note and "4 new" in note, note


# -- the CSV -----------------------------------------------------------------------------------------------------------

def test_a_sweeps_csv_vs_pick_is_against_the_sweeps_one_pick():
    import csv
    import io

    p1 = (64, [fixed("flash", [1.0] * 6), fixed("naive", [3.0] * 6)])
    p2 = (128, [fixed("flash", [2.0] * 6), fixed("naive", [1.9, 1.91, 1.89, 1.9, 1.92, 1.88])])
    p3 = (256, [fixed("flash", [4.0] * 6), fixed("naive", [8.0] * 6)])
    r = sweep_report([p1, p3, p2])  # the last shape measured (seq 128): naive decidedly fastest there
    assert r.pick == "flash"
    summary = {b.backend: b.margin for b in r.backends}
    assert summary["flash"].ratio == 1.0  # the summary: the last shape against the sweep's pick
    rows = [row for row in csv.DictReader(io.StringIO(r.to_csv())) if row["seq"] == "128"]
    vs = {row["backend"]: float(row["vs_pick"]) for row in rows}
    # the CSV's last shape is against the sweep's pick too; a wrong one is against that shape's own (naive 1.0,
    # flash 1.05): another pick
    assert vs["flash"] == pytest.approx(1.0), vs


def test_a_sweeps_csv_ranks_its_last_shape_as_the_summary_and_report_ranking_do():
    # the last shape: naive not told apart from math (the sweep's pick), with a lower median. The summary shows math
    # as "pick" first and naive "≈ 0.91" second (report.ranking == ('math', 'naive')), and the CSV's rows of that
    # same shape rank them alike, as on the command line (the seq-32 rows of `compare tiny-llama --seq 16,32 --mode
    # train --backends naive,math`).
    r = sweep_report([(64, [fixed("math", _steady(1.0)), fixed("naive", _steady(3.0))]),
                      (128, [fixed("math", [2.0, 2.5, 1.6, 2.4, 1.7, 2.2]), fixed("naive", _steady(1.9))])])
    assert r.pick == "math" and r.ranking[0] == "math"
    rows = [row for row in csv.DictReader(io.StringIO(r.to_csv())) if row["seq"] == "128"]
    rank = {row["backend"]: int(row["rank"]) for row in rows}
    vs = {row["backend"]: float(row["vs_pick"]) for row in rows}
    # a wrong CSV: rank {'math': 2, 'naive': 1}, vs_pick {'math': 1.0, 'naive': 0.906}
    assert rank == {n: i + 1 for i, n in enumerate(r.ranking)}, (rank, vs)


def test_a_sweeps_ties_are_those_tied_with_its_pick_at_every_shape():
    # the last shape's ties alone: `math`, told apart (slower) at the first shape, was written to policy.json's ties
    # beside `flash` and `naive`, tied at both
    near = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    r = sweep_report([(8, [fixed("flash", near), fixed("naive", near[::-1]), fixed("math", [1.5] * 6)]),
                      (16, [fixed("flash", near), fixed("naive", near[::-1]), fixed("math", near)])])
    assert r.pick == "flash" and r.decision.ties == ("flash", "naive"), r.decision.ties


def test_a_sweeps_summary_and_ranking_chart_mark_tied_those_tied_with_the_pick_at_the_shape_they_show():
    # math, told apart at the first shape, is tied with flash at the last one, which the summary shows: it was
    # printed without ≈ and plain, and drawn "slower than one tied with the pick", its interval holding 1
    from attnswitch.render import charts
    from attnswitch.render.sections import summary_table

    near = [1.0, 1.01, 0.99, 1.0, 1.02, 0.98]
    r = sweep_report([(8, [fixed("flash", near), fixed("naive", near[::-1]), fixed("math", [1.5] * 6)]),
                      (16, [fixed("flash", near), fixed("naive", near[::-1]), fixed("math", near)])])
    assert r.decision.ties == ("flash", "naive") and set(r.sweep[-1].with_pick) == {"flash", "naive", "math"}
    table = summary_table(r)
    rows = {row[0]: (row, kind) for row, kind in zip(table.rows, table.row_kinds)}
    assert rows["math"][0][2].startswith("≈ ") and rows["math"][1] == "strong", rows["math"]
    chart = charts.ranking_chart(r.backends, r.pick, r.shown_ties)
    tied = dict(chart.series)["the pick and those tied with it"]
    assert tied[chart.categories.index("math")] is not None
    # the first shape's math stays told apart: the deployed ties are the sweep's
    assert "math" not in r.ties
