"""One row of facts per built-in backend, and one module that reads and writes a candidate's name."""

import ast
import dataclasses
from pathlib import Path

import pytest

from attnswitch import catalog
from attnswitch.backends import registry
from attnswitch.candidate import Candidate, Policy, check_backends, parse

SRC = Path(__file__).resolve().parents[1] / "src" / "attnswitch"


def test_the_registry_is_the_catalog_joined_to_its_runners():
    assert tuple(n for n, b in registry.REGISTRY.items() if b.builtin) == catalog.NAMES
    assert {a: n for a, n in registry._ALIASES.items()} == catalog.ALIASES
    for r in catalog.ROWS:
        b = registry.REGISTRY[r.name]
        assert (b.about, b.devices, b.compared, b.package, b.module) == (r.about, r.devices, r.compared, r.package,
                                                                         r.module)
        assert (b.run is None) == (r.kind == "model")
        assert registry.resolve_name(r.name.upper()) == r.name
        for alias in r.aliases:
            assert registry.resolve_name(alias) == r.name


def test_a_row_without_its_runner_fails_at_import_not_silently(monkeypatch):
    extra = catalog.Row("newfam", "fused", "a new kernel", family=None)
    monkeypatch.setattr(catalog, "ROWS", (*catalog.ROWS, extra))
    monkeypatch.setattr(catalog, "NAMES", (*catalog.NAMES, "newfam"))
    before = dict(registry.REGISTRY)
    with pytest.raises(ImportError, match="without a runner: \\['newfam'\\]"):
        registry._register_builtins()
    assert registry.REGISTRY == before  # refused before anything was registered


def test_forced_families_and_their_sdpbackend_members_come_from_one_row():
    from torch.nn.attention import SDPBackend

    for name in catalog.FORCED:
        r = catalog.row(name)
        assert r.family == name and registry.resolve_name(getattr(SDPBackend, r.sdp_backend)) == name
    assert catalog.kernel_family(["fmha_cutlassF_bf16_aligned_64x64_rf_sm80"]) == "efficient"
    assert catalog.kernel_family(["cudnn_generated_fort_native_sdpa_sm90_flash_fprop"]) == "cudnn"
    assert catalog.attention_family("ampere_bf16_s16816gemm") is None


def _literals(path: Path, words: set[str]) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text())
    return [(n.lineno, n.value) for n in ast.walk(tree) if isinstance(n, ast.Constant) and n.value in words]


def test_the_sdpa_family_names_are_literals_only_in_the_catalog_and_their_runner():
    # "cudnn" is also the key of the cuDNN library's version in an environment (env.py and its readers, a defect's
    # range of them, how it is printed; cli.py: defects --cudnn)
    versions = {"env.py", "_versions.py", "deploy.py", "sections.py", "defects.py", "cli.py"}
    found = []
    for path in SRC.rglob("*.py"):
        if path.name == "catalog.py" or path.relative_to(SRC).as_posix() == "backends/sdpa.py":
            continue
        words = set(catalog.FAMILIES) - ({"cudnn"} if path.name in versions else set())
        found += [(path.relative_to(SRC).as_posix(), line, w) for line, w in _literals(path, words)]
    assert not found, found


def test_no_module_but_the_candidates_reads_a_candidates_name():
    sniffs = []
    for path in SRC.rglob("*.py"):
        if path.name == "candidate.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Compare) and isinstance(node.left, ast.Constant) and node.left.value in (
                    "=", "+compile", "/") and any(isinstance(op, (ast.In, ast.NotIn)) for op in node.ops):
                sniffs.append((path.relative_to(SRC).as_posix(), node.lineno))
    assert not sniffs, sniffs


@pytest.mark.parametrize("text, want", [
    ("flash", Candidate("flash")),
    ("flash+compile", Candidate("flash", "default")),
    ("cudnn+compile:reduce-overhead", Candidate("cudnn", "reduce-overhead")),
    ("prefill=cudnn/decode=flash", Candidate(Policy("cudnn", "flash"))),
    ("prefill=cudnn/decode=flash/decode_max_query=4+compile:max-autotune",
     Candidate(Policy("cudnn", "flash", 4), "max-autotune")),
])
def test_a_candidate_is_read_and_written_in_one_module_both_ways(text, want):
    assert parse(text) == want and str(want) == text
    assert parse(text).uncompiled.compile is None and dataclasses.replace(want, compile=None) == want.uncompiled


def test_names_are_made_canonical_only_where_asked():
    assert parse("prefill=SDPA/decode=flash_attention", registry.resolve_name) == Candidate(Policy("auto", "flash"))
    assert parse("prefill=SDPA/decode=flash_attention").policy.prefill == "SDPA"  # a report read back: as written
    assert check_backends("naive, prefill=cudnn/decode=mem_efficient,naive") == [
        "naive", "prefill=cudnn/decode=efficient"]
    with pytest.raises(ValueError, match="unknown phase key"):
        parse("prefil=cudnn/decode=flash")
    for limit in ("0", "99999999999999999999"):  # (the second made every call a decode step)
        with pytest.raises(ValueError, match="decode_max_query must be an int from 1 to 65536"):
            parse(f"prefill=cudnn/decode=flash/decode_max_query={limit}")


def test_a_tie_prefers_what_changes_least():
    order = sorted(["naive", "math", "my-kernel", "flash", "auto", "flash+compile", "prefill=auto/decode=naive"],
                   key=lambda n: parse(n).preference())
    assert order[:2] == ["auto", "flash"] and order.index("my-kernel") < order.index("math")
    assert order.index("flash") < order.index("flash+compile") < order.index("naive")


@pytest.mark.parametrize("text", [
    "sliding_attention=flex/full_attention=flash",
    "sliding_attention=flex/full_attention.prefill=cudnn/full_attention.decode=flash",
    "encoder=cudnn/decoder=flash/cross=math+compile",
    "text:sliding_attention=flex/vision=cudnn",
])
def test_a_backend_per_layer_kind_is_read_and_written_both_ways(text):
    from attnswitch.candidate import Kinds, selection_of

    c = parse(text)
    assert isinstance(c.selection, Kinds) and str(c) == text and parse(str(c)) == c
    assert selection_of(c.selection.as_dict()) == c.selection  # its mapping form is the same selection


def test_a_phase_is_not_a_kind_and_kinds_do_not_go_inside_a_phase():
    from attnswitch.candidate import choose, selection_of

    with pytest.raises(ValueError, match="put a policy inside each kind"):
        selection_of({"prefill": {"sliding_attention": "flex"}, "decode": "flash"})
    sel = parse("sliding_attention=flex/full_attention.prefill=cudnn/full_attention.decode=flash").selection
    assert [choose(sel, q, k) for q, k in ((9, "sliding_attention"), (1, "sliding_attention"), (9, "full_attention"),
                                           (1, "full_attention"), (9, "cross"))] == ["flex", "flex", "cudnn", "flash",
                                                                                    None]
