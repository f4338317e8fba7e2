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
QUICK = ["compare", "tiny-llama", "--device", "cpu", "--num-layers", "1", "--seq", "8", "--iters", "1", "--warmup",
         "0", "--time-budget", "0", "--backends", "naive"]

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


SWALLOWING = INTERRUPTING.replace("""    os.kill(os.getpid(), signal.SIGINT)
""", """    try:  # a library on the way that ignores the interrupt, or turns it into an error of its own
        signal.raise_signal(signal.SIGINT)  # (its handler runs inside the call, so inside the try)
    except BaseException as e:
        if {turned}:
            raise ImportError("Could not import module 'PreTrainedModel'") from e
""")
assert SWALLOWING != INTERRUPTING


# the same, the interrupt swallowed while the options are checked (before the report's folder is staged: the
# command's imports)
SWALLOWED_EARLY = SWALLOWING.replace("""from attnswitch.cli import run""", """import attnswitch.outfolder
real_check = attnswitch.outfolder.check


def check(*a, **k):
    try:
        signal.raise_signal(signal.SIGINT)
    except BaseException:
        pass
    return real_check(*a, **k)


attnswitch.outfolder.check = check
from attnswitch.cli import run""")
assert SWALLOWED_EARLY != SWALLOWING


@pytest.mark.parametrize("turned", [False, True, "early"])
def test_ctrl_c_that_a_library_swallows_or_turns_into_an_error_still_ends_the_command_as_one(turned, tmp_path,
                                                                                              capsys):
    # an interrupt in an import, turned into ModuleNotFoundError by transformers' lazy modules, was a traceback and
    # exit 1; one that a bare except swallowed let the run go on and replace the report (exit 0)
    out = tmp_path / "report"
    assert cli.main([*BASE, "--backends", "naive,math", "--out", str(out)]) == 0
    capsys.readouterr()
    found = _tree(out)
    script = tmp_path / "swallowing.py"
    script.write_text(SWALLOWED_EARLY.format(turned=False) if turned == "early" else
                      SWALLOWING.format(turned=turned))
    backends = "naive,math" if turned == "early" else "naive,interrupting"
    r = subprocess.run([sys.executable, str(script), *BASE, "--backends", backends, "--out", str(out)],
                       capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert r.returncode == 130, r.stderr[-3000:]
    assert r.stderr.strip().splitlines()[-1] == f"interrupted; kept the previous report in {out}", r.stderr[-3000:]
    assert "Traceback" not in r.stderr and _tree(out) == found
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report", "swallowing.py"]


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


def test_an_out_folder_holding_a_file_a_report_never_writes_is_refused_not_deleted(tmp_path, capsys):
    # docs/cli.md, "--out": "DIR always holds one whole run (an earlier report there is replaced whole, traces
    # included), and a folder that holds anything else is refused before any work." (outfolder.py: "a folder with
    # anything else in it is refused before any work, never deleted").
    # A folder whose traces/ holds the user's own file (traces/my_notes.txt, not a trace a report writes) holds
    # something else, below its top level: refused (exit 2) and the file kept. A wrong answer would exit 0 and
    # replace the folder whole -- my_notes.txt gone, traces/ holding trace_naive.json.gz alone.
    out = tmp_path / "report"
    (out / "traces").mkdir(parents=True)
    (out / "traces" / "my_notes.txt").write_text("precious")
    code = cli.main([*QUICK, "--out", str(out)])
    capsys.readouterr()
    assert (out / "traces" / "my_notes.txt").exists(), sorted(p.name for p in (out / "traces").iterdir())
    assert code == 2


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


def _renames_refused(monkeypatch, refused, error: OSError) -> None:
    """``os.rename(a, b)`` raises ``error`` where ``refused(a, b)`` (paths as text), and no exchange of two folders
    is possible: a folder that cannot be moved (immutable, a mount point)."""
    rename = os.rename

    def refusing(a, b):
        if refused(os.fspath(a), os.fspath(b)):
            raise error
        return rename(a, b)

    monkeypatch.setattr(outfolder, "_exchange", lambda a, b: False)
    monkeypatch.setattr(outfolder.os, "rename", refusing)


def test_a_folder_that_cannot_be_moved_keeps_its_report_and_the_new_one_is_kept_beside_it_and_said(tmp_path,
                                                                                                  monkeypatch):
    # an immutable folder, or a mount point: the finished report cannot take its place. Nothing is lost, no
    # placeholder is left, and the error says where each report is
    out = tmp_path / "report"
    out.mkdir()
    (out / "report.json").write_text("earlier")
    _renames_refused(monkeypatch, lambda a, b: a == str(out.resolve()), OSError(16, "Device or resource busy"))
    with pytest.raises(outfolder.OptionError) as e:
        with outfolder.Staged(out) as staged:
            (staged / "report.json").write_text("new")
    kept = [p for p in tmp_path.iterdir() if p.name != "report"]
    assert len(kept) == 1 and kept[0].name.startswith("report.new-") and _tree(kept[0]) == {"report.json": b"new"}
    assert _tree(out) == {"report.json": b"earlier"}
    said = e.value.worded({"out": "--out"})
    assert said.startswith(f"--out {out}: could not be replaced (Device or resource busy); it holds the previous "
                           "report")
    assert f"this run's report is in {kept[0]}" in said
    (out / "report.json").unlink()  # an empty folder: said to be as it was, not to hold a report
    with pytest.raises(outfolder.OptionError) as e:
        with outfolder.Staged(out) as staged:
            (staged / "report.json").write_text("new")
    assert "; it is as it was, and this run's report is in" in str(e.value) and list(out.iterdir()) == []


def test_the_new_report_stays_staged_and_said_where_it_cannot_be_moved_beside_the_folder_either(tmp_path,
                                                                                               monkeypatch):
    out = tmp_path / "report"
    out.mkdir()
    _renames_refused(monkeypatch, lambda a, b: a == str(out.resolve()) or ".new-" in b,
                     OSError(1, "Operation not permitted"))
    with pytest.raises(outfolder.OptionError) as e:
        with outfolder.Staged(out) as staged:
            (staged / "report.json").write_text("new")
    assert f"this run's report is in {staged}" in str(e.value) and _tree(staged) == {"report.json": b"new"}
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["report", staged.name])  # no empty .new- left


