"""The GPU benchmark scripts' own logic, on a CPU: ``benchmarks/gpu_run.sh`` starts each call's parts under
timeouts that add up to no more than the 10 minutes a call may take (and ``layer_kinds.py``'s checks within their
part's), and ``peak_check.py`` says its figures agree within 5 % only where every backend gave both.

No GPU is used: CUDA-only paths are faked (``torch.cuda.is_available``, the measured loops), or read off the shell
script with its commands stubbed.
"""

import os
import stat
import subprocess
from pathlib import Path

import pytest
import torch

from benchmarks import layer_kinds, peak_check

ROOT = Path(__file__).resolve().parents[1]
#: the device tool's limit on one command (s)
COMMAND_LIMIT_S = 600


def _bounds(tmp_path: Path, **env: str) -> list[int]:
    """The ``timeout`` seconds each command of ``gpu_run.sh`` is started under for ``env`` (PARTS, ...): the
    script run as written (its staging and cache folders moved under ``tmp_path``) with ``timeout``, ``python3``
    and ``nvidia-smi`` stubbed, ``timeout`` logging its bound and running nothing."""
    bin_dir, work, out = tmp_path / "bin", tmp_path / "work", tmp_path / "out"
    for d in (bin_dir, work, out):
        d.mkdir()
    log = tmp_path / "bounds.txt"
    # each part takes its whole bound (the worst case): `date +%s` reads the bounds spent so far as elapsed
    clock = (f'#!/bin/sh\nif [ "$1" = "+%s" ]; then t=1000; [ -f "{log}" ] && for b in $(cat "{log}"); do '
             f't=$((t + b)); done; echo $t; else exec /bin/date "$@"; fi\n')
    stubs = {"timeout": f'#!/bin/sh\necho "$1" >> "{log}"\nexit 0\n', "python3": "#!/bin/sh\nexit 0\n",
             "nvidia-smi": "#!/bin/sh\nexit 0\n", "date": clock}
    for name, text in stubs.items():
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(stat.S_IRWXU)
    script = (ROOT / "benchmarks" / "gpu_run.sh").read_text()
    assert "S=/tmp/stage;" in script and "c=/tmp/compile_caches" in script
    script = script.replace("S=/tmp/stage;", f"S={tmp_path}/stage;").replace(
        "c=/tmp/compile_caches", f"c={tmp_path}/caches")
    (tmp_path / "gpu_run.sh").write_text(script)
    keep = {k: v for k, v in os.environ.items() if not k.endswith("_S") and k not in (
        "PARTS", "COMPARE_RUNS", "KINDS", "USERLOOP", "USERLOOP_TURN", "WRAP")}
    subprocess.run(["bash", str(tmp_path / "gpu_run.sh")], cwd=work, check=True, capture_output=True, timeout=60,
                   env={**keep, "PATH": f"{bin_dir}:/usr/bin:/bin", "OUT": str(out), **env})
    return [int(x) for x in log.read_text().split()]


# -- gpu_run.sh -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("env", [{}, {"PARTS": "tests,compare", "COMPARE_RUNS": "fresh,decode,train"}],
                         ids=["default-parts", "tests+compare-fresh,decode,train"])
def test_gpu_run_starts_parts_whose_timeouts_add_up_to_at_most_the_600_s_command_limit(tmp_path, env):
    # The header promises "Calls on the lent GPU, each under 10 minutes": the parts of one call (the default
    # PARTS, or tests with the three compares) are started under timeouts that add up to at most the 600 s a
    # device call may run, each part taking its whole bound. A call the device tool stops at 600 s brings back no
    # file at all, the GPU tests' log included; a wrong script would start parts whose timeouts add up past it.
    bounds = _bounds(tmp_path, **env)
    assert sum(bounds) <= COMMAND_LIMIT_S, bounds


def test_the_kinds_checks_time_bounds_add_up_to_at_most_the_kinds_timeout_so_no_check_is_cut_off(tmp_path):
    # gpu_run.sh runs layer_kinds under one `timeout`; the checks' own bounds add up to at most it, so no check is
    # killed by that timeout mid-way. A check cut off there would be absent from layer_kinds.json, neither
    # "failed" nor "not run" (tee hides the exit status).
    (kinds_s,) = _bounds(tmp_path, PARTS="kinds")
    assert sum(c.bound_s for c in layer_kinds.CHECKS) <= kinds_s, (kinds_s, [c.bound_s for c in layer_kinds.CHECKS])


# -- peak_check.py ----------------------------------------------------------------------------------------------

def test_peak_check_does_not_say_within_5pct_when_a_backend_gave_no_figure(tmp_path, monkeypatch, capsys):
    # The docstring: "within_5pct holds where every backend's two figures are within 5 % of each other". A backend
    # without a ratio (attnswitch gave no figure, or the independent loop failed) is no agreement: with cudnn's
    # attnswitch figure missing (a kernel the trace no longer attributes, say) and flash and efficient in
    # agreement, peak_check.json says "within_5pct": false. A wrong answer would leave cudnn out of the check and
    # read "within_5pct": true, the log "within 5 %: True".
    flops = peak_check.hand_flops()

    def mine(q, k, v, names):
        got = {n: {"status": "ok", "reasons": [], "tflops": flops / 1e9, "kernel_us": 1000.0, "pct_of_peak": 50.0}
               for n in names}
        got["cudnn"] = {"status": "failed", "reasons": ["no attention kernel attributed"], "tflops": None}
        return got, {}

    monkeypatch.setattr(peak_check.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(peak_check, "_inputs", lambda: (None, None, None))
    monkeypatch.setattr(peak_check, "through_attnswitch", mine)
    monkeypatch.setattr(peak_check, "independent_ms", lambda q, k, v, family: 1.0)  # flops/1e9 TFLOP/s: ratio 1
    monkeypatch.setattr(peak_check, "environment", lambda: {"gpu": "NVIDIA H200", "torch": torch.__version__})
    assert peak_check.main([str(tmp_path)]) == 0
    import json
    result = json.loads((tmp_path / "peak_check.json").read_text())
    assert result["backends"]["cudnn"]["ratio"] is None and result["backends"]["flash"]["ratio"] == pytest.approx(1)
    assert result["within_5pct"] is False, capsys.readouterr().out


def test_the_independent_generate_loop_runs_auto_unswitched_as_the_report_times_it(monkeypatch):
    from attnswitch.hf import registries
    from attnswitch.workload import make_workload
    from benchmarks import user_loop, workloads

    model = user_loop.model_of("qwen3", True, "cpu", torch.float32)
    work = make_workload(model, mode="generate", prompt_lens=(8,), new_tokens=2)
    held = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a: None)
    monkeypatch.setattr(model, "generate", lambda **kw: held.append(bool(registries.installed_entries())))
    got = workloads.independent_generate(work, ["auto"], repeats=2)
    assert held == [False] * 3 and len(got["auto"]["samples"]) == 2  # the warm-up and both samples unswitched
    held.clear()
    workloads.independent_generate(work, ["math"], repeats=1)
    assert held == [True] * 2  # a forced backend is switched, as a user switches it
