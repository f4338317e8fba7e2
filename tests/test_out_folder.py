"""`--out` holds one whole run: replaced whole on success, left as it was by Ctrl-C or a failure; Ctrl-C is one
line and exit 130."""

import os
import subprocess
import sys
import textwrap

import pytest

from attnswitch import cli, outfolder

BASE = ["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "8", "--iters", "1", "--warmup",
        "0", "--no-numerics"]

# a program that registers a backend which sends this process a real SIGINT (as Ctrl-C does) from inside its
# first attention call, then runs the command as the console script does
INTERRUPTING = textwrap.dedent("""
    import os, signal
    # Ctrl-C's own handler, whatever the test runner's launcher left (a background job ignores SIGINT)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    import attnswitch
    from attnswitch.backends import Call, naive_attention

    def interrupting(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
        os.kill(os.getpid(), signal.SIGINT)
        return naive_attention(Call(q, k, v, attn_mask, dropout_p, is_causal, scale))[0]

    attnswitch.register_backend("interrupting", interrupting)
    from attnswitch.cli import run
    run()
""")


def _tree(d):
    """Every file under ``d``, relative path -> bytes."""
    return {str(p.relative_to(d)): p.read_bytes() for p in sorted(d.rglob("*")) if p.is_file()}


def _interrupted_run(tmp_path, out):
    script = tmp_path / "interrupting.py"
    script.write_text(INTERRUPTING)
    return subprocess.run([sys.executable, str(script), *BASE, "--backends", "naive,interrupting", "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.parametrize("before", ["none", "a report"])
def test_ctrl_c_is_one_line_exit_130_and_leaves_out_as_it_was(before, tmp_path, capsys):
    out = tmp_path / "new" / "report"
    if before == "a report":
        assert cli.main([*BASE, "--backends", "naive,math", "--out", str(out)]) == 0
        capsys.readouterr()
    found = _tree(out) if out.exists() else None
    # the SIGINT arrives while the second backend is measured, after the first one's trace was written
    r = _interrupted_run(tmp_path, out)
    assert r.returncode == 130, r.stderr[-3000:]
    said = "kept the previous report in" if before == "a report" else "nothing written to"
    assert r.stderr.strip().splitlines()[-1] == f"interrupted; {said} {out}", r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr[-3000:]
    if found is None:
        assert not (tmp_path / "new").exists()  # nor the parent folder made for it
    else:
        assert _tree(out) == found  # the earlier report, byte for byte: no new trace beside an old report
        assert sorted(p.name for p in out.parent.iterdir()) == ["report"]  # nothing staged left beside it


def test_a_finished_run_replaces_the_report_whole(tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main([*BASE, "--backends", "naive,math", "--out", str(out)]) == 0
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["trace_math.json.gz", "trace_naive.json.gz"]
    assert cli.main([*BASE, "--backends", "naive", "--out", str(out)]) == 0
    # fewer backends: no trace of the run before beside the new report, and nothing staged left over
    assert sorted(p.name for p in (out / "traces").iterdir()) == ["trace_naive.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]
    assert (out / "command.txt").read_text().strip().endswith("--backends naive --out " + str(out))
    # the report names its traces where they are now, not where they were staged
    import attnswitch
    rep = attnswitch.Report.from_json(out / "report.json")
    assert rep["naive"].trace_path == str(out / "traces" / "trace_naive.json.gz")
    assert oct(out.stat().st_mode & 0o777) == oct(0o777 & ~_umask())  # a folder as any other made here


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def test_a_folder_holding_other_files_is_refused_before_any_work_and_kept(tmp_path, capsys, monkeypatch):
    import attnswitch.models as models
    monkeypatch.setattr(models, "load_model", lambda *a, **k: pytest.fail("no work before --out is checked"))
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "notes.txt").write_text("mine")
    assert cli.main([*BASE, "--out", str(mine)]) == 2
    err = capsys.readouterr().err
    assert "--out" in err and "notes.txt" in err and len(err.strip().splitlines()) == 1
    assert _tree(mine) == {"notes.txt": b"mine"}
    monkeypatch.chdir(tmp_path / "mine")  # nor the folder the command runs in, nor one holding it
    for here in (".", str(tmp_path)):
        assert cli.main([*BASE, "--out", here]) == 2
        assert "the current folder" in capsys.readouterr().err


def test_a_failure_while_writing_leaves_the_earlier_report(tmp_path, monkeypatch):
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("earlier")
    with pytest.raises(OSError, match="disk full"):
        with outfolder.Staged(out) as staged:
            (staged / "report.json").write_text("new")
            raise OSError("disk full")
    assert _tree(out) == {"report.json": b"earlier"} and sorted(p.name for p in tmp_path.iterdir()) == ["report"]


@pytest.mark.parametrize("exchange", [True, False])
def test_the_new_report_takes_the_folders_place_with_or_without_an_exchange_of_the_two(exchange, tmp_path,
                                                                                      monkeypatch):
    if not exchange:  # a system without renameat2: the earlier folder is moved aside, then removed
        monkeypatch.setattr(outfolder, "_exchange", lambda a, b: False)
    out = tmp_path / "report"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "trace_old.json.gz").write_text("old")
    with outfolder.Staged(out) as staged:
        (staged / "report.json").write_text("new")
    assert _tree(out) == {"report.json": b"new"} and sorted(p.name for p in tmp_path.iterdir()) == ["report"]