@pytest.mark.parametrize("how", ["ismount", "a link to it", "the mount table"])
def test_a_mount_point_is_refused_before_any_work(how, tmp_path, monkeypatch, capsys):
    out = tmp_path / "volume"
    out.mkdir()
    given = out
    if how == "the mount table":  # a bind mount of a folder of the same file system: ismount cannot see it
        table = tmp_path / "mountinfo"
        table.write_text(f"36 35 98:0 /src {str(out.resolve()).replace(' ', chr(92) + '040')} rw - ext4 /dev/x rw\n")
        monkeypatch.setattr(outfolder, "_MOUNTS", str(table))
    else:
        monkeypatch.setattr(outfolder.os.path, "ismount", lambda p: os.fspath(p) == str(out.resolve()))
    if how == "a link to it":
        given = tmp_path / "link"
        given.symlink_to(out)
    assert cli.main([*QUICK, "--out", str(given)]) == 2
    err = capsys.readouterr().err
    assert "is a mount point" in err and "give a folder inside it" in err and "Traceback" not in err
    assert list(out.iterdir()) == []
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # nothing staged beside it


@pytest.mark.parametrize("name, said", [
    ("b" * 231, "its name is too long: a run names a folder beside it .NAME.attnswitch-old-XXXXXXXX, and names "
                "here have at most 255 bytes; give a name of at most 230 bytes"),
    ("b" * 300, "its name is too long"),
    ("c" * 300 + "/sub", "a folder on its path has a name longer than names here have (at most 255 bytes)"),
    ("nl\nx", "holds a line break or another control character; give a plain name")])
def test_an_out_name_no_folder_beside_it_could_take_is_refused_in_one_line_before_any_work(name, said, tmp_path,
                                                                                           monkeypatch, capsys):
    monkeypatch.setattr(outfolder.os, "pathconf", lambda p, what: 255)  # (the usual limit, on any file system)
    monkeypatch.chdir(tmp_path)
    assert cli.main([*QUICK, "--out", name]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and said in err[0] and err[0].startswith("error: --out '")
    assert list(tmp_path.iterdir()) == []
    assert cli.main([*QUICK, "--out", "b" * 230]) == 0 and (tmp_path / ("b" * 230) / "report.json").is_file()


# -- a run that ends in anything but a report leaves --out as it was -------------------------------------

def _earlier_report(out, capsys):
    assert cli.main([*BASE, "--backends", "naive,math", "--out", str(out)]) == 0
    capsys.readouterr()
    return _tree(out)


def _no_space_for_traces(monkeypatch):
    """A full disk, as the profiler meets it: its trace is not written (Kineto says so on its own stderr and
    raises nothing), and the folder's file system has no space left."""
    import shutil
    from collections import namedtuple

    import torch

    monkeypatch.setattr(torch.profiler.profile, "export_chrome_trace", lambda self, path: None)
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 20, 1 << 20, 0))


