"""Findings of a third hostile review: a backend per layer kind in a tie, a sweep's first line and its CSV, the
words of a one-candidate answer, ``profile`` of a model without attention, and ``defects --cudnn``.

Each test is named for the promise it shows broken, and fails until the product is fixed. Results are built
with fixed per-round times (no clock), as in ``test_hostile_findings.py``; the models are tiny, with random
weights, built from configs.
"""

import csv
import io

from test_hostile_findings import FLASH_OP, fixed, no_attention_run, report_of, sweep_report

from attnswitch import cli
from attnswitch.decision import decide, decide_sweep
from attnswitch.ranking import ranked, verdict
from attnswitch.results import GenerateStats, Numerics, Report, SweepPoint

#: the candidate ``compare`` adds on a model of several layer kinds: each kind with its fastest backend
PER_KIND = "sliding_attention=naive/full_attention=flash"
NOISY = [8.0, 12.5, 9.0, 11.5, 9.2, 10.9, 8.5, 9.4]
TIGHT = [10.0, 10.01, 9.99, 10.0, 10.02, 9.98, 10.0, 10.01]
GOOD = Numerics(0.0, 0.0, 1.0, 1e-2, True)


def _steady(ms):
    return [ms * (1 + d) for d in (0.0, 0.001, -0.001, 0.0, 0.002, -0.002)]


# -- a backend per layer kind ------------------------------------------------------------------------------------

def test_a_backend_per_layer_kind_tied_with_a_single_backend_is_not_picked_over_it():
    # docs/workloads.md: the candidate of each kind's fastest backend "is picked only where its paired rounds tell
    # it faster than the best single backend (in a tie the single backend changes less)". On the command line
    # (`compare gemma3/config.json --backends "sliding_attention=math/full_attention=flash,naive"`, CPU) it printed
    # "Tie: `sliding_attention=naive/full_attention=flash` and 2 more at 6.751 ms per forward, not told apart: any
    # is as good here." with `naive` ≈ 1.47x [0.22–4.78], and deployed the per-kind candidate (policy.json too);
    # --mode train and --mode generate did the same.
    r = report_of([fixed(PER_KIND, NOISY), fixed("naive", TIGHT)])
    assert set(r.ties) == {PER_KIND, "naive"}  # not told apart
    # printed: "Tie: `sliding_attention=naive/full_attention=flash` and 1 more at 9.300 ms per forward, not told
    # apart: any is as good here." -- pick and Deploy: the per-kind candidate
    assert r.pick == "naive", r.recommendation.splitlines()[0]


# -- sweeps ------------------------------------------------------------------------------------------------------

