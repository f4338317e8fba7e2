"""The user's-loop check (``benchmarks/user_loop.py``) on a CPU: its logic on tiny models, no verdict on the
numbers (those are the GPU's)."""

import json
import statistics
import time
from pathlib import Path

import pytest
import torch

from attnswitch import candidate
from benchmarks import user_loop


def test_the_smoke_run_writes_a_row_per_backend_shape_and_workload(tmp_path):
    rc = user_loop.run(tmp_path, smoke=True, only="host-bound/train,gemma3/decode")
    assert rc == 0
    rows = json.loads((tmp_path / "user_loop_check.json").read_text())
    got = {(r["shape"], r["workload"], r["backend"]) for r in rows}
    want = {(s, w, b) for s, w in (("host-bound", "train"), ("gemma3", "decode")) for b in user_loop.CPU_BACKENDS}
    # and a row for the candidate of each kind's fastest where the compare added one (the Gemma-3 shape's kinds)
    assert want <= got and all(candidate.parse(b).kinds is not None and s == "gemma3" for s, _, b in got - want)
    for r in rows:
        assert {"backend", "shape", "workload", "compare_ms", "loop_ms", "ratio"} <= set(r)
        # the median of the blocks before and after pooled lies between the two sets' medians
        before = r["loop_before_ms"] if r["loop_before_ms"] is not None else r["loop_after_ms"]  # (a per-kind one)
        low, high = sorted((before, r["loop_after_ms"]))
        assert low - 1e-3 <= r["loop_ms"] <= high + 1e-3 and r["blocks"] >= 1
        assert r["ratio"] == pytest.approx(r["compare_ms"] / r["loop_ms"], rel=1e-3)
        assert r["paired_rounds"] == user_loop.PAIRED_ROUNDS
        assert r["paired_low"] <= r["paired_ratio"] <= r["paired_high"]
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    for c in run["checks"]:  # the side-by-side figure is the median of the rounds' turn over block
        for r in (r for r in rows if f"{r['shape']}/{r['workload']}" == c["check"]):
            pairs = c["side_by_side"][r["backend"]]
            assert len(pairs) == user_loop.PAIRED_ROUNDS
            assert r["paired_ratio"] == pytest.approx(statistics.median(a / b for a, b in pairs), rel=1e-3)
    assert [c["check"] for c in run["checks"]] == ["host-bound/train", "gemma3/decode"]
    assert all(c["status"] == "ok" and c["seconds"] > 0 for c in run["checks"])


def _fake_checks(monkeypatch, ratios: dict, sleep_s: float = 0.0):
    def check(model, shape, mode, names, turn=None, loop_s=None, paired_s=None):
        time.sleep(sleep_s)
        r = ratios.get(f"{shape.name}/{mode}", 1.0)
        return {"rows": [{"backend": n, "shape": shape.name, "workload": mode, "compare_ms": 10.0 * r,
                          "loop_ms": 10.0, "ratio": r} for n in names]}

    monkeypatch.setattr(user_loop, "check", check)
    monkeypatch.setattr(user_loop, "model_of", lambda *a: None)


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


#: a row measured side by side over enough rounds, its interval inside the band, the host steady
STEADY = {"ratio": 1.0, "paired_ratio": 1.0, "paired_low": 0.99, "paired_high": 1.01,
          "paired_rounds": user_loop.PAIRED_ROUNDS, "loop_before_ms": 10.0, "loop_after_ms": 10.1,
          "round_drift": 1.01, "round_spread": 1.01, "check_spread": 1.01, "host_busy": []}


def test_the_band_holds_the_side_by_side_figure_where_there_is_one(tmp_path, monkeypatch):
    # compare's reported step 20 % off loops taken before and after it, which disagree (the host's speed moved),
    # its turn within 1 % of a loop's block side by side: the run passes; 5 % off side by side: it fails
    def check(paired):
        def fake(model, shape, mode, names, turn=None, loop_s=None, paired_s=None):
            return {"rows": [{"backend": n, "shape": shape.name, "workload": mode, "compare_ms": 12.0, "loop_ms": 10.0,
                              **STEADY, "ratio": 1.2, "loop_after_ms": 13.0, "paired_ratio": paired,
                              "paired_low": paired - 0.01, "paired_high": paired + 0.01} for n in names]}
        return fake

    monkeypatch.setattr(user_loop, "model_of", lambda *a: None)
    monkeypatch.setattr(user_loop, "check", check(1.01))
    assert user_loop.run(tmp_path, only="gemma3/train") == 0
    monkeypatch.setattr(user_loop, "check", check(1.05))
    assert user_loop.run(tmp_path, only="gemma3/train") == 1
    assert user_loop.checked({"ratio": 1.2}) == 1.2  # no side-by-side figure: the reported step's
    assert user_loop.verdict({"ratio": 1.2}) == "outside" and user_loop.verdict({"ratio": 1.02}) == "within"
    assert user_loop.verdict({"ratio": 1.02, "paired_ratio": None}) == "within"  # (none measured)


