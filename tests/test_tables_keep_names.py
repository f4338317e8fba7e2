"""Every table of every mode keeps each row's name whole, on one line, at any width, in a terminal or piped:
other columns are left out first. Piped output (and ``str(report)``) wraps no prose and ends no line in spaces.
Hand-made reports with the longest names a report meets (a policy per phase, a compiled candidate, a packaged
kernel, a multimodal model's layer paths)."""

import dataclasses
import io
import re

import pytest
from rich.console import Console

import attnswitch.comparison
from attnswitch import cli, render
from attnswitch.lengths import Lengths
from attnswitch.render.document import Callout, Heading, Section, Table, Text
from attnswitch.render.sections import sections
from attnswitch.results import (
    BackendResult,
    Decision,
    Deploy,
    DeviceStats,
    GenerateStats,
    LayerStats,
    Numerics,
    Report,
    SlowCall,
    SweepPoint,
    TrainStats,
    TransferStats,
)
from attnswitch.serving import serving_estimate
from attnswitch.stats import Margin

POLICY = "prefill=math/decode=flash/decode_max_query=4"
COMPILED = "naive-inplace+compile:reduce-overhead"
NAMES = (COMPILED, POLICY, "naive-inplace", "efficient", "cudnn", "flash", "math", "eager")
WIDTHS = (60, 80, 100, 120, 200)
PATHS = ("model.language_model.layers.{}.self_attn", "model.language_model.layers.{}.mlp.down_proj",
         "model.language_model.layers.{}.post_attention_layernorm")
SKIPPED = ("plots", "environment", "traces")  # sections the HTML page shows and text does not
DEPLOY = Deploy(POLICY, {"prefill": "math", "decode": "flash", "decode_max_query": 4}, None, "the serving process",
                f"import attnswitch\n\nattnswitch.patch(model, {POLICY!r})", None,
                ("a backend per phase: transformers has no such setting",),
                {"TORCHINDUCTOR_CACHE_DIR": "/tmp/torchinductor_root"}, {"torch": "2.11.0+cu130"},
                ("on another GPU than NVIDIA H200", "for lengths outside 200–2500 tokens"))
NAMING = ("phase", "rank", "GPU", "batch", "seq", "new", "prompt")  # columns that tell rows apart after the first


def _layers(phases=(None,), ranks=(None,)) -> tuple[LayerStats, ...]:
    rows = [LayerStats("LanguageModelForConditionalGeneration", "module", 1, 900, 3, 2, 4321.5, 98765.4, 1200,
                       devices=(0, 1))]
    rows += [LayerStats(path.format(i), "attention" if "self_attn" in path else "module", 1, 12, 1, 0, 123.4 + i,
                        2345.6, 40, devices=(i % 2,), rank=rank, phase=phase, comm_kernels=1, comm_us=12.5)
             for phase in phases for rank in ranks for i in range(16) for path in PATHS]
    return tuple(rows)


def _result(i: int, name: str, mode: str, **kw) -> BackendResult:
    ms = 100.0 + 7.3 * i
    margin = None if i == 0 else Margin(NAMES[0], 1.0 + 0.073 * i, 1.0 + 0.001 * i, 1.1 + 0.1 * i, 0.97, 24)
    slow = (SlowCall(0, 1, PATHS[0].format(0), 329407.0, 2485),)
    gen = GenerateStats(ttft_ms=12.345, step_ms_p50=5.678, step_ms_p90=8.9, step_ms_p99=9.9, workload_wall_ms=ms + 1,
                        tokens=128, tokens_per_s=1234.5, cold_e2e_ms=4567.8, new_shape_step_ms=53.9,
                        seen_shape_step_ms=6.7, slow_attn_calls=3, plan_cache_host_mb=94.1, slow_calls=slow,
                        step_times_ms=(9.0, 5.0, 5.1), cold_step_times_ms=(50.0, 7.0, 6.0),
                        token_agreement=0.984) if mode == "generate" else None
    train = TrainStats("cross-entropy of the next token", 40.1, 80.2, 3.1e-3, 1e-2, True,
                       "model.language_model.layers.15.self_attn.q_proj.weight") if mode == "train" else None
    phases = {"generate": ("prefill", "decode"), "train": (None, "backward")}.get(mode, (None,))
    return BackendResult(
        name, "ok", timer="cuda-events", time_ms=ms, time_rounds_ms=((ms,),) * 6, noise_pct=1.0, margin=margin,
        host_ms=23.45, cold_host_ms=7357.8, attn_host_us=326.6, peak_mem_mb=4686.0, kernels=665.0, memcpys=17.0,
        attn_kernels_per_call=24.0, attn_memcpys_per_call=1.0, attn_ops=("aten::_scaled_dot_product_cudnn_attention",),
        numerics=Numerics(2.8e-2, 1e-3, 1.0, 5e-2, True), generate=gen, train=train,
        layers=_layers(phases, ranks=(0, 1) if i < 2 else (None,)),
        devices=(DeviceStats(0, 0, 333, 1, 0, 9, 0.45, 0.05, 9.9, 2343, ms),
                 DeviceStats(1, 1, 332, 1, 0, 9, 1.6, 1.2, 10.1, 2343, ms)),
        transfers=(TransferStats(PATHS[1].format(7), "model.language_model.layers.8", 0, 1, 1, 2**20, 4.5),),
        **kw)


