"""Multi-GPU attribution and rank merging on CPU: real two-GPU traces recorded on H200s (tests/data),
a real tensor-parallel run over gloo under torchrun, and the command line's checks."""

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnswitch.cli import main
from attnswitch.profiling.attribution import OUTSIDE, attribute, device_totals, transfers
from attnswitch.profiling.distributed import _layout, merge_results
from attnswitch.profiling.summarize import backend_fields
from attnswitch.profiling.trace import Trace
from attnswitch.render.sections import layer_table
from attnswitch.results import SCHEMA_VERSION, BackendResult, DeviceStats, LayerStats, Report

DATA = Path(__file__).parent / "data"
BACKENDS = ["naive", "flash", "cudnn"]


def _load(name):
    return Trace.load(DATA / f"{name}.json.gz")


def _single_attention_kernels(backend):
    """Attention kernels per call of the single-GPU recording of the same architecture."""
    t = Trace.load(DATA / f"llama2l_{backend}.json.gz")
    rows = attribute(t, {s.step for s in t.steps()})
    return {r.kernels / r.calls for r in rows.values() if r.kind == "attention"}


def _same(xs, ys):
    assert len(xs) == len(ys)
    for x, y in zip(xs, ys):
        for k, v in dataclasses.asdict(x).items():
            w = getattr(y, k)
            assert (v == pytest.approx(w)) if isinstance(v, float) else v == w, (k, v, w)


# ---------------------------------------------------------------------------------------------
# accelerate device_map: one process, two GPUs (layers 0-1 on GPU 0, 2-3 and the head on GPU 1)

@pytest.mark.parametrize("backend", BACKENDS)
def test_device_map_every_device_event_has_its_gpu_and_totals_add_up(backend):
    t = _load(f"dm_{backend}")
    steps = {s.step for s in t.steps()}
    assert t.devices == [0, 1]
    raw = [e for e in t.device_events if e.step in steps]
    assert raw and all(e.device in (0, 1) for e in raw)
    per_dev = device_totals(t)
    for dev in (0, 1):
        mine = [e for e in raw if e.device == dev]
        tots = [x for x in per_dev if x.device == dev]
        assert sum(x.kernels for x in tots) == sum(e.kind == "kernel" for e in mine)
        assert sum(x.memcpys for x in tots) == sum(e.kind == "memcpy" for e in mine)
        assert sum(x.gpu_busy_us for x in tots) == pytest.approx(sum(e.dur for e in mine))
    # the rows' per-device event counts are a partition of the raw events too
    rows = attribute(t, steps)
    assert sum(sum(r.devices.values()) for r in rows.values()) == len(raw)


@pytest.mark.parametrize("backend", BACKENDS)
def test_device_map_layers_run_where_the_map_put_them(backend):
    t = _load(f"dm_{backend}")
    rows = attribute(t, {s.step for s in t.steps()})
    attn = {r.path: r for r in rows.values() if r.kind == "attention"}
    assert sorted(attn) == [f"model.layers.{i}.self_attn" for i in range(4)]
    for path, r in attn.items():
        assert set(r.devices) == ({0} if int(path.split(".")[2]) < 2 else {1}), (path, r.devices)
    # and the attention itself costs what it costs on one GPU
    per_call = {r.kernels / r.calls for r in attn.values()}
    if backend != "naive":  # the single-GPU recording has 2 q/kv-head ratios alike; naive's count is shape-free
        assert per_call == _single_attention_kernels(backend) == {1.0}


def test_device_map_copies_are_attributed_to_the_layer_boundary():
    t = _load("dm_flash")
    steps = {s.step for s in t.steps()}
    rows = {(x.after, x.into, x.src, x.dst): x for x in transfers(t, steps)}
    n = len(steps)
    # into GPU 1 where the map switches devices: the hidden states (2 x 64 x 256 bf16), rotary cos/sin and
    # the positions; the next layer on GPU 1 receives cos/sin/positions from GPU 0 again
    first = rows[("model.layers.1", "model.layers.2", 0, 1)]
    assert first.copies / n == 4 and first.bytes / n == 2 * 64 * 256 * 2 + 2 * 4096 + 512
    assert rows[("model.layers.2", "model.layers.3", 0, 1)].copies / n == 3
    # the logits go back to the inputs' GPU when the top-level forward returns
    back = rows[("lm_head", "LlamaForCausalLM", 1, 0)]
    assert back.bytes / n == 2 * 64 * 1024 * 2
    peers = [e for e in t.device_events if e.step in steps and e.peer is not None]
    assert sum(x.copies for x in rows.values()) == len(peers) and all(e.name.startswith("Memcpy PtoP") for e in peers)


