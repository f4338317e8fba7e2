"""Every example runs (small sizes, CPU), so none rots."""

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "post_single_call.py": ["--small"],
    "profile_model_per_layer.py": ["--layers", "2", "--seq", "32"],
    "choose_backend.py": ["--layers", "2", "--seq", "32", "--padding"],
}


def test_every_example_is_covered():
    assert {p.name for p in (ROOT / "examples").glob("*.py")} == set(CASES)


@pytest.mark.parametrize("name", sorted(CASES))
def test_example_runs(name, tmp_path):
    args = CASES[name] + (["--out", str(tmp_path / "out")] if name == "choose_backend.py" else [])
    r = subprocess.run([sys.executable, str(ROOT / "examples" / name), *args], capture_output=True, text=True,
                       timeout=600, cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-3000:]
    if name == "choose_backend.py":
        assert "Recommendation" in r.stdout and "patched with" in r.stdout
        assert (tmp_path / "out" / "report.html").exists()
    if name == "post_single_call.py":
        assert "naive-inplace" in r.stdout and "aten::masked_fill_" in r.stdout