def _no_space_for_the_page(monkeypatch):
    """A full disk, as writing the report's page meets it."""
    import errno

    from attnswitch.results import Report

    def full(self, path, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
    monkeypatch.setattr(Report, "write_html", full)


@pytest.fixture
def refusing_backend():
    import attnswitch
    name = attnswitch.register_backend("never", lambda q, k, v, **kw: q, check=lambda *a, **k: "not these inputs")
    yield name
    attnswitch.unregister_backend(name)


@pytest.mark.parametrize("how, code, said", [
    ("nothing ran", 1, "no backend ran: kept the previous report in {out}"),
    ("a backend this device cannot offer", 2, "error: --backends cudnn: nothing this device (cpu) offers: cudnn "
                                              "(CUDA only)"),
    ("no space for a trace", 2, "error: no space left on device (writing {out}/traces/trace_naive.json); kept the "
                                "previous report in {out}"),
    ("no space for the page", 2, "error: no space left on device (writing {out}/report.html); kept the previous "
                                 "report in {out}"),
])
def test_a_run_that_exits_non_zero_leaves_out_byte_for_byte_as_it_was(how, code, said, tmp_path, capsys, monkeypatch,
                                                                      refusing_backend):
    out = tmp_path / "report"
    found = _earlier_report(out, capsys)
    backends = {"nothing ran": refusing_backend, "a backend this device cannot offer": "cudnn"}.get(how, "naive")
    if how == "no space for a trace":
        _no_space_for_traces(monkeypatch)
    elif how == "no space for the page":
        _no_space_for_the_page(monkeypatch)
    assert cli.main([*BASE, "--backends", backends, "--out", str(out)]) == code
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(said.format(out=out)), err
    if code == 2:
        assert err[-1].startswith("error: ") and "Traceback" not in "\n".join(err), err  # one line
    assert _tree(out) == found  # the earlier report, policy.json and traces/ included
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report"]  # nothing staged left beside it


def test_the_last_line_names_only_what_was_written(tmp_path, capsys):
    # a profile picks nothing: no policy.json, and the last line does not say it wrote one
    out = tmp_path / "report"
    assert cli.main(["profile", *BASE[1:-1], "--backends", "flash", "--out", str(out)]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    written = sorted(p.name for p in out.iterdir())
    assert "policy.json" not in written
    listed = last.removeprefix(f"wrote {out}/").rsplit(" in ", 1)[0].split(", ")
    assert sorted(n.rstrip("/") for n in listed) == written, (last, written)


# -- signals: Ctrl-C at any moment, SIGTERM as Ctrl-C ---------------------------------------------------

# the command as the console script runs it (attnswitch.__main__:main), with SIGINT's and SIGTERM's dispositions
# set here (not inherited from whatever started the test), and the signal sent to itself at the first import of a
# module ({module}: the command's own first, or what it imports later) or from inside the first attention call of
# a backend of its own ("sig")
SIGNALLING = textwrap.dedent("""
    import importlib.abc, os, signal, sys
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    SIG = getattr(signal, {signal!r})
    from attnswitch.__main__ import main as run

    class SendAtImport(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name == {module!r}:
                sys.meta_path.remove(self)
                os.kill(os.getpid(), SIG)
            return None

    if {module!r}:
        sys.meta_path.insert(0, SendAtImport())
    else:
        import attnswitch
        from attnswitch.backends import Call, naive_attention

        def sig(q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None):
            os.kill(os.getpid(), SIG)
            return naive_attention(Call(q, k, v, attn_mask, dropout_p, is_causal, scale))[0]

        attnswitch.register_backend("sig", sig)
    run()
""")


def _signalled_run(tmp_path, out, signal: str, module: str = ""):
    script = tmp_path / "signalling.py"
    script.write_text(SIGNALLING.format(signal=signal, module=module))
    backends = "naive,sig" if not module else "naive"
    return subprocess.run([sys.executable, str(script), *BASE, "--backends", backends, "--out", str(out)],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path)


@pytest.mark.parametrize("module", ["attnswitch.cli", "rich.console", "torch", "transformers", "attnswitch.models"])
def test_ctrl_c_at_any_moment_after_launch_is_one_line_and_exit_130(module, tmp_path):
    # while the command imports what it needs (the first half second and more), as later
    out = tmp_path / "report"
    r = _signalled_run(tmp_path, out, "SIGINT", module)
    assert r.returncode == 130, r.stderr[-3000:]
    said = "interrupted" if module == "attnswitch.cli" else f"interrupted; nothing written to {out}"  # (args unread)
    assert r.stderr.strip().splitlines()[-1] == said, r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "KeyboardInterrupt" not in r.stderr, r.stderr[-3000:]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["signalling.py"]


@pytest.mark.parametrize("before", ["none", "a report"])
def test_sigterm_is_handled_as_ctrl_c_one_line_exit_143_and_out_as_it_was(before, tmp_path, capsys):
    out = tmp_path / "new" / "report"
    found = _earlier_report(out, capsys) if before == "a report" else None
    r = _signalled_run(tmp_path, out, "SIGTERM")  # while the second backend is measured, as `timeout` sends it
    assert r.returncode == 143, r.stderr[-3000:]
    said = "kept the previous report in" if found else "nothing written to"
    assert r.stderr.strip().splitlines()[-1] == f"terminated; {said} {out}", r.stderr[-3000:]
    assert "Traceback" not in r.stderr, r.stderr[-3000:]
    if found is None:
        assert not (tmp_path / "new").exists()
    else:
        assert _tree(out) == found and sorted(p.name for p in out.parent.iterdir()) == ["report"]


def test_the_last_line_names_the_folder_once_whatever_its_trailing_slash(tmp_path, capsys):
    out = tmp_path / "report"
    assert cli.main(["profile", *BASE[1:-1], "--backends", "flash", "--out", f"{out}/"]) == 0
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert last.startswith(f"wrote {out}/report.json") and "//" not in last, last


def test_traces_written_where_no_folder_was_given_are_copied_out_then_removed_as_the_process_ends(tmp_path):
    from pathlib import Path

    from conftest import batch_for, tiny

    import attnswitch
    from attnswitch.profiling import capture

    m = tiny("llama")
    r = attnswitch.profile(m, batch_for(m), backends=["math"], iters=1, warmup=0)
    written = Path(r["math"].trace_path)
    assert written.exists() and written.parent in capture._TEMPORARY  # (a temporary folder of this process)
    assert [p.name for p in r.save_traces(tmp_path)] == [written.name]  # copied out while the process lives
    capture.remove_temporary()  # what the interpreter's exit, or the command line's own ending, runs
    assert not written.parent.exists() and (tmp_path / written.name).exists()


def test_an_interrupt_caught_before_a_run_is_not_that_runs_own(tmp_path, capsys):
    # inside one sigterm_as_interrupt block (a program running the command's main more than once), a Ctrl-C its
    # own code caught made every later run print "interrupted", exit 130 and throw its finished report away
    import signal

    from attnswitch.errors import raised_signal, sigterm_as_interrupt

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner's SIGINT handler is not Python's own")
    out = tmp_path / "report"
    with sigterm_as_interrupt():
        try:
            signal.raise_signal(signal.SIGINT)
        except KeyboardInterrupt:
            pass
        assert raised_signal() is KeyboardInterrupt
        assert cli.main([*BASE, "--backends", "naive", "--out", str(out)]) == 0
    assert (out / "report.json").exists()


def test_the_switchs_critical_sections_hold_back_the_commands_sigint_too():
    # the command's SIGINT handler (which records the signal) is not Python's own: the switch's critical sections
    # held back only Python's, so a Ctrl-C could land half-way through a switch's change of state
    import signal

    from attnswitch.errors import raised_signal, sigterm_as_interrupt
    from attnswitch.hf.critical import interrupts_deferred

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner's SIGINT handler is not Python's own")
    done = []
    with sigterm_as_interrupt():
        with pytest.raises(KeyboardInterrupt):
            with interrupts_deferred():
                signal.raise_signal(signal.SIGINT)
                done.append("the rest of the block")
        assert done == ["the rest of the block"] and raised_signal() is KeyboardInterrupt


def test_an_interrupt_landing_in_a_weakref_callback_prints_no_traceback_and_still_ends_the_run_as_one(monkeypatch):
    # Python cannot raise an exception out of a weakref callback: it printed "Exception ignored in: ..." and a
    # traceback of the command's handler before the one line of an interrupted run
    import gc
    import signal
    import weakref

    from attnswitch.errors import raised_signal, sigterm_as_interrupt

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner's SIGINT handler is not Python's own")

    class Held:
        pass

    printed = []  # what Python would print as "Exception ignored"
    monkeypatch.setattr(sys, "unraisablehook", printed.append)
    with sigterm_as_interrupt():
        handler = signal.getsignal(signal.SIGINT)
        held = Held()
        ref = weakref.ref(held, lambda r: handler(signal.SIGINT, None))  # the signal lands inside the callback
        del held
        gc.collect()
        assert ref() is None and raised_signal() is KeyboardInterrupt  # recorded: the command ends as one
    assert printed == [] and sys.unraisablehook == printed.append  # as it was after the block
    other = weakref.ref(Held(), lambda r: 1 / 0)  # anything else, or after the block, still goes to the hook
    assert other() is None and [type(u.exc_value) for u in printed] == [ZeroDivisionError]


def test_an_interrupt_python_could_not_raise_stops_the_run_at_its_next_step(monkeypatch):
    # recorded inside a weakref callback, it used to end the command only once the whole measurement was done
    import io
    import signal

    from rich.console import Console

    from attnswitch.errors import signals_so_far, sigterm_as_interrupt

    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        pytest.skip("the test runner's SIGINT handler is not Python's own")
    monkeypatch.setattr(sys, "unraisablehook", lambda u: None)
    with sigterm_as_interrupt():
        since = signals_so_far()
        with cli._progress(Console(file=io.StringIO(), force_terminal=False), since) as progress:
            progress("naive")  # nothing recorded: the step is said
            with pytest.raises(KeyboardInterrupt):
                signal.getsignal(signal.SIGINT)(signal.SIGINT, None)  # (as where Python swallows it)
            with pytest.raises(KeyboardInterrupt):
                progress("math")


@pytest.mark.parametrize("stop", [KeyboardInterrupt, OSError])
def test_random_weights_saved_for_a_device_map_are_removed_when_saving_them_is_cut_short(stop, tmp_path,
                                                                                         monkeypatch):
    # an interrupt (or a full disk) while a preset's random weights were saved left them in /tmp: gigabytes each
    import tempfile

    from transformers import PreTrainedModel

    from attnswitch.models import load_model

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))

    def cut(self, folder, *a, **kw):
        (tmp_path / next(iter(os.listdir(tmp_path))) / "model.safetensors").write_bytes(b"half written")
        raise stop("cut short")
    monkeypatch.setattr(PreTrainedModel, "save_pretrained", cut)
    with pytest.raises(stop):
        load_model("tiny-llama", device="cpu", device_map="auto")
    assert not os.listdir(tmp_path)