def _report(mode: str, **kw) -> Report:
    compiled = kw.pop("compiled", False)
    backends = [_result(i, n, mode) for i, n in enumerate(NAMES)]
    backends.append(BackendResult("fa2", "unavailable", ("flash-attn is not installed here",), package="flash-attn"))
    backends[2] = dataclasses.replace(backends[2], package="flash-attn 2.8.3")
    if compiled:
        backends[0] = dataclasses.replace(backends[0], compile="reduce-overhead", compile_ms=25123.0, graphs=3,
                                          recompiles=2, attn_seen="efficient", compile_pays_after=4567.0,
                                          attn_mismatch="ran efficient's kernel, uncompiled naive-inplace's own")
    decision = Decision("tie", NAMES[0], (NAMES[0], "cudnn"), NAMES[0], "", (
        f"Use `{POLICY}`: 100.000 ms per forward, 1.07x faster than the next beyond the noise, `{COMPILED}` (107.300 "
        "ms). Within measured noise of it: `cudnn`; any of these is as good here."), (
        "Margins: the median ratio of its time to the pick's and its 95% interval, over 6–25 paired rounds; slower "
        "only where the interval excludes 1.",), ("The machine was busy while measuring.",), DEPLOY)
    return Report(
        tuple(backends), {"device": "cuda", "gpu": "NVIDIA H200", "torch": "2.11.0+cu130", "transformers": "5.17.0",
                          "cudnn": 91900},
        {"mode": mode, "description": f"batch 4, seq 2048, {mode}", "dtype": "bfloat16"},
        {"rounds": 6, "host": {"rounds": 25, "stopped": "budget"}, "time_s": {"total": 41.5, POLICY: 1.5}},
        model="llama-3.2-1b", ranking=tuple(NAMES), decision=decision,
        command=f"attnswitch compare llama-3.2-1b --mode {mode} --backends {','.join(NAMES)} --out report/", **kw)


def _sweep(generate: bool) -> Report:
    new = 32 if generate else None
    points = []
    for seq in (200, 700, 2500):
        steps = GenerateStats(new_shape_step_ms=10.0, seen_shape_step_ms=5.0)
        rows = tuple(BackendResult(n, "ok", time_ms=100.0 + seq / 100 + i, time_rounds_ms=((100.0 + i,),) * 6,
                                   noise_pct=1.0, generate=steps) for i, n in enumerate(NAMES))
        points.append(SweepPoint(4, seq, rows, tuple(NAMES), (NAMES[0], NAMES[1], "naive-inplace"), new_tokens=new))
    serving = serving_estimate(points, Lengths.of({200: 5, 700: 3, 2500: 1}), 1000, new) if generate else None
    return _report("generate" if generate else "prefill", sweep=tuple(points),
                   serving=dataclasses.asdict(serving) if serving else None)


REPORTS = {"prefill": lambda: _report("prefill"), "decode": lambda: _report("decode"),
           "generate": lambda: _report("generate"), "train": lambda: _report("train"),
           "compiled": lambda: _report("prefill", compiled=True), "sweep": lambda: _sweep(False),
           "generate sweep with a serving estimate": lambda: _sweep(True)}


def _shown(blocks):
    """The blocks the console writes, in reading order."""
    for b in blocks:
        if isinstance(b, Section):
            if b.key not in SKIPPED:
                yield b
                yield from _shown(b.blocks)
        else:
            yield b


def _name(table: Table, row) -> tuple[str, ...]:
    n = 1
    while n < len(table.headers) and table.headers[n] in NAMING:
        n += 1
    return tuple(row[:n])


