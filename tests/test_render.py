"""Rendering: the console fits 120 columns and shows only columns with data; the HTML page is one
self-contained file whose every plot has data, the first the ranked time against the pick, drawn as the answer
reads the margins; the plot helpers for other workloads."""

import dataclasses
import html
import importlib
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import matplotlib
import pytest
from conftest import batch_for, tiny
from reports_fixed import fixed, report_of

from attnswitch import render
from attnswitch.render import charts, plots
from attnswitch.render.console import fit_columns, fit_header
from attnswitch.render.document import EMPTY, Figure, Section, Table, drop_empty_columns, has_data, walk
from attnswitch.render.html import page_html
from attnswitch.render.sections import PERFETTO, environment_table, sections, summary_table
from attnswitch.results import Report, TrainStats

ROOT = Path(__file__).resolve().parents[1]
RECORDED = {
    "h200 prefill": ROOT / "benchmarks/results/h200/compare_prefill.json",
    "h200 decode": ROOT / "benchmarks/results/h200/compare_decode.json",
    "h200x2 device_map": ROOT / "tests/data/dm_report.json",
    "h200x2 tensor parallel": ROOT / "tests/data/tp_report.json",
}
DEVICE_COLUMNS = ("kernels/fwd", "memcpy/fwd", "kernels/attn", "memcpy/attn", "peak MB")


@pytest.fixture(params=[*RECORDED, "cpu"])
def report(request, cpu_report):
    return cpu_report if request.param == "cpu" else Report.from_json(RECORDED[request.param])


def _summary_lines(text: str) -> list[str]:
    """The lines of the console output up to the end of the summary (the table and its notes)."""
    lines = text.splitlines()
    end = next((i for i, line in enumerate(lines) if line in ("Not run", "Notes", "Per layer")), len(lines))
    return lines[:end]


def test_console_summary_fits_120_columns_and_has_no_empty_column(report):
    text = render.to_text(report, width=120, layers=False)
    lines = _summary_lines(text)
    table = summary_table(report)
    # the table fits 120 columns (its rule and its rows; prose is not wrapped, a line is as long as its text)
    names = [[row[0]] for row in table.rows]
    assert lines and max(len(line) for line in lines if line.startswith("─") or line.split()[:1] in names) <= 120
    for i, header in enumerate(table.headers):
        assert any(row[i] not in EMPTY for row in table.rows), header
    # no truncated cell: every value of the table is on the screen as it is
    for row in table.rows:
        line = next(line for line in lines if line.split()[:1] == [row[0]])
        assert line.split() == [w for cell in row for w in cell.split()]
    if report.recommendation:
        assert sum("Recommendation: " in line for line in lines) == 1


def test_cpu_summary_leaves_out_device_columns_and_a_gpu_summary_keeps_them(cpu_report):
    cpu = summary_table(cpu_report)
    gpu = summary_table(Report.from_json(RECORDED["h200 prefill"]))
    assert not set(DEVICE_COLUMNS) & set(cpu.headers)
    assert set(DEVICE_COLUMNS) <= set(gpu.headers)
    assert {"time/fwd ms", "host/attn µs", "max rel err"} <= set(cpu.headers)
    text = render.to_text(cpu_report, width=120, layers=False)
    assert "unavailable" in text and "cudnn unavailable at model.layers.0.self_attn" in text


def test_layers_are_behind_the_flag_and_str_keeps_them(cpu_report):
    short = render.to_text(cpu_report, width=120, layers=False)
    assert "per layer (per forward)" not in short
    assert "flash: per layer (per forward)" in str(cpu_report)
    assert "model.layers.*.self_attn [attention] ×2" in str(cpu_report)
    unfolded = render.to_text(cpu_report, width=120, layers=True, fold=False)
    assert "model.layers.1.self_attn [attention]" in unfolded
    # a CPU run counts no device events: those columns are left out of the layer tables too
    layer_table = next(b for b in walk(sections(cpu_report)) if isinstance(b, Table) and "per layer" in b.title)
    assert not {"kernels", "memcpy", "memset", "GPU µs"} & set(layer_table.headers)


