"""The README and docs/ cannot drift from the code: every fenced command and Python block in them is checked,
and a representative set of them is run, on a CPU, with a tiny Llama.

- Each ``attnswitch ...`` command (also ``python -m attnswitch ...`` and under ``torchrun``) must be taken
  by the command line's parser and its checks, which run before any work; a representative set of them
  runs end to end through ``attnswitch.cli.main`` with the model made small (tiny-llama, one layer, short
  sequences, one timed step) and must exit 0.
- The README's ```python blocks run as written, in a namespace of their own: a reader's first contact.
- Each ```python block of docs/ runs, the blocks of a page in order in one namespace, where ``model`` and
  ``m`` are a tiny Llama, ``batch`` its inputs and ``q``, ``k``, ``v`` attention inputs. A block that fails
  as written on a machine without CUDA runs again with CUDA-only backends replaced by CPU ones. A block
  marked ``<!-- not run: reason -->`` on the line before it is compiled instead. In every block, the
  attributes of ``attnswitch`` used, and the keywords passed to its functions, must exist.
- Other shell lines must name scripts, modules, extras and test paths that exist; inline ``--flags`` must
  be the command line's; inline ``attnswitch.names`` must resolve; every test ``docs/promises.md`` names
  must exist; relative links and their anchors must resolve.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import importlib.util
import inspect
import io
import os
import re
import shlex
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from conftest import batch_for, tiny

import attnswitch
from attnswitch import cli

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGUAGES = {"bash", "python", "text"}
NOT_RUN = re.compile(r"^<!--\s*not run(?::\s*(?P<reason>.*?))?\s*-->$")
CUDA = torch.cuda.is_available()
#: backends that need CUDA, and what a CPU runs in their place
CUDA_ONLY = {"cudnn": "flash", "efficient": "math", "flex": "naive", "fa2": "flash", "fa3": "flash"}
#: the presets too large for a quick CPU run, and hub-sized models, in Python blocks
LARGE_MODELS = ("llama-3.2-1b", "qwen2.5-0.5b", "mistral-7b")
#: flags of other programs the docs mention
FOREIGN_FLAGS = {"--nproc-per-node", "--find-links", "--index-url"}
#: the README's first lines, which CI's script runs
FIRST_LINES = [
    "# attnswitch",
    "",
    "```bash",
    'pip install "torch==2.13.0" -e . && attnswitch compare --out report/     # install, then rank every attention '
    "backend on the default model",
    'pip install "torch==2.13.0" -e ".[test]" && ruff check . && python -m pytest -q -n auto   # install, then '
    "lint and run the tests (CPU)",
    "```",
]


# -- reading the pages ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # of the opening fence, 1-based
    lang: str
    text: str
    not_run: str | None  # the reason given in a <!-- not run: reason --> marker

    @property
    def where(self) -> str:
        page = self.page.relative_to(ROOT) if self.page.is_relative_to(ROOT) else self.page
        return f"{page}:{self.line}"


def blocks(page: Path) -> list[Block]:
    lines = page.read_text().splitlines()
    out, i = [], 0
    while i < len(lines):
        m = re.match(r"^```(.*)$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1).strip()
        end = next((j for j in range(i + 1, len(lines)) if lines[j].strip() == "```"), None)
        assert end is not None, f"{page.name}:{i + 1}: a fence that is never closed"
        before = next((lines[j].strip() for j in range(start - 1, -1, -1) if lines[j].strip()), "")
        marker = NOT_RUN.match(before)
        reason = None
        if marker:
            reason = (marker.group("reason") or "").strip()
            assert reason, f"{page.name}:{start + 1}: a not-run marker needs a reason: <!-- not run: why -->"
        out.append(Block(page, start + 1, lang, "\n".join(lines[start + 1:end]), reason))
        i = end + 1
    return out


ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]


def shell_lines(block: Block) -> list[str]:
    """The block's commands: continuation lines joined, blank lines and comments dropped."""
    out, pending = [], ""
    for raw in block.text.splitlines():
        line = pending + raw.strip()
        if line.endswith("\\"):
            pending = line[:-1] + " "
            continue
        pending = ""
        if line and not line.startswith("#"):
            out.append(line)
    return out


