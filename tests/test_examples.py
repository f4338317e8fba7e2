"""Every example runs (small sizes, CPU), so none rots."""

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import attnswitch
import attnswitch.backends.registry

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "post_single_call.py": ["--small"],
    "profile_model_per_layer.py": ["--layers", "2", "--seq", "32"],
    "choose_backend.py": ["--layers", "2", "--seq", "32", "--padding"],
    "bring_your_own_kernel.py": ["--layers", "2", "--seq", "32"],
    # accelerate's device_map (on a CPU the model stays whole); tensor parallelism under torchrun is run by
    # tests/test_multi_gpu_attribution.py through the CLI, which this example's --tp path calls the same way
    "larger_than_one_gpu.py": ["--device-map", "auto", "--layers", "2", "--seq", "16"],
}
TORCHRUN: set[str] = set()  # examples that need torchrun (none here: see above)


def test_every_example_is_covered():
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(CASES)


def _run_in_process(path: Path, args: list[str], cwd: Path, capsys) -> tuple[int, str, str]:
    """Run a script as ``python path args`` would, in this process: torch and transformers are imported
    already, which saves each example the seconds of importing them. Whatever it registers is
    unregistered after, so no other test sees it."""
    before = set(attnswitch.backends.registry.names())
    argv, here = sys.argv, os.getcwd()
    sys.argv = [str(path), *args]
    os.chdir(cwd)
    code = 0
    try:
        runpy.run_path(str(path), run_name="__main__")
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    finally:
        sys.argv = argv
        os.chdir(here)
        for name in set(attnswitch.backends.registry.names()) - before:
            attnswitch.unregister_backend(name)
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path, capsys):
    args = CASES[name] + (["--out", str(tmp_path / "out")] if name == "choose_backend.py" else [])
    if name in TORCHRUN:
        launch = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "OMP_NUM_THREADS": "1"}
        r = subprocess.run([*launch, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                           timeout=600, cwd=tmp_path, env=env)
    else:
        r = subprocess.CompletedProcess(name, *_run_in_process(ROOT / "examples" / name, args, tmp_path, capsys))
    assert r.returncode == 0, r.stderr[-3000:]
    if name == "choose_backend.py":
        assert "Recommendation" in r.stdout and "patched with" in r.stdout
        assert (tmp_path / "out" / "report.html").exists()
    if name == "larger_than_one_gpu.py":
        assert "random weights, device_map auto over cpu" in r.stdout and "Recommendation" in r.stdout
    if name == "bring_your_own_kernel.py":  # the kernel ran in the model and was checked and ranked
        assert "max |out - SDPA| = " in r.stdout and "mine ran: " in r.stdout and "Recommendation" in r.stdout
    if name == "post_single_call.py":
        assert "naive-inplace" in r.stdout and "aten::masked_fill_" in r.stdout