def test_wide_layer_tables_keep_names_whole_and_never_cut_numbers():
    rep = Report.from_json(RECORDED["h200x2 tensor parallel"])  # rank, GPU and collective columns
    text = render.to_text(rep, width=120)
    lines = {tuple(line.split()): line for line in text.splitlines()}
    for t in (b for b in walk(sections(rep)) if isinstance(b, Table) and "per layer" in b.title):
        shown, _ = fit_columns(t, 120)  # the columns that fit beside the names
        for row in t.rows:
            line = lines[tuple(w for i in shown for w in row[i].split())]  # every cell shown, whole
            assert len(line) <= 120, line


def test_fit_header_wraps_at_spaces_or_before_a_slash():
    assert fit_header("time/fwd ms", 7) == ("time/fwd\nms", 8)
    assert fit_header("kernels/fwd", 4) == ("kernels\n/fwd", 7)
    assert fit_header("backend", 13) == ("backend", 13)
    assert fit_header("peak MB", 4) == ("peak\nMB", 4)


def test_drop_empty_columns_keeps_the_first_and_every_column_with_data():
    t = Table("t", ("name", "a", "b", "c"), (("x", "-", "1", ""), ("y", "-", "-", "")), frozenset({"name", "c"}))
    d = drop_empty_columns(t)
    assert d.headers == ("name", "b") and d.rows == (("x", "1"), ("y", "-")) and d.left == frozenset({"name"})
    assert drop_empty_columns(Table("e", ("name", "a"), ())).headers == ("name", "a")


def test_heaviest_layers_are_marked():
    rep = Report.from_json(RECORDED["h200 prefill"])
    t = next(b for b in walk(sections(rep)) if isinstance(b, Table) and b.title == "cudnn: per layer (per forward)")
    gpu = t.headers.index("GPU µs")
    marked = sorted((float(r[gpu]) for r, k in zip(t.rows, t.row_kinds) if k == "strong"), reverse=True)
    assert len(marked) == 3 and marked == sorted((float(r[gpu]) for r in t.rows), reverse=True)[:3]
    assert "the 3 layers with the most GPU time" in t.caption


def test_on_a_cpu_the_heaviest_are_leaves_by_host_time(cpu_report):
    # host time includes the children's: the model's row and its containers are never the heaviest
    t = next(b for b in walk(sections(cpu_report)) if isinstance(b, Table) and b.title.startswith("flash: per layer"))
    names = [r[0] for r in t.rows]
    marked = [n for n, k in zip(names, t.row_kinds) if k == "strong"]
    assert len(marked) == 3 and "LlamaForCausalLM" not in marked
    assert all(n.endswith("[attention] ×2") or not any(o.startswith(n.split(" ")[0] + ".") for o in names)
               for n in marked)


def test_the_models_row_is_no_leaf_in_any_phase_of_a_training_step_or_a_generate():
    # the model's row holds its phase's top-level rows, not every phase's: a training step's backward rows
    # (or a generate's decode rows) beside it must not make it a leaf, nor the heaviest
    from attnswitch.render.sections import _heaviest, _leaves
    from attnswitch.results import LayerStats

    def row(path, host, phase=None):
        return LayerStats(path, "module", 1, 0, 0, 0, 0, host, 1, phase=phase)

    for phases in ((None, "backward"), ("prefill", "decode")):
        rows = [row("LlamaForCausalLM", 5564.0, phases[0]), row("model", 4000.0, phases[0]),
                row("model.layers.0.mlp.gate_proj", 531.0, phases[0]), row("model.layers.0.mlp.up_proj", 451.0,
                                                                              phases[0]),
                row("lm_head", 1500.0, phases[0]), row("model.layers.0.mlp.down_proj", 362.0, phases[0]),
                row("model", 9000.0, phases[1]), row("model.layers.0.mlp.gate_proj", 900.0, phases[1]),
                row("lm_head", 3000.0, phases[1])]
        leaves = {(rows[i].path, rows[i].phase) for i in _leaves(rows)}
        assert ("LlamaForCausalLM", phases[0]) not in leaves and ("model", phases[1]) not in leaves
        assert {rows[i].path for i in _heaviest(rows, gpu=False)} == {"lm_head", "model.layers.0.mlp.gate_proj"}