def test_a_reported_step_off_a_steady_hosts_loops_fails_even_where_its_turn_side_by_side_is_in_the_band():
    # the turn compare's numbers come from agrees with a loop side by side, but the reported step is 1.9x the
    # loops around the compare, and those agree with each other: the reported step is wrong, not the host
    row = {**STEADY, "ratio": 1.9}
    assert user_loop.checked(row) == 1.9 and user_loop.verdict(row) == "outside"
    # the loops before and after disagree by 30 % (the host's speed moved), or agree while the compare's own
    # rounds were 3x slower in some than in others: the side-by-side figure is the one shown
    assert user_loop.checked({**row, "loop_after_ms": 13.0}) == 1.0
    assert user_loop.checked({**row, "round_drift": 3.5}) == 1.0


def test_a_steady_row_is_within_only_where_its_side_by_side_interval_is_inside_the_band_too():
    # the loops can judge the reported step, and it is in the band, but six rounds side by side spread over
    # 0.90-1.10: the data cannot say the step is within 3 %
    assert user_loop.verdict({**STEADY, "paired_low": 0.90, "paired_high": 1.10}) == "undecided"
    assert user_loop.verdict({**STEADY, "paired_low": 1.04, "paired_high": 1.10}) == "outside"
    assert user_loop.verdict(STEADY) == "within"


def test_a_reported_step_whose_own_rounds_spread_past_the_band_is_judged_side_by_side_only():
    # the loops before and after disagree, and this candidate's rounds ran 9 and 11 ms in turns: the loops
    # cannot judge its reported step, and its turn side by side with a loop's block is within 1 %
    row = {**STEADY, "ratio": 1.12, "loop_after_ms": 11.0, "paired_ratio": 0.997, "paired_low": 0.975,
           "paired_high": 1.02}
    spread = user_loop.round_spread([[9.0], [8.9], [], [10.6], [10.9], [11.0], [8.8], [], [10.7]])
    assert spread == pytest.approx(10.94 / 8.86, rel=1e-3)  # (90th over 10th percentile; rounds sat out skipped)
    assert user_loop.checked({**row, "round_spread": spread}) == 0.997
    assert user_loop.verdict({**row, "round_spread": spread}) == "within"
    # where the loops agree with each other, a reported step 12 % off them disagrees with the side-by-side
    # figure: the two measures do not decide together
    agreeing = {**row, "loop_after_ms": 10.05, "round_spread": spread}
    assert user_loop.checked(agreeing) == 0.997 and user_loop.verdict(agreeing) == "undecided"
    assert user_loop.verdict({**agreeing, "round_spread": 1.01}) == "outside"  # steady rounds: the loops judge
    assert user_loop.round_spread([[9.0], []]) is None
    # a spread or drift not measured is not taken for a steady host
    assert user_loop.verdict({**agreeing, "round_spread": None}) == "undecided"
    assert user_loop.verdict({**agreeing, "round_spread": 1.01, "round_drift": None}) == "undecided"


@pytest.mark.parametrize("paired, low, high, want", [(1.085, 0.90, 1.20, "undecided"), (1.085, 1.048, 1.20, "outside"),
                                                     (0.90, 0.55, 0.96, "outside"), (1.02, 0.5, 1.5, "undecided"),
                                                     (1.0, 0.98, 1.02, "within")])
def test_a_side_by_side_figure_judging_alone_is_decided_only_where_its_interval_clears_the_bands_edges(paired, low,
                                                                                                     high, want):
    row = {**STEADY, "paired_ratio": paired, "paired_low": low, "paired_high": high,
           "loop_after_ms": 12.0}  # the loops disagree: the side-by-side figure alone
    assert user_loop.verdict(row) == want
    # fewer rounds than a 95 % interval needs decide nothing
    assert user_loop.verdict({**row, "paired_rounds": user_loop.PAIRED_ROUNDS - 1}) == "undecided"


