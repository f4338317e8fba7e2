"""The model's own attention (``eager``) in the answer: kept where it is decidedly faster than every candidate;
where only it ran (or passed numerics), no answer, exit 1 and nothing written, said in words that match what ran;
and no claim that it checked numerics that were not checked.

Results are built with fixed per-round times (no clock), as in ``test_decision.py``; the command line runs a tiny
model with random weights.
"""

from reports_fixed import EAGER, FLASH_OP, _steady, fixed, report_of

from attnswitch import cli
from attnswitch.results import Numerics

GOOD = Numerics(0.0, 0.0, 1.0, 1e-2, True)


# -- eager decidedly fastest: the model's own attention is kept ---------------------------------------------------

def test_eager_decidedly_faster_than_every_forced_candidate_keeps_the_models_own_eager_attention():
    # the model runs eager; eager is decidedly faster than flash and math, and tied with auto (whose median is
    # even slower): eager is kept, as telling the user to switch to auto would be a change with no evidence of a gain
    eager = [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]
    auto = [8.0, 9.0, 7.2, 8.6, 7.5, 8.4]
    rs = [fixed("eager", eager), fixed("auto", auto, attn_ops=FLASH_OP), fixed("flash", [10.0] * 6),
          fixed("math", [20.0] * 6)]
    r = report_of(rs, {"attn_implementation": "eager"})
    assert r.decision.answer == "keep" and r.deploy.keep, r.recommendation.splitlines()[0]


def test_a_model_running_eager_keeps_it_where_eager_is_decidedly_faster_than_auto_the_only_candidate():
    # the model runs eager; only auto (SDPA's own choice) was asked beside it, and eager is 0.80x of its time
    r = report_of([fixed("eager", EAGER), fixed("auto", [10.0] * 6, attn_ops=FLASH_OP)],
                  {"attn_implementation": "eager"})
    # auto is the only candidate, so eager is faster than every candidate: kept. A wrong answer would tell the
    # model to switch to a slower backend: "Use `auto` (ran flash): 10.000 ms per forward, the only backend here that
    # ran (numerics not checked)." / "The model's own attention (`eager`) ran faster than `auto`: 0.80x [0.79–0.82]
    # of its time, but not faster than every candidate."
    assert r.decision.answer == "keep" and r.pick == "eager", r.recommendation.splitlines()[0]


# -- only eager ran, or passed numerics -----------------------------------------------------------------------------

def test_backends_that_ran_and_failed_numerics_are_not_said_not_to_have_run_and_exit_1():
    good, bad = Numerics(0.0, 0.0, 1.0, 1e-2, True), Numerics(0.5, 0.1, 0.5, 1e-2, False)
    r = report_of([fixed("eager", [10.0] * 6, numerics=good), fixed("flash", [8.0] * 6, numerics=bad),
                   fixed("math", [9.0] * 6, numerics=bad)])
    # flash and math ran, beyond tolerance, and the answer says so. A wrong one would read "Only `eager` ran: the
    # model's own attention is the reference the others are checked against." / "Name the backends to choose among."
    assert not r.recommendation.startswith("Only `eager` ran")
    assert "beyond tolerance" in r.recommendation


def test_only_eager_ran_exits_1_and_writes_nothing(tmp_path, capsys):
    out = tmp_path / "report"
    code = cli.main(["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--backends", "eager", "--seq",
                     "16", "--iters", "2", "--rounds", "1", "--warmup", "0", "--out", str(out)])
    assert "Only `eager` ran" in capsys.readouterr().out
    assert code == cli.EXIT_NOTHING_RAN  # docs/report.md: no answer, exit 1, and --out not written
    assert not out.exists()


def test_only_eager_ran_where_a_named_backend_failed_does_not_ask_to_name_the_backends():
    from attnswitch.results import BackendResult

    # `--backends eager,flash` where flash failed: the user named the backends to choose among
    r = report_of([fixed("eager", _steady(10.0)), BackendResult("flash", "failed", reasons=("boom",))])
    assert r.decision.answer == "none"
    # the answer does not ask for backends the user named. A wrong one would read "Only `eager` ran: the model's own
    # attention has nothing to be chosen against." / "Name the backends to choose among." with not a word that
    # `flash` was named and failed (the "No backend ran these inputs" answer says "See the reasons in the report.")
    assert "Name the backends to choose among" not in r.recommendation, r.recommendation


def test_the_only_candidate_beside_eager_is_not_said_to_be_the_only_backend_that_ran():
    # eager ran too, max rel err 0.0e+00 (as with `compare gemma3/config.json --backends
    # full_attention=flash,eager`): the pick is not called the only backend that ran
    r = report_of([fixed("eager", _steady(10.0), numerics=GOOD), fixed("flash", _steady(8.0), numerics=GOOD)])
    first = r.recommendation.splitlines()[0]
    assert r.pick == "flash" and r["eager"].ok and r["eager"].numerics.ok
    # a wrong first line: "Use `flash`: 8.000 ms per forward, the only backend here that ran with acceptable numerics."
    assert "the only backend here that ran" not in first, first


# -- what is said of eager -------------------------------------------------------------------------------------------

def test_no_numerics_claim_under_no_numerics_the_eager_line():
    r = report_of([fixed("eager", [10.0] * 6), fixed("flash", [8.0] * 6), fixed("math", [9.0] * 6)])
    assert "Numerics not checked" in r.recommendation
    # nor in the eager line: a wrong one would read "`eager` ... is the reference the others are checked against"
    assert "checked against" not in r.recommendation