def test_a_layer_table_says_which_rows_host_time_holds_their_childrens():
    # forward rows are ranges (a module's holds its children's time); backward rows and the row outside modules
    # are their own ops' time only: read alike, a backward parent looks cheaper than its own child
    from attnswitch.render.sections import layer_table
    from attnswitch.results import LayerStats

    def row(path, host, phase=None, kind="module"):
        return LayerStats(path, kind, 1, 0, 0, 0, 0, host, 1, phase=phase)

    train = (row("model.layers.0", 900.0), row("model.layers.0.mlp", 600.0), row("model.layers.0", 37.5, "backward"),
             row("model.layers.0.mlp", 14912.1, "backward"), row("(outside modules)", 80.0, kind="outside"))
    r = report_of([fixed("flash", [10.0] * 6, layers=train)], {"mode": "train"})
    caption = layer_table(r, "flash").caption
    assert "host µs: a forward row includes its children's; a backward row or the row outside modules: its own " \
           "ops' only" in caption, caption
    r = report_of([fixed("flash", [10.0] * 6, layers=train[:2])])
    assert "host µs" not in layer_table(r, "flash").caption  # nothing but ranges: nothing to tell apart
    r = report_of([fixed("flash", [10.0] * 6, layers=(*train[:2], train[4]))])
    assert "host µs: a forward row includes its children's; the row outside modules: its own ops' only" in \
        layer_table(r, "flash").caption


# -- the HTML page ----------------------------------------------------------------------------------

_ATTR_URL = re.compile(r"""(?:src|href|action|poster|data)\s*=\s*["']?\s*([a-z][a-z0-9+.-]*:)""", re.I)


def test_html_is_one_file_with_no_external_url_and_every_plot_has_data(report, tmp_path):
    html = report.write_html(tmp_path / "report.html").read_text()
    assert not list(tmp_path.iterdir())[1:]  # one file
    assert "<link" not in html and "@import" not in html
    assert re.search(r"url\(\s*['\"]?(?!#)", html) is None  # only the SVGs' own clip paths
    assert re.search(r"<(?:script|img|iframe)[^>]*\ssrc=", html) is None
    assert set(_ATTR_URL.findall(html)) <= {"https:"}
    assert re.findall(r'href="(https?://[^"]*)"', html) == [PERFETTO] * len(re.findall(r'href="http', html))
    figures = [b for b in walk(sections(report)) if isinstance(b, Figure)]
    assert figures and all(has_data(f.chart) for f in figures)
    points = [int(n) for n in re.findall(r'<figure class="plot" data-points="(\d+)"', html)]
    assert len(points) == len(figures) == html.count("<svg") and all(points)
    assert html.index('id="recommendation"' if report.recommendation else 'id="summary"') < html.index("<table")
    assert '<table class="sortable">' in html


def test_html_leaves_out_plots_without_data_and_says_why(cpu_report, tmp_path):
    html = render.to_html(cpu_report)
    assert "Attention: device time per call" not in html
    assert "No device time on this run (CPU)" in html
    assert "Numerics: max relative error" in html
    profile_only = Report.from_json(RECORDED["h200x2 tensor parallel"])  # profiled, numerics not checked
    html = render.to_html(profile_only)
    assert "Numerics: max relative error" not in html and "No numerics in this report" in html


def test_html_has_the_sections_a_reader_needs():
    rep = Report.from_json(RECORDED["h200 prefill"])
    html = render.to_html(rep)
    order = ['id="recommendation"', 'id="summary"', 'id="plots"', 'id="layers"', 'id="notes"', 'id="environment"',
             'id="traces"']
    assert [html.index(s) for s in order] == sorted(html.index(s) for s in order)
    assert "repeated k/v heads x4" in html  # the GQA note
    assert '<a href="traces/trace_cudnn.json.gz">' in html and "Open trace file" in html
    assert html.count("<details") == len(rep.ranking) and "<details id=\"layers-cudnn\" open>" in html
    assert "NVIDIA H200" in html and "9.19.0" in html and "91900" not in html
    assert '<tr class="strong"><td class="text">cudnn</td>' in html