def test_the_loop_leaves_a_callers_frozen_heap_frozen():
    import gc

    from attnswitch.workload import make_workload

    model = user_loop.model_of("qwen3", True, "cpu", torch.float32)
    work = make_workload(model, batch=1, seq=8, mode="prefill")
    gc.freeze()
    try:
        frozen = gc.get_freeze_count()
        user_loop.user_loop(work, ["math"], 1, steps=1)
        assert gc.get_freeze_count() > frozen / 2  # still frozen (less what died meanwhile)
    finally:
        gc.unfreeze()
    user_loop.user_loop(work, ["math"], 1, steps=1)
    assert gc.get_freeze_count() == 0  # its own freeze undone
    gc.disable()
    try:
        user_loop.user_loop(work, ["math"], 1, steps=1)
        assert not gc.isenabled()  # nor a collector the caller turned off
    finally:
        gc.enable()


def test_rounds_side_by_side_fill_their_seconds_at_the_first_rounds_length(monkeypatch):
    # a fake clock: each backend's turn and block take 0.5 s together, so a round of 2 backends takes 1 s (the
    # garbage collections inside included, as measured): 10 s hold 10 rounds; 100 s 24 at most; 1 s 6 at least
    now = [0.0]
    monkeypatch.setattr(user_loop, "user_loop", lambda work, names, n: now.__setitem__(0, now[0] + 0.25) or
                        {names[0]: [4.0]})
    import attnswitch.profiling.capture as capture

    class Done:
        def __init__(self, name):
            self.timings = {name: type("T", (), {"by_round": [[9.0], [4.2]]})()}

    monkeypatch.setattr(capture, "Target", type("Target", (), {"of": staticmethod(lambda w: None)}))
    monkeypatch.setattr(capture, "timed_rounds", lambda target, names, **kw: now.__setitem__(0, now[0] + 0.25) or
                        Done(names[0]))
    for seconds, rounds in ((10.0, 10), (100.0, user_loop.MAX_PAIRED_ROUNDS), (1.0, user_loop.PAIRED_ROUNDS)):
        got = user_loop.paired(None, ["a", "b"], 2, seconds, clock=lambda: now[0])
        assert {n: len(v) for n, v in got.items()} == {"a": rounds, "b": rounds}
        assert got["a"][0] == (4.2, 4.0)  # (the turn's second round, the block)


def test_the_command_line_takes_the_runs_bound(tmp_path, monkeypatch):
    got = {}
    monkeypatch.setattr(user_loop, "run", lambda out, **kw: got.update(kw) or 0)
    assert user_loop.main([str(tmp_path), "--total=250", "--turn=5", "--only=gemma3"]) == 0
    assert got == {"turn": 5, "total_s": 250.0, "smoke": False, "only": "gemma3"}
    assert user_loop.main([str(tmp_path)]) == 0 and got["total_s"] == user_loop.TOTAL_S


@pytest.mark.parametrize("bad", ["--total=garbage", "--total=", "--total=nan", "--total=-5", "--turn=x", "--turn=0"])
def test_a_bad_bound_or_turn_on_the_command_line_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, bad):
    monkeypatch.setattr(user_loop, "run", lambda out, **kw: pytest.fail("ran"))
    assert user_loop.main([str(tmp_path), bad]) == 2
    assert "--turn takes a whole number" in capsys.readouterr().err


@pytest.mark.parametrize("args", [["--only", "gemma3"], ["--turn", "5"], ["--turns=5"], ["--total", "250"], [],
                                  ["--smokes"]])
def test_an_option_it_does_not_take_or_a_second_folder_is_refused(tmp_path, monkeypatch, capsys, args):
    monkeypatch.setattr(user_loop, "run", lambda out, **kw: pytest.fail("ran"))
    assert user_loop.main([str(tmp_path), *args] if args else []) == 2
    assert "options take their value after '='" in capsys.readouterr().err


def _fake_rows(monkeypatch, row: dict):
    monkeypatch.setattr(user_loop, "model_of", lambda *a: None)
    monkeypatch.setattr(user_loop, "check", lambda model, shape, mode, names, *a, **k: {
        "rows": [{"backend": n, "shape": shape.name, "workload": mode, "compare_ms": 10.0, "loop_ms": 10.0,
                  **row} for n in names]})