def segments(line: str) -> list[list[str]]:
    """A line's simple commands (split at ``&&``, ``||``, ``;`` and ``|``), each as words, comments dropped."""
    lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
    lex.whitespace_split = True
    lex.commenters = "#"
    out, cur = [], []
    for word in lex:
        if word in ("&&", "||", ";", "|", "&"):
            out.append(cur)
            cur = []
        else:
            cur.append(word)
    out.append(cur)
    return [s for s in out if s]


def attnswitch_argv(words: list[str]) -> list[str] | None:
    """The arguments after ``attnswitch`` (or ``-m attnswitch``, under python or torchrun); None for
    another command."""
    while words and re.match(r"^[A-Z_]+=", words[0]):  # VAR=value before the command
        words = words[1:]
    if not words:
        return None
    if words[0] == "attnswitch":
        return words[1:]
    if "-m" in words:
        i = words.index("-m")
        if i + 1 < len(words) and words[i + 1] == "attnswitch":
            return words[i + 2:]
    return None


FIRST_COMMAND = attnswitch_argv(segments(FIRST_LINES[3])[1])  # attnswitch compare --out report/
COMMANDS = [(b, argv) for b in ALL_BLOCKS if b.lang == "bash" and b.not_run is None
            for line in shell_lines(b) for words in segments(line)
            if (argv := attnswitch_argv(words)) is not None]
OTHER_COMMANDS = [(b, words) for b in ALL_BLOCKS if b.lang == "bash"
                  for line in shell_lines(b) for words in segments(line) if attnswitch_argv(words) is None]
PYTHON = [b for b in ALL_BLOCKS if b.lang == "python"]


def _id(block: Block, argv: list[str]) -> str:
    return f"{block.where}:{' '.join(argv)}"[:120]


# -- the pages themselves ---------------------------------------------------------------------------------------

def test_the_readme_begins_with_the_two_commands_ci_runs():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert lines[:len(FIRST_LINES)] == FIRST_LINES
    ci = (ROOT / ".ci" / "run").read_text()
    assert 'pip install -q "torch==2.13.0" -e ".[test]" && ruff check . && python -m pytest -q -n auto' in ci


def test_the_readme_is_for_the_first_ten_minutes():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 150


def test_every_fence_says_its_language_and_every_not_run_block_why():
    assert len(PAGES) > 5 and ALL_BLOCKS
    for b in ALL_BLOCKS:
        assert b.lang in LANGUAGES, f"{b.where}: a fence needs one of {sorted(LANGUAGES)}, not {b.lang!r}"
        assert b.not_run is None or b.lang == "python", f"{b.where}: only Python blocks may be left unrun"
    for page in PAGES:  # a fence inside a list or a quote would be missed: there is none
        for n, line in enumerate(page.read_text().splitlines(), 1):
            assert not re.match(r"^\s+```", line), f"{page.name}:{n}: an indented fence"


# -- commands ---------------------------------------------------------------------------------------------------

@pytest.fixture
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _lengths_file(argv: list[str]) -> None:
    """The file ``--prompt-lens-from`` names, written where the command reads it: short prompts."""
    if "--prompt-lens-from" in argv:
        path = Path(argv[argv.index("--prompt-lens-from") + 1])
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("8\n8\n12\n")


@pytest.mark.parametrize("block,argv", COMMANDS, ids=[_id(b, a) for b, a in COMMANDS])
def test_every_command_is_taken_by_the_command_line(block, argv, in_tmp):
    """What the parser and the checks before any work take (names, numbers, combinations, --out)."""
    assert COMMANDS
    _lengths_file(argv)
    if "--help" in argv or "--version" in argv:
        with contextlib.redirect_stdout(io.StringIO()):
            assert cli.main(argv) == 0, block.where
        return
    try:
        args = cli.build_parser().parse_args(argv)
    except SystemExit as e:
        pytest.fail(f"{block.where}: the parser refuses `{' '.join(argv)}` (exit {e.code})")
    if cli.COMMANDS[args.command].options is not None and cli.COMMANDS[args.command].model:
        cli._check_options(args)