def test_html_lists_refusals_with_pytorchs_reasons(cpu_report):
    html = render.to_html(cpu_report)
    assert 'id="not-run"' in html and "the cudnn backend runs only on CUDA tensors" in html


def test_markdown_has_no_plots_but_everything_else(cpu_report):
    md = cpu_report.to_markdown()
    assert "## Summary" in md and "## Not run" in md and "## Environment" in md and "<svg" not in md
    head = cpu_report.recommendation.splitlines()[0]
    assert f"**Recommendation: {head}**" in md and head.startswith(("Use `", "Tie: `"))
    assert all(f"- {line}" in md for line in cpu_report.recommendation.splitlines()[1:])
    assert "(traces/" in md or not any(b.trace_path for b in cpu_report.backends)


# -- plots ------------------------------------------------------------------------------------------

def test_plot_helpers_take_plain_sequences():
    fig = plots.line_plot("t", "seq", "ms", {"flash": [(1024, 2.0), (512, 1.0)], "math": [(512, 3.0)]})
    ax = fig.axes[0]
    assert [list(line.get_xdata()) for line in ax.get_lines()] == [[512, 1024], [512]]
    assert ax.get_xlabel() == "seq" and ax.get_ylabel() == "ms"
    fig = plots.bar_plot("t", ["a", "b"], {"x": [1.0, None], "y": [2.0, 3.0]}, "ms", stacked=True)
    assert len(fig.axes[0].patches) == 4


def test_workload_charts_draw_with_data():
    steps = charts.step_time_chart({"flash": [9.0, 1.1, 1.2], "cudnn": [30.0, 1.0, 1.0]})
    assert dict(steps.series)["flash"] == ((1.0, 9.0), (2.0, 1.1), (3.0, 1.2)) and steps.x_label == "step"
    train = charts.train_time_chart(["flash", "math"], [10.0, 30.0], [20.0, 80.0])
    assert train.stacked and dict(train.series)["backward"] == (20.0, 80.0)
    sweep = charts.sweep_chart({"flash": [(2048, 4.0), (1024, 1.0)]})
    assert dict(sweep.series)["flash"] == ((1024.0, 1.0), (2048.0, 4.0)) and sweep.log_x and sweep.log_y
    for chart in (steps, train, sweep):
        assert has_data(chart)
        assert plots.svg(plots.draw(chart)).startswith("<svg")
    assert not has_data(charts.step_time_chart({})) and charts.numerics_chart([]) is None


def test_a_section_of_another_workload_is_blocks_and_a_figure(cpu_report):
    extra = Section("Generation", (Figure(charts.step_time_chart({"flash": [5.0, 1.0, 1.1]}), "per step"),),
                    key="generation")
    html = page_html([*sections(cpu_report), extra])
    assert '<section id="generation">' in html and 'href="#generation"' in html
    assert "Generation: time per step" in html
    assert "Generation" not in render.to_text(cpu_report)  # writers of text leave figures out


def test_plots_leave_the_callers_matplotlib_alone(cpu_report):
    backend, rc = matplotlib.get_backend(), dict(matplotlib.rcParams)
    had_pyplot = "matplotlib.pyplot" in sys.modules
    render.to_html(cpu_report)
    assert matplotlib.get_backend() == backend and dict(matplotlib.rcParams) == rc
    assert ("matplotlib.pyplot" in sys.modules) == had_pyplot


def test_folding_keeps_different_sublayers_of_a_repeated_block_apart():
    from attnswitch.render.sections import fold
    from attnswitch.results import LayerStats

    paths = [f"decoder.block.{b}.layer.{i}.{name}" for b in range(3)
             for i, name in enumerate(("SelfAttention", "EncDecAttention", "DenseReluDense"))]
    rows = fold([LayerStats(p, "module", 1, 0, 0, 0, 0.0, 0.0, 0) for p in paths])
    assert sorted((r.path, r.folded) for r in rows) == [
        ("decoder.block.*.layer.0.SelfAttention", 3), ("decoder.block.*.layer.1.EncDecAttention", 3),
        ("decoder.block.*.layer.2.DenseReluDense", 3)]