def test_undecided_rows_make_their_own_status_and_exit_code_and_an_outside_one_fails_the_run(tmp_path, monkeypatch):
    noisy = {**STEADY, "paired_ratio": 1.06, "paired_low": 0.9, "paired_high": 1.2}
    _fake_rows(monkeypatch, noisy)
    assert user_loop.run(tmp_path, only="gemma3/train") == 3
    run = json.loads((tmp_path / "user_loop_run.json").read_text())
    rows = json.loads((tmp_path / "user_loop_check.json").read_text())
    assert run["status"] == "undecided" and len(run["undecided"]) == len(rows) and not run["outside_band"]
    assert {(r["verdict"], r["checked"]) for r in rows} == {("undecided", 1.06)}
    _fake_rows(monkeypatch, {**noisy, "paired_low": 1.04})  # the interval wholly above the band
    assert user_loop.run(tmp_path, only="gemma3/train") == 1
    assert json.loads((tmp_path / "user_loop_run.json").read_text())["status"] == "failed"


def test_a_stored_run_is_judged_again_with_each_rows_spread_from_its_compares_rounds(tmp_path, capsys):
    rows = [{"backend": "auto", "shape": "device-bound", "workload": "decode", "compare_ms": 9.92, "loop_ms": 8.84,
             "ratio": 1.1222, "loop_before_ms": 8.84, "loop_after_ms": 9.5, "paired_ratio": 0.997,
             "paired_low": 0.975, "paired_high": 1.019, "paired_rounds": 6, "round_drift": 1.022}]
    meta = {"smoke": False, "seconds": 272.7, "checks": [
        {"check": "device-bound/decode", "status": "ok",
         "compare_samples": {"auto": {"rounds": [[9.1], [8.9], [10.6], [10.9], [10.5], [11.2], [8.8]]}}}]}
    (tmp_path / "user_loop_check.json").write_text(json.dumps(rows))
    (tmp_path / "user_loop_run.json").write_text(json.dumps(meta))
    # the loops before and after disagree (8.84, 9.5 ms) and the rounds spread: the side-by-side figure decides
    assert user_loop.main(["--judge", str(tmp_path)]) == 0
    got = json.loads((tmp_path / "user_loop_check.json").read_text())[0]
    assert got["round_spread"] > user_loop.STEADY_SPREAD and got["checked"] == 0.997 and got["verdict"] == "within"
    assert json.loads((tmp_path / "user_loop_run.json").read_text())["status"] == "ok"
    assert "user loop check: ok" in capsys.readouterr().out
    assert user_loop.main(["--judge", str(tmp_path)]) == 0  # judged twice, the same
    assert json.loads((tmp_path / "user_loop_check.json").read_text())[0] == got
    # the loops agree (8.84, 8.9 ms) with each other and not with the reported step: undecided, exit 3
    rows[0]["loop_after_ms"] = 8.9
    (tmp_path / "user_loop_check.json").write_text(json.dumps(rows))
    assert user_loop.main(["--judge", str(tmp_path)]) == 3
    assert json.loads((tmp_path / "user_loop_check.json").read_text())[0]["verdict"] == "undecided"
    capsys.readouterr()
    assert user_loop.main(["--judge", str(tmp_path / "nothing")]) == 2
    assert "--judge takes folders of a stored run" in capsys.readouterr().err


def test_a_users_auto_on_an_sdpa_model_is_the_model_unswitched_and_every_other_backend_switched():
    from attnswitch.hf import registries

    model = user_loop.model_of("qwen3", True, "cpu", torch.float32)
    with user_loop.users_switch("auto", model):
        assert not registries.installed_entries()
    with user_loop.users_switch("math", model):
        assert registries.installed_entries()
    model.set_attn_implementation("eager")  # auto is not what this model runs unswitched
    with user_loop.users_switch("auto", model):
        assert registries.installed_entries()