def test_device_map_report_matches_its_traces_and_renders():
    rep = Report.from_json(DATA / "dm_report.json")
    assert rep.distribution["mode"] == "device_map"
    assert rep.distribution["layout"] == ("model.embed_tokens … model.layers.1 on cuda:0; "
                                          "model.layers.2 … lm_head on cuda:1")
    for backend in BACKENDS:
        t = _load(f"dm_{backend}")
        n = len(t.steps())
        b = rep[backend]
        for d in b.devices:
            raw = [e for e in t.device_events if e.device == d.device and e.step is not None]
            assert d.kernels * n == sum(e.kind == "kernel" for e in raw)
        assert sum(d.kernels for d in b.devices) == b.kernels
        # the report is what the analysis of its own trace gives
        fresh = backend_fields(t, attribute(t, {s.step for s in t.steps()}), cuda=True)
        _same([dataclasses.replace(d, peak_mem_mb=None) for d in b.devices], fresh["devices"])
        _same(b.transfers, fresh["transfers"])
    text = str(rep)
    assert "flash: per GPU (per forward)" in text and "copies between GPUs, by layer boundary" in text
    assert "model.layers.1 → model.layers.2" in text and "cuda:0 → cuda:1" in text
    assert "device_map over cuda:0, cuda:1" in text
    md = rep.to_markdown()
    assert "### flash: copies between GPUs, by layer boundary" in md and "| GPU |" in md


# ---------------------------------------------------------------------------------------------
# tensor parallelism: one process per GPU, recorded by each rank and merged by rank 0

@pytest.mark.parametrize("backend", BACKENDS)
def test_tp_each_rank_trace_is_its_own_gpu(backend):
    for rank in (0, 1):
        t = _load(f"tp_{backend}_rank{rank}")
        assert t.rank == rank and t.distributed["world_size"] == 2 and t.distributed["backend"] == "nccl"
        assert t.devices == [rank]


@pytest.mark.parametrize("backend", BACKENDS)
def test_tp_nccl_kernels_belong_to_the_layers_that_issued_them(backend):
    for rank in (0, 1):
        t = _load(f"tp_{backend}_rank{rank}")
        steps = {s.step for s in t.steps()}
        rows = attribute(t, steps)
        comm = {r.path: r.comm_kernels / r.calls for r in rows.values() if r.comm_kernels}
        # row-parallel projections all-reduce; the head gathers its column-parallel logits
        expect = {f"model.layers.{i}.{p}": 1.0 for i in range(4) for p in ("self_attn.o_proj", "mlp.down_proj")}
        assert comm == {**expect, "lm_head": 1.0}
        nccl = [e for e in t.device_events if e.step in steps and e.collective]
        assert all(e.name.startswith("ncclDevKernel_") for e in nccl)
        assert sum(r.comm_kernels for r in rows.values()) == len(nccl)
        assert all(r.comm_kernels == 0 for r in rows.values() if r.kind == "attention" or r.path == OUTSIDE)