def test_the_environment_shows_the_commands_own_time_as_rows_in_seconds(cpu_report):
    rows = dict(environment_table(cpu_report).rows)
    spent = cpu_report.settings["time_s"]
    assert rows["time: total"] == f"{spent['total']:.2f} s" and rows["time: naive"] == f"{spent['naive']:.2f} s"
    assert not any(v.startswith("{") for v in rows.values())  # no mapping printed as Python writes it
    html = render.to_html(cpu_report)
    assert ">time: total</td>" in html and "{&#x27;" not in html and "{'" not in html


def test_a_cpu_report_of_every_backend_names_those_that_cannot_run_here_and_why():
    import attnswitch
    from attnswitch.backends import default_backends, registry

    m = tiny("llama")
    r = attnswitch.profile(m, batch_for(m, pad=False), warmup=0, iters=1, profile_steps=0)  # every backend
    left = r.settings["not_offered"]
    compared = [n for n, b in registry.REGISTRY.items() if b.compared]
    assert sorted(left) == sorted(set(compared) - set(default_backends("cpu")))
    assert {"efficient", "cudnn", "flex"} <= set(left) and set(left.values()) == {"CUDA only"}
    line = f"Not offered here: {', '.join(left)} (CUDA only)"
    assert line in render.to_text(r) and line in r.to_markdown() and line in render.to_html(r)
    assert not any("not offered" in item for item, _ in environment_table(r).rows)  # said once, in Not run


def test_a_profile_never_explains_a_vs_pick_column_it_does_not_have(capsys):
    # a profile ranks nothing: its Summary has no vs pick column, and its footnote explained one (and ≈ and bold)
    from rich.console import Console

    import attnswitch

    m = tiny("llama")
    rep = attnswitch.profile(m, batch_for(m), backends=["naive", "flash"], warmup=0, iters=2, rounds=2,
                             time_budget_s=0)
    text = " ".join(rep.to_markdown().split())
    assert "| vs pick |" not in text and "vs pick:" not in text and "≈ and bold" not in text
    rep.render(Console(width=40, file=sys.stdout, force_terminal=False))
    out = capsys.readouterr().out
    assert "left out at 40 columns" in out and "a wider terminal shows them, as do report.md and report.html (--out)" \
        in " ".join(out.split())


# -- the summary's first figure: the time of each backend against the pick ------------------------------

def test_the_htmls_first_plot_is_the_ranked_time_in_a_training_report():
    from attnswitch.render.document import Figure, walk
    from attnswitch.render.sections import sections

    rs = [fixed("flash", [10.0] * 6, train=TrainStats(forward_ms=3.0, backward_ms=7.0)),
          fixed("math", [20.0, 20.1, 19.9, 20.0, 20.2, 20.0], train=TrainStats(forward_ms=6.0, backward_ms=14.0))]
    r = report_of(rs, {"mode": "train"})
    first = next(b for b in walk(sections(r)) if isinstance(b, Figure)).chart
    # the ranked time comes first, before "Training: time per step" (forward and backward medians)
    assert "against the pick" in first.title, first.title


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
    # flash is behind naive-inplace, not told apart from the pick. A wrong chart would draw it in the series "told
    # apart (slower)" with its interval [0.82–1.29] against the pick, under the caption "a backend whose interval
    # holds 1 is tied with the pick", beside the answer's "not told apart from `naive` itself"
    for name in drawn_apart:
        m = r[name].margin
        assert m.low > 1, (name, m.text(), fig.caption)
    assert "flash" in fig.chart.categories and "flash" not in drawn_apart  # drawn, as behind a tied one


def test_the_summarys_legend_says_eager_the_reference_is_never_marked_tied():
    # eager's interval against the pick may hold 1 while it carries no ≈: the legend says why, where it is shown
    from reports_fixed import _steady, fixed, report_of

    with_eager = report_of([fixed("flash", _steady(10.0)), fixed("eager", _steady(12.0))])
    assert "never `eager`, the reference" in " ".join(with_eager.to_markdown().split())
    without = report_of([fixed("flash", _steady(10.0)), fixed("math", _steady(12.0))])
    assert "never `eager`" not in " ".join(without.to_markdown().split())