def test_loops_around_a_compare_judge_no_row_where_the_host_moved_during_that_compare():
    # this candidate's own rounds are steady (it ran only the compare's first rounds), and the loops before and
    # after agree, its reported step 5 % above them, its turn side by side within 1 %: the compare's other
    # candidates' rounds moved 15 %, or its own probes of the host moved 2x, so the loops cannot judge the step
    row = {**STEADY, "ratio": 1.05, "paired_ratio": 1.002, "paired_low": 0.98, "paired_high": 1.012}
    assert user_loop.verdict(row) == "outside"  # the host steady through the whole compare: the loops judge
    assert user_loop.verdict({**row, "check_spread": 1.15}) == "undecided"
    assert user_loop.verdict({**row, "host_busy": ["drift"]}) == "undecided"
    assert user_loop.verdict({**row, "check_spread": None}) == "undecided"  # not measured: not taken as steady
    assert user_loop.verdict({**row, "host_busy": None}) == "undecided"
    assert user_loop.checked({**row, "check_spread": 1.15}) == 1.002


def test_a_stored_run_judged_again_reads_the_hosts_move_from_every_candidate_and_the_compares_probes(tmp_path):
    row = {"shape": "gemma3", "workload": "prefill", "compare_ms": 19.7, "loop_ms": 18.7, "ratio": 1.054,
           "loop_before_ms": 18.67, "loop_after_ms": 18.7, "paired_ratio": 1.002, "paired_low": 0.979,
           "paired_high": 1.012, "paired_rounds": 6, "round_drift": 1.005}
    steady_probes = {"cpus": 16, "probe_before_ms": [1.1, 1.1, 1.12], "probe_after_ms": [1.1, 1.11, 1.1]}

    def judge(host, cudnn_rounds):
        rows = [{**row, "backend": "efficient"}]
        meta = {"smoke": False, "checks": [{"check": "gemma3/prefill", "status": "ok", "host": host,
                                            "compare_samples": {"efficient": {"rounds": [[19.7]] * 6},
                                                                "cudnn": {"rounds": cudnn_rounds}}}]}
        (tmp_path / "user_loop_check.json").write_text(json.dumps(rows))
        (tmp_path / "user_loop_run.json").write_text(json.dumps(meta))
        code = user_loop.judge(tmp_path)
        return code, json.loads((tmp_path / "user_loop_check.json").read_text())[0]

    code, got = judge(steady_probes, [[16.8]] * 6)
    assert (code, got["verdict"], got["check_spread"], got["host_busy"]) == (1, "outside", 1.0, [])
    code, got = judge(steady_probes, [[16.8]] * 6 + [[16.0]] * 6)  # cudnn's later rounds 5 % faster
    assert (code, got["verdict"], got["check_spread"]) == (3, "undecided", 1.05)
    code, got = judge({**steady_probes, "probe_after_ms": [2.1, 2.2, 2.15]}, [[16.8]] * 6)
    assert (code, got["verdict"], got["host_busy"]) == (3, "undecided", ["drift"])
    code, got = judge(None, [[16.8]] * 6)  # no probes recorded: not taken for a steady host
    assert (code, got["verdict"], got["host_busy"]) == (3, "undecided", None)


def test_runs_of_several_calls_are_judged_and_their_rows_written_as_one_list(tmp_path, capsys):
    row = {"workload": "train", "compare_ms": 10.0, "loop_ms": 10.0, "ratio": 1.0, "loop_before_ms": 10.0,
           "loop_after_ms": 10.0, "paired_ratio": 1.0, "paired_low": 0.99, "paired_high": 1.01, "paired_rounds": 6,
           "round_drift": 1.0}
    host = {"cpus": 16, "probe_before_ms": [1.1, 1.1], "probe_after_ms": [1.1, 1.1]}
    folders = []
    for shape in ("host-bound", "gemma3"):
        f = tmp_path / shape
        f.mkdir()
        (f / "user_loop_check.json").write_text(json.dumps([{**row, "shape": shape, "backend": "math"}]))
        (f / "user_loop_run.json").write_text(json.dumps({"smoke": False, "checks": [
            {"check": f"{shape}/train", "status": "ok", "host": host,
             "compare_samples": {"math": {"rounds": [[10.0]] * 6}}}]}))
        folders.append(str(f))
    into = tmp_path / "rows.json"
    assert user_loop.main(["--judge", *folders, f"--rows-into={into}"]) == 0
    rows = json.loads(into.read_text())
    assert [(r["shape"], r["verdict"]) for r in rows] == [("host-bound", "within"), ("gemma3", "within")]
    assert "2 rows of 2 runs" in capsys.readouterr().out
    assert user_loop.main(["--judge", *folders, "--rows-into="]) == 2
    assert user_loop.main(["--judge", *folders, f"--rows-into={into}", f"--rows-into={into}"]) == 2