def _small(values: str, small: list[str]) -> str:
    """A value or a list as small as ``small``, keeping a list a list (a sweep stays a sweep)."""
    return ",".join(small[:min(len(values.split(",")), len(small))])


#: each option's small value on a CPU (a list keeps up to two of them, and only the first list of a command)
SMALL = {"--seq": ["8", "16"], "--batch": ["2", "1"], "--prompt-len": ["8", "12"], "--new-tokens": ["2", "3"],
         "--prompt-lens": ["6", "8"], "--num-layers": ["1"], "--iters": ["1"], "--rounds": ["1"],
         "--warmup": ["0"], "--time-budget": ["0"], "--requests": ["50"]}
#: what an end-to-end run always sets, where the command does not
QUICK = {"--num-layers": "1", "--iters": "1", "--warmup": "0", "--time-budget": "0"}


def runnable(argv: list[str]) -> list[str] | None:
    """``argv`` made cheap on a CPU, or None where it cannot run here (several GPUs, torchrun, inductor)."""
    args = cli.build_parser().parse_args(argv)
    if not cli.COMMANDS[args.command].model or args.command in ("env", "presets"):  # no model: as it is
        return argv
    if args.device_map or args.tp or (getattr(args, "compile", "none") or "none") != "none":
        return None
    out = [args.command, "tiny-llama"]
    rest = argv[1:]
    given, listed = set(), False
    i = 0
    while i < len(rest):
        flag = rest[i]
        if not flag.startswith("--"):  # the model, replaced by the tiny Llama
            i += 1
            continue
        takes = i + 1 < len(rest) and not rest[i + 1].startswith("--") \
            and flag not in ("--padding", "--layers", "--unfold", "--no-numerics", "--trust-remote-code")
        value = rest[i + 1] if takes else None
        i += 2 if takes else 1
        if flag in ("--device", "--dtype"):
            continue
        if flag in SMALL:
            value = _small(value, SMALL[flag] if not (listed and "," in value) else SMALL[flag][:1])
            listed = listed or "," in value  # a sweep over one list is enough to run: the others keep one value
        elif flag == "--backends" and not CUDA and value != "all":
            names = [n for n in value.split(",") if "=" in n or cli.options.backend_key(n) not in CUDA_ONLY]
            value = ",".join(names) or "naive,math"
        elif flag == "--out":
            value = str(Path("out") / value)
        given.add(flag)
        out += [flag] + ([value] if value is not None else [])
    if "--backends" not in given and (args.mode == "generate" or _signature(argv)[3]):
        out += ["--backends", "naive,math"]  # a generate or a sweep: two backends are enough to run it
    if args.mode == "generate" and not given & {"--prompt-len", "--prompt-lens", "--prompt-lens-from"}:
        out += ["--prompt-len", "8"]
    if args.mode == "generate" and "--new-tokens" not in given:
        out += ["--new-tokens", "2"]
    if args.mode != "generate" and "--seq" not in given:
        out += ["--seq", "16"]
    if args.command != "check":
        out += [x for flag, v in QUICK.items() if flag not in given for x in (flag, v)]
    else:
        out += ["--num-layers", "1"] if "--num-layers" not in given else []
    return out + ["--device", "cpu", "--dtype", "fp32"]


#: options that change what a run does, beyond its sizes
BEHAVIOUR = {"--padding", "--prompt-lens", "--prompt-lens-from", "--layers", "--unfold", "--no-numerics", "--out"}


def _signature(argv: list[str]) -> tuple:
    """What makes a run differ from another: the subcommand, the mode, the options that change what it does,
    whether it is a sweep, a static cache, a policy per phase."""
    args = cli.build_parser().parse_args(argv)
    sweep = any("," in a for a, prev in zip(argv[1:], argv) if prev in ("--seq", "--batch", "--prompt-len",
                                                                         "--new-tokens"))
    policy = "=" in (getattr(args, "backends", "") or "")
    return (args.command, getattr(args, "mode", None), tuple(sorted(BEHAVIOUR & set(argv))), sweep, policy,
            getattr(args, "cache", None))