def test_tp_merged_report_adds_up_to_each_ranks_raw_events():
    rep = Report.from_json(DATA / "tp_report.json")
    assert rep.distribution["mode"] == "tensor_parallel" and rep.distribution["devices"] == ["cuda:0", "cuda:1"]
    assert rep.distribution["tp_plan"]["model.layers.*.self_attn.o_proj"] == "rowwise"
    for backend in BACKENDS:
        b = rep[backend]
        assert {l.rank for l in b.layers} == {0, 1}
        for d in b.devices:
            t = _load(f"tp_{backend}_rank{d.rank}")
            n = len(t.steps())
            tots = [x for x in device_totals(t) if x.device == d.device]
            assert d.kernels * n == sum(x.kernels for x in tots)
            assert d.comm_kernels * n == sum(x.comm_kernels for x in tots) == 9 * n
            assert d.gpu_busy_ms * n * 1e3 == pytest.approx(sum(x.gpu_busy_us for x in tots))
            # the layer rows of this rank add up to its GPU's kernels
            assert sum(l.kernels for l in b.layers if l.rank == d.rank) == pytest.approx(d.kernels)
        assert b.kernels == sum(d.kernels for d in b.devices)
        assert b.time_ms == pytest.approx(max(d.time_ms for d in b.devices), rel=0.5)
    text = str(rep)
    assert "tensor parallel over 2 ranks (nccl)" in text and "comm µs" in text and "rank" in text


def _result(backend, samples, rank, **kw):
    return BackendResult(backend, "ok", time_ms=sorted(samples)[len(samples) // 2], time_samples_ms=tuple(samples),
                         kernels=10.0, memcpys=1.0, memsets=0.0, ops=5.0, profiled_gpu_busy_ms=2.0,
                         profiled_gpu_span_ms=3.0 + rank, peak_mem_mb=100.0 + rank, attn_kernels_per_call=1.0,
                         layers=(LayerStats("model", "module", 1, 10, 1, 0, 2000.0, 10.0, 5, rank=rank),),
                         devices=(DeviceStats(rank, rank, kernels=10.0),), **kw)


def test_merge_takes_the_slowest_rank_per_forward_and_sums_the_gpus():
    r0 = _result("flash", [5.0, 7.0, 6.0], 0)
    r1 = _result("flash", [6.0, 5.0, 8.0], 1)
    m = merge_results([r0, r1])
    assert m.time_samples_ms == (6.0, 7.0, 8.0) and m.time_ms == 7.0
    assert m.kernels == 20.0 and m.ops == 10.0 and m.profiled_gpu_busy_ms == 4.0
    assert m.profiled_gpu_span_ms == 4.0 and m.peak_mem_mb == 101.0
    assert [(d.rank, d.time_ms) for d in m.devices] == [(0, 6.0), (1, 6.0)]
    assert [l.rank for l in m.layers] == [0, 1]


def test_merge_reports_a_rank_that_failed_and_a_rank_that_differs():
    bad = BackendResult("cudnn", "unavailable", ("cuDNN refused",), "model.layers.0.self_attn")
    m = merge_results([_result("cudnn", [1.0], 0), bad])
    assert m.status == "unavailable" and m.reasons == ("rank 1: cuDNN refused",) and m.where == bad.where
    odd = dataclasses.replace(_result("flash", [1.0], 1), attn_kernels_per_call=3.0)
    m = merge_results([_result("flash", [1.0], 0), odd])
    assert any("rank 1 ran 3.0 attention kernels per call" in n for n in m.notes)


def test_layout_names_runs_of_modules_per_device():
    assert _layout({"a": 0, "b": 0, "c": 1, "d": "cpu"}) == "a … b on cuda:0; c on cuda:1; d on cpu"


def test_schema_1_reports_still_load(tmp_path):
    rep = Report.from_json(DATA / "tp_report.json")
    d = json.loads(rep.to_json())
    d["schema_version"] = 1
    d.pop("distribution")
    for b in d["backends"]:
        for k in ("devices", "transfers", "rank_trace_paths"):
            b.pop(k)
        for l in b["layers"]:
            for k in ("comm_kernels", "comm_us", "comm_ops", "devices", "rank"):
                l.pop(k)
    old = Report.from_json(json.dumps(d))
    assert old.distribution is None and old["flash"].devices == () and old.schema_version == SCHEMA_VERSION


# ---------------------------------------------------------------------------------------------
# a real tensor-parallel run on CPUs: torchrun, gloo, transformers' tp_plan="auto"

@pytest.fixture(scope="module")
def gloo_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("tp") / "out"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "attnswitch", "compare",
           "tiny-llama", "--tp", "--num-layers", "2", "--batch", "1", "--seq", "32", "--backends", "naive,flash,eager",
           "--iters", "2", "--warmup", "1", "--out", str(out)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "CUDA_VISIBLE_DEVICES": ""}  # gloo on CPUs, also on a GPU host
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=240, env=env)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    return out, p