@pytest.mark.parametrize("odd", ['q"uote', "back\\slash"])
def test_a_report_is_written_into_a_folder_whose_path_holds_a_quote_or_a_backslash(odd, tmp_path, capsys):
    # the profiler writes its file's path into the trace unescaped (a quote made it no JSON) and renames the file
    # with each backslash made a slash (no such folder): every measured run failed with a traceback
    out = tmp_path / odd / "report"
    assert cli.main([*BASE, "--backends", "naive", "--out", str(out)]) == 0, capsys.readouterr().err
    assert (out / "report.json").is_file() and [p.name for p in (out / "traces").iterdir()] == ["trace_naive.json.gz"]
    assert sorted(p.name for p in tmp_path.iterdir()) == [odd]  # nothing left beside it


def test_traces_are_written_into_a_folder_whose_path_holds_a_control_character(tmp_path):
    # the command line refuses such a folder; the library's trace_dir takes it, and the profiler wrote the tab
    # into its JSON unescaped (no JSON) and mangled a newline
    import torch

    import attnswitch

    q = torch.randn(1, 2, 8, 16)
    for odd in ("tab\there", "new\nline"):
        folder = tmp_path / odd
        r = attnswitch.profile(lambda: attnswitch.attention(q, q, q), backends=["naive"], iters=1, rounds=1,
                               time_budget_s=0, trace_dir=folder)
        assert r["naive"].ok and (folder / "trace_naive.json.gz").is_file()
