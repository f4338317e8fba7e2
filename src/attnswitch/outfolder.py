"""The folder a report is written into, replaced whole: the new report is written into a hidden sibling
folder, which takes the folder's place only once every file is written. An interrupt (SIGINT or SIGTERM),
a failure or a run that decides to keep nothing (``Staged.discard``) leaves the folder as it was (or
absent), and a finished run leaves nothing of the one before it.

A folder is only ever replaced when it is empty or holds what a report holds (``REPORT_ENTRIES``): a
folder with anything else in it is refused before any work, never deleted. Torch-free: the command line
checks ``--out`` with it before torch is imported.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import reprlib
import secrets
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

from .errors import raised_signal, signals_so_far
from .options import OptionError

__all__ = ["REPORT_ENTRIES", "check", "Staged", "previous_report"]

#: what a report folder holds
REPORT_ENTRIES = frozenset({"report.json", "report.csv", "report.md", "report.html", "policy.json", "command.txt",
                            "traces"})
_PREFIX = ".attnswitch-"  # the staging folder: .<name>.attnswitch-XXXX beside the folder


def previous_report(out: str | Path) -> bool:
    """Whether ``out`` holds a report now (one a failed or interrupted run keeps)."""
    d = Path(out)
    try:
        return d.is_dir() and any(d.iterdir())
    except OSError:  # (a name too long, a folder it may not read: none this run could keep)
        return False


def _new_folder(parent: Path, prefix: str) -> Path:
    """A new folder ``parent/prefixXXXXXXXX``, with the permissions any folder made here gets (``mkdtemp``'s
    are the owner's alone, which the report folder would keep)."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free name for a folder {prefix}... in {parent}")


def _nearest_existing(d: Path) -> Path:
    for p in (d, *d.parents):
        with contextlib.suppress(OSError):  # (a name too long: not there)
            if p.exists():
                return p
    return Path(".")


def check(out: str) -> None:
    """``out`` can take a report: absent (its parent folders are made), empty, or a report of an earlier
    run, and the folder it sits in can be written. Raises ``OptionError`` (about ``out``) otherwise."""
    if not str(out).strip():  # (an unset shell variable: nothing would be written, and nothing said)
        raise OptionError("{out} is empty: give the report a folder")
    if any(ord(c) < 32 or c == "\x7f" for c in str(out)):  # (the profiler cannot write its traces there)
        raise OptionError("{out} {given}: holds a line break or another control character; give a plain name",
                          given=repr(str(out)))
    _name_fits(Path(out), out)
    d = Path(out)
    if d.exists() and not d.is_dir():
        raise OptionError("{out} {given}: exists and is not a folder", given=out)
    here = Path.cwd().resolve()
    if d.resolve() == here or d.resolve() in here.parents:  # replacing it would pull the floor from under us
        raise OptionError("{out} {given}: is the current folder or holds it; give the report a folder of its own",
                          given=out)
    if d.is_dir() and _mount_point(d):  # (a volume: the folder beside it cannot take its place)
        raise OptionError("{out} {given}: is a mount point, and a report replaces its folder whole (a folder made "
                          "beside it takes its place); give a folder inside it", given=out)
    if d.is_dir():
        strange = sorted(p.name for p in d.iterdir() if p.name not in REPORT_ENTRIES)
        strange += _strange_traces(d / "traces")
        if strange:
            shown = ", ".join(strange[:5]) + (", ..." if len(strange) > 5 else "")
            raise OptionError("{out} {given}: holds what is not a report ({shown}), and a report replaces the "
                              "folder whole; give a new or empty folder, or an earlier report's", given=out,
                              shown=shown)
    where = _nearest_existing(d.resolve().parent)
    try:  # the staging folder is made beside ``out``: try making one there
        _new_folder(where, _PREFIX).rmdir()
    except OSError as e:
        raise OptionError("{out} {given}: cannot write there ({why})", given=out,
                          why=e.strerror or str(e)) from None


#: where the earlier report is moved aside (``.NAME.attnswitch-old-XXXXXXXX``), the longest name a run makes
_ASIDE = f"{_PREFIX}old-"
#: the most bytes a run adds to the folder's name, for a folder beside it
_ADDED = len("." + _ASIDE) + 8


def _name_fits(d: Path, given) -> None:
    """The folders a run makes beside ``d`` can be named: ``d``'s name and what a run adds to it fit the file
    system's limit (read before anything touches ``d``: a name past it fails every call on it)."""
    parent = Path(os.path.abspath(d)).parent
    try:
        most = os.pathconf(_nearest_existing(parent), "PC_NAME_MAX")
    except (OSError, ValueError):
        most = 255
    if any(len(os.fsencode(part)) > most for part in parent.parts):
        raise OptionError("{out} {given}: a folder on its path has a name longer than names here have (at most "
                          "{most} bytes)", given=reprlib.repr(str(given)), most=most)
    if len(os.fsencode(d.name)) + _ADDED > most:
        raise OptionError("{out} {given}: its name is too long: a run names a folder beside it .NAME{suffix}, and "
                          "names here have at most {most} bytes; give a name of at most {fits} bytes",
                          given=reprlib.repr(str(given)), suffix=f"{_ASIDE}XXXXXXXX", most=most,
                          fits=most - _ADDED)


_MOUNTS = "/proc/self/mountinfo"  # this process's mount table (Linux)


def _mount_point(d: Path) -> bool:
    """Whether the folder ``d`` (a link to it too) is a mount point: ``os.path.ismount`` of where it leads, or,
    on Linux, a mount point this process's mount table lists (a bind mount of a folder of the same file system,
    which ``ismount`` does not see)."""
    real = d.resolve()
    if os.path.ismount(real):
        return True
    try:
        with open(_MOUNTS, encoding="utf-8", errors="replace") as f:
            points = {_unescaped(line.split()[4]) for line in f if len(line.split()) > 4}
    except OSError:
        return False
    return str(real) in points


def _unescaped(field: str) -> str:
    """A path as the mount table writes it (a space as ``\\040``, a tab ``\\011``, ...)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _strange_traces(traces: Path) -> list[str]:
    """What a report's traces folder holds that no report writes: anything but ``trace_*.json.gz`` files, there
    or in one folder per shape of a sweep."""
    if not traces.is_dir():
        return []
    out = []
    for p in traces.iterdir():
        inside = list(p.iterdir()) if p.is_dir() else [p]
        out += [f"traces/{q.relative_to(traces)}" for q in inside
                if not (q.is_file() and q.name.startswith("trace_") and q.name.endswith(".json.gz"))]
    return sorted(out)


_RENAME_EXCHANGE = 2  # renameat2's flag: swap two paths in one step (Linux 3.15+, glibc 2.28+)
_AT_FDCWD = -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap the folders ``a`` and ``b`` in one step, where the system can; False where it cannot."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    return renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0


def _replace(new: Path, final: Path) -> None:
    """``new`` takes ``final``'s place; what ``final`` held is removed after."""
    if not final.exists():
        os.rename(new, final)
        return
    if _exchange(new, final):
        shutil.rmtree(new, ignore_errors=True)  # now the earlier report
        return
    old = _new_folder(final.parent, f".{final.name}{_ASIDE}")
    try:
        os.rename(final, old)  # (onto the empty folder just made)
    except OSError as e:  # a folder that cannot be moved (immutable, a mount point): left as it is
        with contextlib.suppress(OSError):
            old.rmdir()
        raise _Unmovable(e.strerror or str(e)) from None
    try:
        os.rename(new, final)
    except BaseException:
        os.rename(old, final)
        raise
    shutil.rmtree(old, ignore_errors=True)


class _Unmovable(OSError):
    """The report folder could not be moved aside for the new one to take its place."""


def _kept_beside(staged: Path, final: Path) -> Path:
    """``staged`` under a name of its own beside ``final`` (``final.new-XXXXXXXX``), or where it is where it cannot
    be moved there: where this run's report stays."""
    kept = None
    try:
        kept = _new_folder(final.parent, f"{final.name}.new-")
        os.rename(staged, kept)
        return kept
    except OSError:
        if kept is not None:
            with contextlib.suppress(OSError):
                kept.rmdir()
        return staged


@contextlib.contextmanager
def _signals_deferred() -> Iterator[None]:
    """SIGINT and SIGTERM held back for the block (where Python handles them, in the main thread), then
    handled as they would have been: a swap of two folders is never split by one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    saved = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if callable(handler):
            saved[sig] = signal.signal(sig, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
        if caught:
            saved[caught[0]](caught[0], None)


class Staged:
    """``with Staged(out) as path:`` write the report under ``path``; when the block ends without an
    exception, ``path`` becomes ``out`` (an earlier report there is replaced whole; ``replaced`` says so
    from then on). When it raises, or ``discard()`` was called in it, what was staged is removed, with the
    parent folders made for it, and ``out`` is as it was."""

    def __init__(self, out: str | Path, signals: int | None = None):
        self.given = str(out)
        self.final = Path(out).resolve()
        self.path: Path | None = None
        self.replaced = False
        self._made: list[Path] = []
        self._discarded = False
        # the signals recorded before this report's run began are not its own (``signals``: as the run counted them)
        self._signals = signals_so_far() if signals is None else signals

    def __enter__(self) -> Path:
        parent = self.final.parent
        self._made = [p for p in (parent, *parent.parents) if not p.exists()]  # deepest first
        parent.mkdir(parents=True, exist_ok=True)
        self.path = _new_folder(parent, f".{self.final.name}{_PREFIX}")
        return self.path

    def discard(self) -> None:
        """Keep nothing of this run: at the block's end ``out`` is left as it was."""
        self._discarded = True

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is None and not self._discarded:
            swallowed = raised_signal(self._signals)
            if swallowed is not None:  # a signal a library on the way turned into something else, or ignored
                self._discard()
                raise swallowed
            try:
                with _signals_deferred():  # a signal waits until the folders are swapped, never half
                    _replace(self.path, self.final)
                    self.replaced = True
                return
            except _Unmovable as e:  # nothing lost: the folder as it was, this run's report beside it
                earlier = previous_report(self.final)
                kept, self.path = _kept_beside(self.path, self.final), None
                raise OptionError("{out} {given}: could not be replaced ({why}); it {was}, and this run's report is "
                                  "in {kept}", given=self.given, why=str(e),
                                  was="holds the previous report" if earlier else "is as it was",
                                  kept=str(kept)) from None
            except BaseException:
                if not self.replaced:
                    self._discard()
                raise
        self._discard()

    def _discard(self) -> None:
        if self.path is not None and self.path.exists():
            shutil.rmtree(self.path, ignore_errors=True)
        for p in self._made:
            with contextlib.suppress(OSError):
                p.rmdir()