def _representative() -> list[tuple[Block, list[str]]]:
    seen, out = {_signature(FIRST_COMMAND)}, []
    for block, argv in COMMANDS:
        if "--help" in argv or "--version" in argv:
            continue
        small = runnable(argv)
        if small is None or _signature(argv) in seen:
            continue
        seen.add(_signature(argv))
        out.append((block, small))
    return out


RUNS = _representative()


def test_a_representative_set_of_commands_runs():
    kinds = {(argv[0], _signature(argv)[1]) for _, argv in RUNS}
    assert {("compare", "prefill"), ("compare", "generate"), ("compare", "train"), ("compare", "decode"),
            ("profile", "prefill"), ("check", "prefill"), ("env", None), ("presets", None),
            ("defects", None)} <= kinds, kinds
    signatures = [_signature(argv) for _, argv in RUNS]
    assert any(s[3] for s in signatures) and any(s[4] for s in signatures), "a sweep and a policy per phase run"
    assert any("--prompt-lens-from" in s[2] for s in signatures)


@pytest.mark.parametrize("block,argv", RUNS, ids=[_id(b, a) for b, a in RUNS])
def test_the_command_runs_on_a_cpu(block, argv, in_tmp, capsys):
    _lengths_file(argv)
    code = cli.main(argv)
    out = capsys.readouterr()
    assert code == 0, f"{block.where}: `attnswitch {' '.join(argv)}` exited {code}\n{out.err[-2000:]}"
    if argv[0] == "compare":
        assert "Recommendation" in out.out
    if "--out" in argv:
        folder = Path(argv[argv.index("--out") + 1])
        assert {"report.json", "report.html", "command.txt"} <= {p.name for p in folder.iterdir()}


# -- other shell lines ------------------------------------------------------------------------------------------

def _extras() -> set[str]:
    text = (ROOT / "pyproject.toml").read_text()
    part = text.split("[project.optional-dependencies]", 1)[1].split("\n[", 1)[0]
    return set(re.findall(r"^(\w[\w-]*)\s*=", part, re.M))


def _module_exists(name: str) -> bool:
    sys.path.insert(0, str(ROOT))
    try:
        return importlib.util.find_spec(name) is not None
    finally:
        sys.path.remove(str(ROOT))


@pytest.mark.parametrize("block,words", OTHER_COMMANDS, ids=[_id(b, w) for b, w in OTHER_COMMANDS])
def test_every_other_command_names_what_exists(block, words):
    while words and re.match(r"^[A-Z_]+=", words[0]):
        words = words[1:]
    tool, rest = words[0], words[1:]
    if tool == "pip":
        assert rest[0] == "install"
        for spec in rest[1:]:
            extras = re.match(r"^(?:\.|attnswitch)\[([\w,-]+)\]$", spec)
            if extras:
                assert set(extras.group(1).split(",")) <= _extras(), f"{block.where}: no such extra: {spec}"
            elif spec in (".", "-e") or spec.startswith("-"):
                continue
            elif not spec.startswith("http"):
                assert re.match(r"^torch(==[\d.]+)?$", spec), f"{block.where}: installs {spec}"
    elif tool == "ruff":
        assert rest[0] == "check"
    elif tool in ("python", "python3"):
        if rest[:2] == ["-m", "pytest"]:
            paths = [w for w in rest[2:] if not w.startswith("-") and w not in ("slow", "gpu", "auto")]
            assert all((ROOT / p).exists() for p in paths), f"{block.where}: {paths}"
        elif rest[0] == "-m":
            assert _module_exists(rest[1]), f"{block.where}: no module {rest[1]}"
            if rest[1].startswith("attnswitch."):  # its own command line: every flag must be its own
                source = Path(importlib.util.find_spec(rest[1]).origin).read_text()
                assert all(f'"{w}"' in source for w in rest if w.startswith("--")), block.where
        else:
            assert (ROOT / rest[0]).is_file(), f"{block.where}: no script {rest[0]}"
    elif tool == "bash":
        assert (ROOT / rest[0]).is_file(), f"{block.where}: no script {rest[0]}"
    elif tool == "cd":
        pass
    else:
        pytest.fail(f"{block.where}: a command this test does not know how to check: {' '.join(words)}")


# -- Python blocks ----------------------------------------------------------------------------------------------