def _printed(report: Report, width: int, terminal: bool) -> str:
    console = Console(file=io.StringIO(), width=width, force_terminal=terminal, color_system=None,
                      soft_wrap=not terminal)
    render.to_console(report, console)
    return console.file.getvalue()


def _assert_every_row_named(report: Report, text: str, width: int) -> None:
    """Each table's rows, in order, each on a line that begins with its whole name; no row wider than the
    width, unless its name alone is."""
    lines = text.splitlines()
    at = 0
    tables = [b for b in _shown(sections(report)) if isinstance(b, Table)]
    assert tables
    for table in tables:
        for row in table.rows:
            name = _name(table, row)
            pattern = re.compile(r"\s*" + r"\s+".join(map(re.escape, name)) + r"(?=\s|$)")
            found = next((i for i in range(at, len(lines)) if pattern.match(lines[i])), None)
            assert found is not None, f"{table.title or table.headers[0]!r} at {width} columns: no row named {name}"
            named = pattern.match(lines[found]).end()
            assert len(lines[found]) <= max(width, named), lines[found]
            at = found + 1


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", REPORTS)
def test_every_row_keeps_its_name_in_a_terminal(kind, width):
    report = REPORTS[kind]()
    _assert_every_row_named(report, _printed(report, width, terminal=True), width)


@pytest.mark.parametrize("width", WIDTHS)
@pytest.mark.parametrize("kind", REPORTS)
def test_piped_every_row_keeps_its_name_and_no_prose_is_wrapped(kind, width):
    report = REPORTS[kind]()
    text = _printed(report, width, terminal=False)
    _assert_every_row_named(report, text, width)
    assert render.to_text(report, width=width) == text  # str(report) writes what a pipe gets
    lines = text.splitlines()
    assert not [line for line in lines if line != line.rstrip()]
    said = set(lines)
    for b in _shown(sections(report)):
        if isinstance(b, (Text, Heading)):
            assert b.text in said, b.text
        elif isinstance(b, Callout):
            assert f"{b.label}: {b.headline}" in said and all(f"  {r}" in said for r in b.reasons)
        elif isinstance(b, Table) and b.title:
            assert b.title in said, b.title


@pytest.mark.parametrize("terminal", [True, False])
def test_the_time_the_margin_and_the_answer_are_the_last_columns_to_go(terminal):
    keep = {"Summary": ("time/fwd ms", "vs pick", "max rel err"), "Generation": ("workload ms", "tokens agree"),
            "Training": ("step ms", "grad max rel err"), "Compiled": ("time ms", "mismatch"), "Sweep": ("best",)}
    for kind in ("compiled", "generate", "train", "sweep"):
        report = REPORTS[kind]()
        text = _printed(report, 100, terminal)
        lines = text.splitlines()
        for section in (b for b in sections(report) if isinstance(b, Section) and b.title in keep):
            table = next(b for b in section.blocks if isinstance(b, Table))
            start = lines.index(section.title)
            for row in table.rows:
                line = next(line for line in lines[start:] if line.split()[:1] == row[0].split()[:1])
                for h in keep[section.title]:
                    if h in table.headers:
                        assert row[table.headers.index(h)].split()[0] in line.split(), (h, line)
        assert "left out at 100 columns: " in text


def test_the_readmes_first_command_piped_keeps_the_backend_column(monkeypatch, capsys):
    # the README's first command on an H200 (every backend, every summary column, margins), into a file
    names = ("cudnn", "auto", "flex", "flash", "efficient", "naive-inplace", "naive", "eager", "math")
    backends = tuple(dataclasses.replace(_result(i, n, "prefill"), layers=(), devices=(), transfers=())
                     for i, n in enumerate(names))
    report = _report("prefill")
    report = dataclasses.replace(report, backends=backends, ranking=names, model="llama-3.2-1b",
                                 decision=dataclasses.replace(report.decision, pick="cudnn", ties=("cudnn", "auto")))
    monkeypatch.setattr(attnswitch.comparison, "compare", lambda model, work, **kw: report)
    monkeypatch.delenv("COLUMNS", raising=False)
    assert cli.main(["compare"]) == 0
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if line.startswith("─")) - 1
    assert out[header].split()[0] == "backend"
    for b in names:
        row = next(line for line in out if line.split()[:1] == [b])
        assert report[b].margin is None or report[b].margin.text().split("x [")[0] in row
    assert f"Recommendation: {report.recommendation.splitlines()[0]}" in out  # one line, whole
    assert not [line for line in out if line != line.rstrip()]