@pytest.mark.parametrize("mode, unit", [("prefill", "forward"), ("train", "training step")])
def test_a_sweeps_chart_names_what_its_times_are_of(mode, unit):
    # a generate sweep's chart said "ms per forward" under a title "per generate workload"
    from reports_fixed import _steady, fixed, sweep_report

    from attnswitch.render.document import Figure

    sections = importlib.import_module("attnswitch.render.sections")  # (the package's ``sections`` is a function)

    rep = sweep_report([(s, [fixed("flash", _steady(s / 100)), fixed("math", _steady(s / 50))]) for s in (64, 128)],
                       {"mode": mode})
    chart = next(b.chart for b in sections._sweep(rep, sections.Options()).blocks if isinstance(b, Figure))
    assert chart.y_label == f"ms per {unit}" and chart.title.startswith(f"Time per {unit} against")
    caption = next(b.caption for b in sections._sweep(rep, sections.Options()).blocks if isinstance(b, Figure))
    assert caption.startswith(f"Time per {unit} against")
    table = next(b for b in sections._sweep(rep, sections.Options()).blocks if isinstance(b, Table))
    assert table.title == f"Sweep: time per {unit} (ms)"  # (a prefill's said "per step")


def test_a_long_title_over_a_narrow_plot_is_wrapped_and_steps_get_whole_ticks():
    # the ranked-time chart of a generate ("Time per generate workload against the pick, `naive`") was clipped at
    # both ends of a narrow figure; a two-step line had ticks at 1.2, 1.4, ...
    fig = plots.bar_plot("Time per generate workload against the pick, `naive`", ["naive", "math"],
                         {"the pick": [1.0, 1.1], "tied": [None, None]}, "x the pick's time")
    lines = fig.axes[0].get_title().splitlines()
    assert len(lines) > 1 and " ".join(lines) == "Time per generate workload against the pick, `naive`"
    for times in ([5.0, 1.0], [5.0]):  # (one point too)
        fig = plots.draw(charts.step_time_chart({"flash": times}))
        fig.canvas.draw()
        assert all(float(t).is_integer() for t in fig.axes[0].get_xticks())
    name = "sliding_attention=flex/full_attention=cudnn"  # a backend's name is never split
    fig = plots.bar_plot(f"Time per forward against the pick, `{name}`", ["a", "b"], {"x": [1.0, 1.1], "y": [1, 2]},
                         "ms")
    assert any(f"`{name}`" in line for line in fig.axes[0].get_title().splitlines())