def _resolve(dotted: str):
    """``attnswitch.a.b``: the object, importing submodules as needed; AttributeError where it is not."""
    parts = dotted.split(".")
    obj = importlib.import_module(parts[0])
    for i, part in enumerate(parts[1:], 1):
        try:
            obj = getattr(obj, part)
        except AttributeError:
            try:
                obj = importlib.import_module(".".join(parts[:i + 1]))
            except ModuleNotFoundError:
                raise AttributeError(f"{dotted}: {'.'.join(parts[:i])} has no {part}") from None
    return obj


def _check_names(block: Block) -> None:
    """Every ``attnswitch.x`` a block uses exists, and every keyword it passes to one of them is taken."""
    tree = ast.parse(block.text, filename=block.where)
    imported = {}  # local name -> dotted name, from ``from attnswitch.x import y``
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("attnswitch"):
            for alias in node.names:
                imported[alias.asname or alias.name] = f"{node.module}.{alias.name}"

    def dotted(node) -> str | None:
        if isinstance(node, ast.Name):
            return "attnswitch" if node.id == "attnswitch" else imported.get(node.id)
        if isinstance(node, ast.Attribute):
            base = dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        return None

    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute | ast.Name) and (name := dotted(node)):
            _resolve(name)
        if isinstance(node, ast.Call) and (name := dotted(node.func)):
            fn = _resolve(name)
            try:
                params = inspect.signature(fn).parameters
            except (TypeError, ValueError):
                continue
            if any(p.kind is p.VAR_KEYWORD for p in params.values()):
                continue
            for kw in node.keywords:
                assert kw.arg is None or kw.arg in params, f"{block.where}: {name}() takes no {kw.arg}="


@pytest.mark.parametrize("block", PYTHON, ids=[b.where for b in PYTHON])
def test_every_python_block_uses_names_that_exist(block):
    compile(block.text, block.where, "exec")
    _check_names(block)


def _on_cpu(text: str) -> str:
    """The block with CUDA-only backends named as CPU ones, and large presets as the tiny Llama."""
    for name, cpu in CUDA_ONLY.items():
        text = re.sub(rf"""(["']){re.escape(name)}\1""", rf"\g<1>{cpu}\g<1>", text)
    for name in LARGE_MODELS:
        text = text.replace(f'"{name}"', '"tiny-llama"')
    return text


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A folder with what the blocks read: the report the README's first command writes (``report/``, the
    command made small) and a file of prompt lengths."""
    d = tmp_path_factory.mktemp("docs")
    first = runnable(FIRST_COMMAND)
    here = os.getcwd()
    os.chdir(d)
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            assert cli.main(first) == 0
    finally:
        os.chdir(here)
    (d / "out" / "report").rename(d / "report")
    (d / "lengths.txt").write_text("8\n8\n12\n")
    return d


def test_the_readmes_first_command_writes_a_whole_report(workdir):
    assert FIRST_COMMAND == ["compare", "--out", "report/"]
    written = {p.name for p in (workdir / "report").iterdir()}
    assert written == {"report.json", "report.csv", "report.md", "report.html", "policy.json", "command.txt",
                       "traces"}


def _namespace() -> dict:
    model = tiny("llama")
    batch = batch_for(model)
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 8, 16, 64, generator=g) for _ in range(3))
    return {"attnswitch": attnswitch, "torch": torch, "model": model, "m": model, "batch": batch,
            "input_ids": batch["input_ids"], "q": q, "k": k, "v": v}


def _tidy(ns: dict, registered: set) -> None:
    """Whatever a page's blocks left switched, patched or registered, undone."""
    for value in ns.values():
        if isinstance(value, torch.nn.Module) and attnswitch.is_patched(value) is not None:
            attnswitch.unpatch(value)
    for name in set(attnswitch.backends.registry.names()) - registered:
        attnswitch.unregister_backend(name)


README = ROOT / "README.md"
#: the pages whose Python blocks run with the names above given; the README's run as written (below)
PAGES_WITH_PYTHON = sorted({b.page for b in PYTHON if b.not_run is None} - {README})


