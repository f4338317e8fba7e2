"""One decision, made once: what a report answers, what it deploys and why, read alike by every writer.

Constructed results with fixed per-round times (no clock); the writers are the real ones.
"""

import dataclasses
import json

import pytest

import attnswitch
from attnswitch import cli
from attnswitch.decision import decide, decide_sweep
from attnswitch.profiling.rounds import Timing
from attnswitch.profiling.summarize import with_timing
from attnswitch.ranking import ranked, verdict
from attnswitch.render.markdown import to_markdown
from attnswitch.results import BackendResult, GenerateStats, Report, SweepPoint, TrainStats

FLASH_OP = ("aten::_scaled_dot_product_flash_attention",)


def fixed(name, per_round, **kw):
    t = Timing(samples=list(per_round), units=[[x] for x in per_round])
    return with_timing(BackendResult(name, "ok", timer="cuda-events", attn_calls=kw.pop("attn_calls", 4.0), **kw), t)


def report_of(results, workload=None, host=None):
    workload = {"mode": "prefill", "batch": 2, "seq": 64, "dtype": "bf16", **(workload or {})}
    d, v = decide(results, verdict(results, host), workload, {"torch": "2.11"})
    return Report(tuple(ranked(results, v)), {"torch": "2.11"}, workload, {}, model="m", ranking=v.order, decision=d)


def test_in_a_tie_sdpas_own_choice_is_kept_and_the_first_line_says_so():
    results = [fixed("naive", [10.0, 10.2, 9.9, 10.1, 10.0, 10.3]), fixed("flash", [10.1, 10.0, 10.2, 9.9, 10.2, 10.0]),
               fixed("auto", [10.2, 10.1, 10.0, 10.0, 9.9, 10.1], attn_ops=FLASH_OP)]
    r = report_of(results)
    assert r.decision.answer == "keep" and r.pick == "auto" and set(r.ties) == {"auto", "flash", "naive"}
    first = r.recommendation.splitlines()[0]
    assert first.startswith("Keep the model's own attention (`auto`, ran flash): tied with `flash` ≈ `naive` at")
    assert r.deploy.keep and r.deploy.attnswitch == "" and "set_attn_implementation('sdpa')" in r.deploy.plain
    md = to_markdown(r)
    assert "Nothing to change in the serving process" in md and "attnswitch.patch(model, 'naive')" not in md


@pytest.mark.parametrize("slow", ["naive", "naive-inplace", "math"])
def test_a_fused_kernel_is_deployed_over_an_unfused_one_it_is_tied_with(slow):
    # the unfused one is even a little faster in the median: tied, it is still not what a practitioner deploys
    results = [fixed(slow, [9.8, 10.1, 9.9, 10.0, 10.2, 9.7]), fixed("flash", [10.0, 10.0, 10.1, 9.9, 10.2, 10.0])]
    r = report_of(results)
    assert r.pick == "flash" and r.decision.fastest == slow and r.ties == ("flash", slow)
    first = r.recommendation.splitlines()[0]
    assert first.startswith(f"Tie: `flash` ≈ `{slow}` at ") and f"pick `flash`: a fused kernel, preferred to `{slow}`" \
        in first
    assert r.deploy.pick == "flash" and "attnswitch.patch(model, 'flash')" in r.deploy.attnswitch
    assert r.decision.rule.startswith("a fused kernel")


def test_eager_decidedly_faster_than_every_candidate_is_the_answer_with_its_margin():
    results = [fixed("eager", [8.0, 8.1, 7.9, 8.0, 8.2, 8.0]), fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
               fixed("auto", [10.0, 10.1, 10.0, 9.9, 10.1, 10.0], attn_ops=FLASH_OP), fixed("math", [20.0] * 6)]
    for own, answer in (("eager", "keep"), ("sdpa", "use")):
        r = report_of(results, {"attn_implementation": own})
        first = r.recommendation.splitlines()[0]
        assert r.pick == "eager" and r.decision.answer == answer and r.ranking[0] == "eager"
        assert "1.2" in first and "faster than `" in first  # by how much, against the fastest candidate
        assert r["flash"].margin.against == "eager" and r["flash"].margin.low > 1  # the table reads as the line
        assert "set_attn_implementation('eager')" in r.deploy.plain
    assert first.startswith("Use `eager`: 8.000 ms per forward, 1.2")


def test_auto_decidedly_faster_than_every_forced_candidate_keeps_the_models_own_attention():
    results = [fixed("auto", [8.0, 8.1, 7.9, 8.0, 8.2, 8.0], attn_ops=("aten::_scaled_dot_product_cudnn_attention",)),
               fixed("flash", [10.0] * 6), fixed("naive", [30.0] * 6)]
    r = report_of(results)
    first = r.recommendation.splitlines()[0]
    assert r.decision.answer == "keep" and first.startswith("Keep the model's own attention (`auto`, ran cudnn): 8.000")
    assert "faster than `flash`" in first and first.endswith("nothing to change.")