def test_a_sweeps_first_line_says_least_time_over_all_only_of_the_pick_that_took_it():
    # auto is the fastest at seq 64 (5 ms against 10), flash at seq 128 (20 ms against 30): each the fastest at
    # one shape; over both, flash took 30 ms and auto 35. The pick is auto (it changes least: the rule), but the
    # line says it had the least time.
    r = sweep_report([(64, [fixed("auto", _steady(5.0), attn_ops=FLASH_OP), fixed("flash", _steady(10.0))]),
                      (128, [fixed("auto", _steady(30.0), attn_ops=FLASH_OP), fixed("flash", _steady(20.0))])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "auto"
    # printed: "Keep the model's own attention (`auto`) over seq 64–128: the fastest (or tied) at 1 of 2 shapes,
    # and of those the least time over all; nothing to change."
    assert "least time over all" not in first or "changes least" in first, first  # the rule that picked it


def test_a_sweeps_first_line_does_not_say_least_time_of_a_fused_pick_that_eager_beat_in_total():
    # eager decidedly fastest at seq 64 (5 ms, flash 10), flash the fastest at seq 128 (10 ms, eager 10.5): over
    # both, eager took 15.5 ms and flash 20
    r = sweep_report([(64, [fixed("eager", _steady(5.0)), fixed("flash", _steady(10.0)), fixed("math", _steady(20.0))]),
                      (128, [fixed("eager", _steady(10.5)), fixed("flash", _steady(10.0)),
                             fixed("math", _steady(20.0))])])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash"
    # printed: "Use `flash` over seq 64–128: the fastest (or tied) at 1 of 2 shapes, and of those the least time
    # over all."
    assert "least time over all" not in first or "changes least" in first, first  # the rule that picked it


def test_a_sweeps_csv_ranks_its_last_shape_as_the_summary_and_report_ranking_do():
    # the last shape: naive not told apart from math (the sweep's pick), with a lower median. The summary shows math
    # as "pick" first and naive "≈ 0.91" second (report.ranking == ('math', 'naive')); the CSV's rows of that same
    # shape say naive is rank 1 (vs_pick 0.91) and math rank 2 (vs_pick 1.0). On the command line
    # (`compare tiny-llama --seq 16,32 --mode train --backends naive,math`) the CSV's seq-32 rows read the same.
    r = sweep_report([(64, [fixed("math", _steady(1.0)), fixed("naive", _steady(3.0))]),
                      (128, [fixed("math", [2.0, 2.5, 1.6, 2.4, 1.7, 2.2]), fixed("naive", _steady(1.9))])])
    assert r.pick == "math" and r.ranking[0] == "math"
    rows = [row for row in csv.DictReader(io.StringIO(r.to_csv())) if row["seq"] == "128"]
    rank = {row["backend"]: int(row["rank"]) for row in rows}
    vs = {row["backend"]: float(row["vs_pick"]) for row in rows}
    # printed: rank {'math': 2, 'naive': 1}, vs_pick {'math': 1.0, 'naive': 0.906}
    assert rank == {n: i + 1 for i, n in enumerate(r.ranking)}, (rank, vs)


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
    # printed: "The last shape of the sweep (batch 1, seq 16), in full, ..." -- a generate has no --seq (it is
    # refused), every other line says "prompt", and both shapes are batch 1 at 16: which one is not said
    assert "prompt 16" in note and "4 new" in note, note


# -- the words -------------------------------------------------------------------------------------------------

def test_the_only_candidate_beside_eager_is_not_said_to_be_the_only_backend_that_ran():
    # `compare gemma3/config.json --backends full_attention=flash,eager` printed "Use `full_attention=flash`:
    # 388.418 ms per forward, the only backend here that ran with acceptable numerics." above a summary where eager
    # ran, max rel err 0.0e+00
    r = report_of([fixed("eager", _steady(10.0), numerics=GOOD), fixed("flash", _steady(8.0), numerics=GOOD)])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash" and r["eager"].ok and r["eager"].numerics.ok
    # printed: "Use `flash`: 8.000 ms per forward, the only backend here that ran with acceptable numerics."
    assert "the only backend here that ran" not in first, first


def test_only_eager_ran_where_a_named_backend_failed_does_not_ask_to_name_the_backends():
    from attnswitch.results import BackendResult

    # `--backends eager,flash` where flash failed: the user named the backends to choose among
    r = report_of([fixed("eager", _steady(10.0)), BackendResult("flash", "failed", reasons=("boom",))])
    assert r.decision.answer == "none"
    # printed: "Only `eager` ran: the model's own attention has nothing to be chosen against." / "Name the backends
    # to choose among." -- not a word that `flash` was named and failed (the "No backend ran these inputs" answer
    # says "See the reasons in the report.")
    assert "Name the backends to choose among" not in r.recommendation, r.recommendation

# -- the command line ----------------------------------------------------------------------------------------------

def test_profile_of_a_model_with_no_attention_call_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "profile"
    code = no_attention_run(tmp_path, "profile", "16", out)
    printed = capsys.readouterr().out
    # docs/cli.md, exit code 1: "the model's forward made no attention call through attnswitch (a model without
    # attention layers): the report is printed, `--out` left as it was". printed: a summary timing naive against
    # flash (62.9 ms, 13.6 ms) with no word that no attention call was made; exit 0; wrote report.json, ... to --out
    assert "no attention call" in printed
    assert code == cli.EXIT_NOTHING_RAN
    assert not out.exists()


def test_defects_refuses_a_cudnn_version_that_is_neither_form_it_names(capsys):
    # --help: "this cuDNN version, 9.20 or 92000". torch's integer 920 is read (0, 9, 20) and 0 is no version
    # (version_of(0) is None), yet as text both are taken: `defects --torch 2.13.0 --cudnn 920 --arch sm100`
    # printed "Known defects: 4 in attnswitch's table; 1 apply to torch 2.13.0, cuDNN 920, sm100." (every range
    # ">=9.19" holds 920) and `--cudnn 0` "... cuDNN 0, sm100.", both exit 0
    for given in ("920", "0"):
        code = cli.main(["defects", "--torch", "2.13.0", "--cudnn", given, "--arch", "sm100"])
        printed = capsys.readouterr().out
        assert code == cli.EXIT_BAD_INPUT, (given, printed.splitlines()[:1])