def test_log_axes_are_labelled_in_plain_numbers_and_a_sweeps_lengths_are_its_ticks():
    # a sweep over 16 and 48 was ticked at 2^4 and 2^5 (48 unlabelled), its times labelled 4 × 10^0, ...
    fig = plots.line_plot("t", "sequence length", "ms", {"a": [(16, 4.1), (48, 5.9)], "b": [(16, 4.4), (48, 6.8)]},
                          log_x=True, log_y=True)
    fig.canvas.draw()
    ax = fig.axes[0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["16", "48"]
    lo, hi = ax.get_ylim()
    shown = [t.get_text() for t in ax.get_yticklabels() + ax.get_yticklabels(minor=True)
             if t.get_text() and lo <= t.get_position()[1] <= hi]
    assert shown and all(re.fullmatch(r"\d+(\.\d+)?", t) for t in shown), shown
    bars = plots.bar_plot("t", ["a", "b"], {"x": [120.0, 340.0]}, "µs", log=True)
    bars.canvas.draw()
    lo, hi = bars.axes[0].get_ylim()
    assert {"200", "300"} <= {t.get_text() for t in bars.axes[0].get_yticklabels(minor=True) +
                                     bars.axes[0].get_yticklabels() if lo <= t.get_position()[1] <= hi}


def test_a_model_path_with_markup_stays_text_and_the_command_one_code_span(cpu_report):
    # a path with a backtick split the HTML's reproduce line into code and text (copying it gave another command),
    # and report.md's title let `<b>` through as markup
    path = "weird/m|o <b>x</b> & `y`"
    command = f"attnswitch compare '{path}' --seq 8"
    r = dataclasses.replace(cpu_report, model=path, command=command)
    page = render.to_html(r)
    assert f"<code>{html.escape(command, quote=False)}</code>" in page
    md = r.to_markdown()
    assert md.splitlines()[0] == r"# attnswitch report: weird/m\|o \<b\>x\</b\> \& \`y\`"
    assert f"reproduce: `` {command} ``" in md or f"reproduce: ``{command}``" in md

    class Ids(HTMLParser):
        def __init__(self):
            super().__init__()
            self.ids = []

        def handle_starttag(self, tag, attrs):
            self.ids += [v for k, v in attrs if k == "id"]

    ids = Ids()
    ids.feed(page)
    # every id once (matplotlib numbers each figure's figure_1, axes_1, ... alike), and every reference resolves
    assert ids.ids and len(ids.ids) == len(set(ids.ids)), [i for i in set(ids.ids) if ids.ids.count(i) > 1][:5]
    refs = {a or b for a, b in re.findall(r'url\(#([^)]+)\)|xlink:href="#([^"]+)"', page)}
    assert refs and refs <= set(ids.ids)


def test_a_plots_title_is_plain_text_no_markup(report):
    # matplotlib draws a title as it is: "against the pick, `auto`" showed its backticks
    titles = [b.chart.title for b in walk(sections(report)) if isinstance(b, Figure)]
    assert titles and not [t for t in titles if "`" in t], titles


def test_slow_calls_listed_against_their_steady_call_and_the_rest_counted():
    from attnswitch.results import GenerateStats, SlowCall
    calls = tuple(SlowCall(0, step, "model.layers.0.self_attn", 900.0 + step, 16 + step, 150.0) for step in range(7))
    g = GenerateStats(slow_attn_calls=9, slow_calls=calls)
    r = report_of([fixed("flash", [10.0] * 6, generate=g)], {"mode": "generate"})
    text = render.to_markdown(r)
    assert "step 0, model.layers.0.self_attn, key length 16: 900 µs (steady 150)" in text
    assert "step 4, " in text and "step 5, " not in text  # five listed
    assert "and 4 more" in text  # of the 9 counted, not of the 7 kept


def test_a_failed_screenshot_leaves_the_png_that_was_there_and_says_why_in_a_line(tmp_path, capsys):
    from attnswitch.render import screenshot

    png = tmp_path / "shot.png"
    png.write_bytes(b"an earlier screenshot")
    assert screenshot.main([str(tmp_path / "missing.html"), str(png)]) == 1
    assert png.read_bytes() == b"an earlier screenshot"
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "missing.html: no such page" in err and err.count("\n") == 1


def test_no_column_is_shown_after_a_time_or_margin_that_does_not_fit():
    # at 40 columns the margin (18 wide) did not fit and the narrower error column beside it did: rows ordered by
    # a margin that was not shown, next to a column that is not what orders them
    t = Table("", ("backend", "time/fwd ms", "vs pick", "max rel err"),
              (("naive-inplace", "6.269", "1.02 [0.74–1.12]", "0.0e+00"), ("flash", "6.129", "pick", "6.2e-07")))
    shown, _ = fit_columns(t, 34)
    assert [t.headers[i] for i in shown] == ["backend", "time/fwd ms"]
    assert [t.headers[i] for i in fit_columns(t, 60)[0]] == list(t.headers)
    # a table of its own priority (the peak table) keeps every column that fits: its ranks are not times
    t = Table("", ("backend", "kernel µs/call", "achieved", "% of peak", "% of measured"),
              (("flash", "12.5", "512 TFLOP/s", "51.7 %", "61.0 % of 700.0 TFLOP/s"),), priority=(0, 2, 1, 0, 1))
    assert [t.headers[i] for i in fit_columns(t, 52)[0]] == ["backend", "kernel µs/call", "achieved", "% of peak"]