def test_no_candidate_faster_than_the_pick_in_its_paired_rounds_is_called_tied():
    # per-round times whose order cycles: a beats b, b beats c, c beats a, each in two rounds of three
    a, b, c = [1.0, 2.0, 3.0] * 20, [2.0, 3.0, 1.0] * 20, [3.0, 1.0, 2.0] * 20
    results = [fixed("naive", a), fixed("flash", b), fixed("math", c)]
    r = report_of(results)
    text = r.recommendation
    for name in r.ties[1:]:
        m = r[name].margin
        if m.high < 1.0:  # faster than the pick in its paired rounds: said so, never "not told apart"
            assert name in r.decision.ties and f"`{name}` {m.text()}" in text
            assert f"Not told apart from `{r.pick}`: `{name}`" not in text
    assert "do not order" in text and r.pick == "flash"  # of a cycle, the fused kernel


def test_deploy_text_fits_a_training_step():
    results = [fixed("flash", [10.0] * 6, train=TrainStats(forward_ms=3.0, backward_ms=7.0)),
               fixed("math", [20.0] * 6, train=TrainStats(forward_ms=6.0, backward_ms=14.0))]
    r = report_of(results, {"mode": "train"})
    assert "per training step" in r.recommendation.splitlines()[0]
    assert r.deploy.where == "the training script" and "model(**inputs).loss.backward()" in r.deploy.plain
    md = to_markdown(r)
    assert "in the training script" in md and "serving" not in md and "generate(" not in md


def test_deploy_text_fits_a_generate_workload():
    g = GenerateStats(ttft_ms=1.0, step_ms_p50=0.5)
    results = [fixed("flash", [10.0] * 6, generate=g), fixed("math", [20.0] * 6, generate=g)]
    r = report_of(results, {"mode": "generate", "prompt_lens": [32], "new_tokens": 8})
    assert r.deploy.where == "the serving process" and "model.generate(**inputs)" in r.deploy.plain


def test_no_numerics_claim_where_numerics_were_not_checked():
    r = report_of([fixed("flash", [10.0] * 6)])
    assert "acceptable numerics" not in r.recommendation and "numerics not checked" in r.recommendation
    assert "Numerics not checked" in r.recommendation


def test_a_model_without_attention_calls_gets_no_pick_no_deploy_and_no_policy(tmp_path, capsys):
    from transformers import MambaConfig

    config = tmp_path / "config.json"
    config.write_text(json.dumps({**MambaConfig(vocab_size=100, hidden_size=32, num_hidden_layers=2, state_size=4,
                                                expand=2).to_dict(), "architectures": ["MambaForCausalLM"]}))
    out = tmp_path / "report"
    code = cli.main(["compare", str(config), "--device", "cpu", "--backends", "naive,flash", "--seq", "16", "--iters",
                     "2", "--rounds", "1", "--warmup", "0", "--out", str(out)])
    printed = capsys.readouterr().out
    assert code == cli.EXIT_NOTHING_RAN
    assert "no attention call" in printed and "Deploy" not in printed
    assert not out.exists()  # a run that exits non-zero writes nothing: no report, no policy.json


def test_a_sweep_names_one_pick_in_its_first_line_its_deploy_and_its_summary():
    def point(seq, rows):
        rs = [fixed(n, xs, attn_ops=FLASH_OP if n == "auto" else ()) for n, xs in rows.items()]
        v = verdict(rs)
        return SweepPoint(2, seq, tuple(rs), v.order, v.ties), rs, v

    p1, _, v1 = point(64, {"naive-inplace": [1.0] * 6, "flash": [2.0] * 6, "auto": [2.0] * 6})
    p2, rs, v = point(128, {"naive-inplace": [5.0] * 6, "flash": [3.0] * 6, "auto": [3.0] * 6})
    workload = {"mode": "prefill", "batch": 2}
    d, last, points = decide_sweep([p1, p2], [v1, v], rs, workload, {}, None, [], ())
    r = Report(tuple(ranked(rs, last)), {}, workload, {}, ranking=last.order, decision=d, sweep=points)
    first = r.recommendation.splitlines()[0]
    assert first.startswith(f"Keep the model's own attention (`{r.pick}`) over seq 64–128") and r.pick == "auto"
    assert r.deploy.pick == r.pick and r[r.pick].margin.ratio == 1.0
    table = next(t for t in _tables(r) if "vs pick" in t.headers)
    pick_row = next(row for row in table.rows if row[table.headers.index("vs pick")] == "pick")
    assert pick_row[0] == r.pick  # the summary's pick is the answer's


def _tables(report):
    from attnswitch.render.document import Table, walk
    from attnswitch.render.sections import sections

    return [b for b in walk(sections(report)) if isinstance(b, Table)]


def test_an_old_report_loads_with_its_decision():
    results = [fixed("flash", [10.0] * 6), fixed("math", [20.0] * 6)]
    r = report_of(results)
    data = json.loads(r.to_json())
    d = data.pop("decision")
    data.update(schema_version=4, recommendation=d["headline"] + "\n" + "\n".join(d["reasons"]), ties=d["ties"],
                cautions=d["cautions"], deploy={k: v for k, v in d["deploy"].items() if k not in ("where", "keep")})
    back = Report.from_json(json.dumps(data))
    assert back.pick == "flash" and back.recommendation == r.recommendation and back.deploy.attnswitch == \
        r.deploy.attnswitch