def _stored_run(folder: Path, shape: str = "gemma3", host=None) -> Path:
    row = {"shape": shape, "workload": "train", "backend": "math", "compare_ms": 10.0, "loop_ms": 10.0,
           "ratio": 1.0, "loop_before_ms": 10.0, "loop_after_ms": 10.0, "paired_ratio": 1.0, "paired_low": 0.99,
           "paired_high": 1.01, "paired_rounds": 6, "round_drift": 1.0}
    folder.mkdir(parents=True)
    (folder / "user_loop_check.json").write_text(json.dumps([row]))
    (folder / "user_loop_run.json").write_text(json.dumps({"smoke": False, "checks": [
        {"check": f"{shape}/train", "status": "ok",
         "host": host if host is not None else {"cpus": 16, "probe_before_ms": [1.1], "probe_after_ms": [1.1]},
         "compare_samples": {"math": {"rounds": [[10.0]] * 6}}}]}))
    return folder


@pytest.mark.parametrize("target", ["a/user_loop_check.json", "a/user_loop_run.json", "b", "nowhere/rows.json"])
def test_rows_into_a_runs_own_file_a_folder_or_a_missing_folder_is_refused_before_any_run_is_rewritten(
        tmp_path, capsys, target):
    a, b = _stored_run(tmp_path / "a"), _stored_run(tmp_path / "b", "host-bound")
    before = {p: p.read_text() for p in (*a.iterdir(), *b.iterdir())}
    assert user_loop.main(["--judge", str(a), str(b), f"--rows-into={tmp_path / target}"]) == 2
    assert "--rows-into=" in capsys.readouterr().err
    assert {p: p.read_text() for p in before} == before  # nothing judged, nothing written
    assert user_loop.main(["--judge", str(a), str(a) + "/"]) == 2  # the same run twice: its rows twice
    assert "the same folder twice" in capsys.readouterr().err


def test_rows_into_expands_the_home_folder(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    a = _stored_run(tmp_path / "a")
    assert user_loop.main(["--judge", str(a), "--rows-into=~/rows.json"]) == 0
    assert [r["shape"] for r in json.loads((tmp_path / "rows.json").read_text())] == ["gemma3"]


def test_a_judged_run_takes_the_hosts_move_from_what_it_recorded_each_time_and_keeps_a_rows_field_order(tmp_path):
    a = _stored_run(tmp_path / "a")
    assert user_loop.judge(a) == 0
    row = json.loads((a / "user_loop_check.json").read_text())[0]
    assert list(row)[-4:] == ["check_spread", "host_busy", "checked", "verdict"]  # appended, not put first
    # the run's record changes (as a corrected rule would read it): judged again, the row follows it
    meta = json.loads((a / "user_loop_run.json").read_text())
    meta["checks"][0]["host"]["probe_after_ms"] = [2.2]
    (a / "user_loop_run.json").write_text(json.dumps(meta))
    assert user_loop.judge(a) == 0  # (the side-by-side interval inside the band: within either way)
    assert json.loads((a / "user_loop_check.json").read_text())[0]["host_busy"] == ["drift"]
    # a host record without the probes says nothing of the host's speed: not taken for a steady host
    b = _stored_run(tmp_path / "b", host={"cpus": 16, "round_drift": 1.0})
    assert user_loop.judge(b) == 0
    assert json.loads((b / "user_loop_check.json").read_text())[0]["host_busy"] is None


def test_a_stored_run_of_an_older_or_odd_format_is_judged_without_a_crash(tmp_path):
    a = _stored_run(tmp_path / "a")
    meta = json.loads((a / "user_loop_run.json").read_text())
    meta["checks"][0]["compare_samples"]["cudnn"] = None  # a sample entry that is no record
    meta["checks"].append({"status": "not run"})  # an entry without its check's name
    meta["checks"].append({"check": "gemma3/train", "status": "failed", "error": "OverTime"})  # a later failure
    (a / "user_loop_run.json").write_text(json.dumps(meta))
    assert user_loop.judge(a) == 1  # a check not ok fails the run; the row is still judged from the one that ran
    row = json.loads((a / "user_loop_check.json").read_text())[0]
    assert (row["check_spread"], row["host_busy"], row["verdict"]) == (1.0, [], "within")