@pytest.mark.slow  # torchrun with two processes, each importing torch and transformers
def test_gloo_tensor_parallel_compare_writes_once_from_rank_0(gloo_run):
    out, p = gloo_run
    assert sorted(x.name for x in out.iterdir()) == ["command.txt", "policy.json", "report.csv", "report.html",
                                                      "report.json", "report.md", "traces"]
    assert sorted(x.name for x in (out / "traces").iterdir()) == sorted(
        [f"trace_{b}_rank0.json.gz" for b in ("naive", "flash", "eager")]
        + [f"trace_{b}_rank1.json.gz" for b in ("naive", "flash", "eager")])
    assert p.stdout.count("Recommendation") == 1  # rank 1 printed nothing
    assert (out / "command.txt").read_text().startswith("torchrun --nproc-per-node 2 -m attnswitch compare")


@pytest.mark.slow  # torchrun with two processes, each importing torch and transformers
def test_gloo_tensor_parallel_report_has_both_ranks_and_their_collectives(gloo_run):
    out, _ = gloo_run
    rep = Report.from_json(out / "report.json")
    assert rep.distribution["mode"] == "tensor_parallel" and rep.distribution["backend"] == "gloo"
    assert rep.settings["numerics_reference"].startswith("eager attention computed in float32")
    for name in ("naive", "flash", "eager"):
        b = rep[name]
        assert b.ok and b.numerics.ok, (name, b.reasons, b.numerics)
        assert {l.rank for l in b.layers} == {0, 1}
        for rank in (0, 1):
            mine = {(l.path, l.kind): l for l in b.layers if l.rank == rank}
            for i in range(2):  # row-parallel projections: one all-reduce per call, issued inside them
                for proj in ("self_attn.o_proj", "mlp.down_proj"):
                    assert mine[(f"model.layers.{i}.{proj}", "module")].comm_ops == 1
            assert mine[("model.layers.0.self_attn", "attention")].comm_ops == 0
            assert sum(l.calls for l in mine.values() if l.kind == "attention") == 2
            # this rank's rows add up to its own trace's outermost ops
            t = Trace.load(out / "traces" / f"trace_{name}_rank{rank}.json.gz")
            assert t.rank == rank
            steps = {s.step for s in t.steps()}
            raw_ops = sum(1 for e in t.events if e.cat == "cpu_op" and not e.parent_is_op and e.step in steps)
            assert sum(l.ops for l in mine.values()) * len(steps) == raw_ops
    headers = layer_table(rep, "flash").headers
    assert "comm ops" in headers and "rank" in headers


# ---------------------------------------------------------------------------------------------
# the command line

@pytest.mark.parametrize("argv, message", [
    (["compare", "tiny-llama", "--tp"], "run under torchrun"),
    (["compare", "tiny-llama", "--device-map", "everywhere"], "use one of auto, balanced"),
    (["compare", "tiny-llama", "--device-map", "auto", "--tp"], "exclude each other"),
    (["compare", "tiny-llama", "--device-map", "auto", "--device", "cpu"], "place the model themselves"),
])
def test_cli_rejects_bad_distribution_options(argv, message, capsys, monkeypatch):
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(k, raising=False)
    assert main(argv) == 2
    assert message in " ".join(capsys.readouterr().err.split())


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU host device_map spreads it (tests/gpu)")
def test_cli_device_map_auto_on_a_cpu_loads_through_from_pretrained(tmp_path, capsys):
    assert main(["profile", "tiny-llama", "--num-layers", "1", "--device-map", "auto", "--backends", "naive",
                 "--iters", "1", "--warmup", "0", "--seq", "16", "--batch", "1",
                 "--out", str(tmp_path)]) == 0
    rep = Report.from_json(tmp_path / "report.json")
    assert rep.distribution is None  # everything fit on the one device there is
    assert "device_map auto" in capsys.readouterr().err