def test_a_cpu_compare_decides_once_and_every_writer_reads_it(cpu_report):
    d = cpu_report.decision
    assert d.answered and cpu_report.pick == d.pick == d.deploy.pick
    assert d.headline in cpu_report.to_markdown() and d.headline in str(cpu_report)
    doc = attnswitch.deploy.policy_document(cpu_report)
    assert doc["selection"] == d.pick and doc["ties"] == list(d.ties) and doc["recommendation"] == d.text
    assert dataclasses.asdict(Report.from_json(cpu_report.to_json()).decision) == dataclasses.asdict(d)


def test_the_first_plot_is_the_ranked_time_with_the_tie_marked_as_the_table_has_it():
    from attnswitch.render.document import Figure, walk
    from attnswitch.render.sections import sections

    results = [fixed("naive", [9.8, 10.1, 9.9, 10.0, 10.2, 9.7], host_ms=50.0),
               fixed("flash", [10.0, 10.0, 10.1, 9.9, 10.2, 10.0], host_ms=1.0), fixed("math", [20.0] * 6, host_ms=2.0)]
    r = report_of(results)
    first = next(b for b in walk(sections(r)) if isinstance(b, Figure)).chart  # the report's first plot
    assert "against the pick" in first.title and f"({r.pick})" in first.title
    series = dict(first.series)
    tied, apart = series["the pick and those tied with it"], series["told apart (slower)"]
    for name, t, a, err in zip(first.categories, tied, apart, first.errors):
        m = r[name].margin
        assert (t if name in r.ties else a) == m.ratio and (t is None) == (name not in r.ties)
        assert err is None if name == r.pick else err == (m.low, m.high)
    assert first.categories[0] == r.pick and set(first.categories) == set(r.ranking)


@pytest.mark.parametrize("rounds", [2, 6])
def test_the_recommendation_and_the_reports_timing_text_say_what_the_brackets_are_in_the_same_words(rounds):
    # two rounds: the brackets are the whole range of the ratios (50 % coverage), which tells nothing apart; six:
    # the 95 % interval. The recommendation's Margins line and the Summary's note are written from one sentence.
    from attnswitch.stats import bracket_words

    results = [fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0][:rounds]),
               fixed("naive", [15.0, 15.5, 15.2, 15.1, 15.3, 15.4][:rounds])]
    r = report_of(results)
    words = bracket_words([next(b for b in r.backends if b.backend == "naive").margin.coverage])
    assert (words == "its 95% interval") == (rounds == 6)
    md = to_markdown(r)
    assert words in r.recommendation and md.count(words) >= 2, md
    if rounds == 2:
        assert "naive" in r.ties and "95% interval" not in r.recommendation


def test_eager_timed_in_fewer_rounds_is_described_where_its_bracket_is_shown():
    # eager is ranked as the reference, never a candidate: the Margins line describes the candidates' margins it
    # lists (95 % intervals); the Summary shows eager's too, a range of 2 rounds, and its note and chart say so
    from attnswitch.render.charts import ranking_chart
    from attnswitch.stats import bracket_words, margin_coverages

    results = [fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
               fixed("naive", [15.0, 15.5, 15.2, 15.1, 15.3, 15.4]), fixed("eager", [16.0, 16.4])]
    r = report_of(results)
    assert bracket_words(margin_coverages(r.backends, r.pick, eager=False)) == "its 95% interval"
    assert "its 95% interval, over 6 paired rounds" in r.recommendation
    shown = bracket_words(margin_coverages(r.backends, r.pick))
    assert shown.startswith("its 95% interval, or, for a backend timed in fewer paired rounds, the range")
    assert shown in to_markdown(r)
    assert ranking_chart(r.backends, r.pick, r.ties).y_label.endswith(
        "(95% interval; with fewer rounds, the range of the ratios)")


def test_a_mix_of_rounds_says_which_brackets_are_ranges():
    from attnswitch.render.charts import ranking_chart
    from attnswitch.stats import bracket_words, margin_coverages

    results = [fixed("flash", [10.0, 10.1, 9.9, 10.0, 10.2, 10.0]),
               fixed("naive", [15.0, 15.5, 15.2, 15.1, 15.3, 15.4]), fixed("math", [17.0, 17.2])]
    r = report_of(results)
    words = bracket_words(margin_coverages(r.backends, r.pick))
    assert words.startswith("its 95% interval, or, for a backend timed in fewer paired rounds, the range of its ratios")
    assert words in r.recommendation and words in to_markdown(r)
    assert "slower only where the interval excludes 1" in r.recommendation
    assert ranking_chart(r.backends, r.pick, r.ties).y_label.endswith("with fewer rounds, the range of the ratios)")
    only_short = report_of([fixed("flash", [10.0, 10.1]), fixed("math", [17.0, 17.2])])
    chart = ranking_chart(only_short.backends, only_short.pick, only_short.ties)
    assert chart.y_label.endswith("(range of the ratios)")