@pytest.mark.parametrize("page", PAGES_WITH_PYTHON, ids=[str(p.relative_to(ROOT)) for p in PAGES_WITH_PYTHON])
def test_the_python_blocks_of_a_page_run(page, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    ns = _namespace()
    registered = set(attnswitch.backends.registry.names())
    try:
        for block in (b for b in PYTHON if b.page == page and b.not_run is None):
            code = compile(block.text, block.where, "exec")
            before = dict(ns)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    exec(code, ns)
            except Exception:
                if CUDA or _on_cpu(block.text) == block.text:
                    raise
                _tidy(ns, registered)
                ns.clear()
                ns.update(before)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    exec(compile(_on_cpu(block.text), block.where, "exec"), ns)
            assert attnswitch.active_backend() is None, f"{block.where} left a backend() context open"
    finally:
        _tidy(ns, registered)
        capsys.readouterr()


def test_the_readmes_python_runs_as_written(tmp_path, monkeypatch, capsys):
    """A reader's first contact: the README's Python, block after block, in a namespace of its own (every
    name it uses it defines or imports), as written (no backend named in its place), on this machine."""
    blocks = [b for b in PYTHON if b.page == README]
    assert blocks and all(b.not_run is None for b in blocks)
    monkeypatch.chdir(tmp_path)
    ns: dict = {"__name__": "__main__"}
    registered = set(attnswitch.backends.registry.names())
    try:
        for block in blocks:
            exec(compile(block.text, block.where, "exec"), ns)
            assert attnswitch.active_backend() is None, f"{block.where} left a backend() context open"
        out = capsys.readouterr().out
    finally:
        _tidy(ns, registered)
    report = ns["report"]
    assert isinstance(report, attnswitch.Report) and report.pick is not None
    assert str(report) in out and "Recommendation" in out  # what it printed: the report
    assert all(attnswitch.is_patched(v) is None for v in ns.values() if isinstance(v, torch.nn.Module))


# -- names, flags, tests and links in the prose -----------------------------------------------------------------

def _inline_code(page: Path) -> list[str]:
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    return re.findall(r"`([^`\n]+)`", text)


def test_every_attnswitch_name_in_the_prose_exists():
    names = {m for page in PAGES for code in _inline_code(page)
             for m in re.findall(r"(?<![\w.:])attnswitch(?:\.[A-Za-z_]\w*)+", code)}
    assert "attnswitch.load_policy" in names
    for name in sorted(names):
        _resolve(name)


def _flags() -> set[str]:
    parser = cli.build_parser()
    found = set()
    for action in parser._actions:
        found.update(action.option_strings)
        for sub in (getattr(action, "choices", None) or {}).values():
            if hasattr(sub, "_actions"):
                found.update(s for a in sub._actions for s in a.option_strings)
    return found


def test_every_flag_in_the_prose_is_the_command_lines():
    flags = _flags()
    said = {f for page in PAGES for code in _inline_code(page) for f in re.findall(r"(?<![\w-])--[a-z][a-z-]*", code)}
    assert {"--prompt-lens-from", "--requests", "--compile", "--time-budget"} <= said
    assert said - flags <= FOREIGN_FLAGS, sorted(said - flags - FOREIGN_FLAGS)


def test_every_test_the_promises_name_exists():
    text = (ROOT / "docs" / "promises.md").read_text()
    named = re.findall(r"`(tests/[\w/]+\.py)(?:::(\w+))?`", text)
    assert len(named) > 50
    for path, name in named:
        source = ROOT / path
        assert source.is_file(), path
        if name:
            assert re.search(rf"^\s*(?:async\s+)?def {name}\(", source.read_text(), re.M), f"{path}::{name}"


def _anchors(page: Path) -> set[str]:
    out = set()
    for line in page.read_text().splitlines():
        m = re.match(r"^#+\s+(.*)$", line)
        if m:
            slug = re.sub(r"[^\w\- ]", "", m.group(1).strip().lower()).replace(" ", "-")
            out.add(slug)
    return out


def test_every_relative_link_and_anchor_resolves():
    for page in PAGES:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            assert dest.exists(), f"{page.name}: a link to {target}"
            if anchor and dest.suffix == ".md":
                assert anchor in _anchors(dest), f"{page.name}: no heading #{anchor} in {dest.name}"
