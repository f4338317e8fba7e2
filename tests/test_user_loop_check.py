"""The user's-loop check (``benchmarks/user_loop.py``) on a CPU: its logic on tiny models, no verdict on the
numbers (those are the GPU's)."""

import json
import time

import pytest

from benchmarks import user_loop


def test_the_smoke_run_writes_a_row_per_backend_shape_and_workload(tmp_path):
    rc = user_loop.run(tmp_path, smoke=True, only="host-bound/train,gemma3/decode")
    assert rc == 0
    rows = json.loads((tmp_path / "user_loop_check.json").read_text())
    assert {(r["shape"], r["workload"], r["backend"]) for r in rows} == {
        (s, w, b) for s, w in (("host-bound", "train"), ("gemma3", "decode")) for b in user_loop.CPU_BACKENDS}
    for r in rows:
        assert {"backend", "shape", "workload", "compare_ms", "loop_ms", "ratio"} <= set(r)
        # the median of the blocks before and after pooled lies between the two sets' medians
        low, high = sorted((r["loop_before_ms"], r["loop_after_ms"]))
        assert low - 1e-3 <= r["loop_ms"] <= high + 1e-3 and r["blocks"] >= 2
        assert r["ratio"] == pytest.approx(r["compare_ms"] / r["loop_ms"], rel=1e-3)
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    assert [c["check"] for c in run["checks"]] == ["host-bound/train", "gemma3/decode"]
    assert all(c["status"] == "ok" and c["seconds"] > 0 for c in run["checks"])


def _fake_checks(monkeypatch, ratios: dict, sleep_s: float = 0.0):
    def check(model, shape, mode, names, turn=None, loop_s=None):
        time.sleep(sleep_s)
        r = ratios.get(f"{shape.name}/{mode}", 1.0)
        return {"rows": [{"backend": n, "shape": shape.name, "workload": mode, "compare_ms": 10.0 * r,
                          "loop_ms": 10.0, "ratio": r} for n in names]}

    monkeypatch.setattr(user_loop, "check", check)
    monkeypatch.setattr(user_loop, "_model", lambda *a: None)


def test_a_ratio_outside_the_band_fails_the_run(tmp_path, monkeypatch):
    _fake_checks(monkeypatch, {"gemma3/train": 1.031})
    assert user_loop.run(tmp_path, only="gemma3") == 1
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    assert run["status"] == "failed" and {r["workload"] for r in run["outside_band"]} == {"train"}
    _fake_checks(monkeypatch, {"gemma3/train": 0.971})
    assert user_loop.run(tmp_path, only="gemma3") == 0


def test_a_check_past_its_time_bound_is_stopped_and_the_run_fails(tmp_path, monkeypatch):
    _fake_checks(monkeypatch, {}, sleep_s=5.0)
    monkeypatch.setattr(user_loop, "SHAPES", (user_loop.Shape("slow", "qwen3", {"train": (1, 8)}, 1, 0.2),))
    assert user_loop.run(tmp_path) == 1
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    # stopped: the fake check would have ended "ok" after its 5 s
    assert run["checks"][0]["status"] == "failed" and "time bound" in run["checks"][0]["error"]


def test_a_check_that_would_end_past_the_runs_bound_is_not_started(tmp_path, monkeypatch):
    _fake_checks(monkeypatch, {})
    assert user_loop.run(tmp_path, only="host-bound", total_s=10.0) == 1
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    assert {c["status"] for c in run["checks"]} == {"not run"}
