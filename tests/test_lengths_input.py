"""A length mix is bad input where it says nothing a run can be measured or priced on: counts that are not
finite, digits ``int`` does not read, lengths past any model's positions (or the model's own), numpy's
integers taken as the integers they are; a sweep's length mix and run of requests checked before anything is
measured. Each is answered with one line: a ``ValueError`` of the library, exit 2 and one line on stderr from
the command line."""

import math

import numpy as np
import pytest
from conftest import tiny

from attnswitch import cli, comparison, options
from attnswitch.comparison import compare_sweep
from attnswitch.lengths import MAX_LENGTH, Lengths, read_lengths


def _read(tmp_path, name, text):
    p = tmp_path / name
    p.write_text(text)
    return p


def _refused(tmp_path, name, text) -> str:
    with pytest.raises(ValueError) as e:
        read_lengths(_read(tmp_path, name, text))
    message = str(e.value)
    assert name in message and "\n" not in message, message
    return message


# -- counts --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ['{"16": Infinity, "32": 1}', '{"16": -Infinity, "32": 1}', '{"16": NaN}',
                                  '[[16, 1], [32, Infinity]]', '[[16, Infinity], [16, 1]]', '[[16, 1], [16, NaN]]'])
def test_a_count_that_is_not_finite_is_refused(tmp_path, text):
    assert "finite counts" in _refused(tmp_path, "mix.json", text)


@pytest.mark.parametrize("counts", [{16: math.inf, 32: 1}, {16: math.nan}, {16: -1}, {16: np.float64("inf")}])
def test_lengths_of_refuses_counts_that_are_not_finite_or_negative(counts):
    with pytest.raises(ValueError, match="finite counts of 0 or more"):
        Lengths.of(counts)


@pytest.mark.parametrize("text, weights", [
    ('{"16": 1e308, "32": 1e308}', ((16, 0.5), (32, 0.5))),  # their sum is beyond a float's range
    ('{"16": 3e307, "32": 1e308}', ((16, 3 / 13), (32, 10 / 13))),
    ('[[16, 1e308], [16, 1e308], [32, 2e308]]', None),  # (2e308 is inf in JSON: refused below)
    ('[[16, 1e308], [16, 1e308], [32, 1e308]]', ((16, 2 / 3), (32, 1 / 3))),  # a length's counts added exactly
    ('{"16": 5e-324, "32": 5e-324}', ((16, 0.5), (32, 0.5))),
    ('{"16": 100000000000000000000000000000000000000000000000000, "32": 300000000000000000000000000000000000000000000'
     '000000}', ((16, 0.25), (32, 0.75))),
])
def test_huge_and_tiny_finite_counts_are_weighed_as_they_are(tmp_path, text, weights):
    p = _read(tmp_path, "mix.json", text)
    if weights is None:
        with pytest.raises(ValueError, match="finite counts"):
            read_lengths(p)
        return
    got = read_lengths(p).weights
    assert [n for n, _ in got] == [n for n, _ in weights]
    assert all(w == pytest.approx(want, rel=1e-12) and math.isfinite(w) for (_, w), (_, want) in zip(got, weights))
    assert math.fsum(w for _, w in got) == pytest.approx(1.0)


def test_huge_counts_price_a_run_as_equal_counts_do(tmp_path):
    from attnswitch.results import BackendResult, GenerateStats, SweepPoint
    from attnswitch.serving import serving_estimate

    def point(seq, ms):
        rows = tuple(BackendResult(n, "ok", time_ms=ms + d, time_rounds_ms=((ms + d,),), noise_pct=1.0,
                                   generate=GenerateStats(new_shape_step_ms=3.0, seen_shape_step_ms=2.0))
                     for n, d in (("A", 0.0), ("B", 2.0)))
        return SweepPoint(1, seq, rows, ("A", "B"), ("A",), new_tokens=4)

    points = [point(16, 10.0), point(32, 20.0)]
    huge = serving_estimate(points, read_lengths(_read(tmp_path, "big.json", '{"16": 1e308, "32": 1e308}')), 10, 4)
    even = serving_estimate(points, Lengths.of({16: 1, 32: 1}), 10, 4)
    assert huge.per_request_ms == even.per_request_ms and all(v > 15 for v in huge.per_request_ms.values())


@pytest.mark.parametrize("text", ['[[16, "x"], [16, 1]]', '[[16, 1], [16, "x"]]', '[[16, true], [16, 1]]'])
def test_a_bad_count_is_refused_whichever_of_a_lengths_entries_it_is(tmp_path, text):
    assert "got 16: " in _refused(tmp_path, "mix.json", text)


def test_zero_counts_are_left_out_and_all_zero_is_no_lengths(tmp_path):
    assert read_lengths(_read(tmp_path, "mix.json", '{"16": 0, "32": 2}')).weights == ((32, 1.0),)
    assert "no prompt lengths" in _refused(tmp_path, "zero.json", '{"16": 0}')


# -- lines ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("line", ["\u00b2", "\u0661\u0666", "\uff11\uff16", "1_6", "16 32", "+16", "16.0"])
def test_a_line_int_would_not_read_as_written_names_the_file_and_the_line(tmp_path, line):
    message = _refused(tmp_path, "lens.txt", f"16\n{line}\n")
    assert message.startswith(f"{tmp_path / 'lens.txt'}:2: expected one prompt length"), message


def test_a_byte_order_mark_is_not_part_of_the_first_length(tmp_path):
    assert read_lengths(_read(tmp_path, "lens.txt", "\ufeff16\n32\n")).weights == ((16, 0.5), (32, 0.5))


# -- bounds --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, message", [
    ("lens.txt", "16\n99999999999\n", "lens.txt:2: prompt length 99999999999 is beyond any model's positions"),
    ("lens.txt", "16\n" + "9" * 5000 + "\n", "lens.txt:2: "),  # more digits than int reads
    ("mix.json", '{"99999999999999999999": 1}', "prompt length 99999999999999999999 in "),
    ("mix.json", '[[16, 1], [99999999999, 1]]', "prompt length 99999999999 in "),
    ("mix.json", '{"16": 1, "%s": 1}' % ("9" * 5000), "mix.json"),
    ("mix.json", '[[%s, 1]]' % ("9" * 5000), "mix.json: not valid JSON"),
])
def test_a_length_past_any_models_positions_is_refused_when_read(tmp_path, name, text, message):
    said = _refused(tmp_path, name, text)
    assert message in said and len(said) < 300, said


def test_the_bound_is_the_one_a_workload_is_checked_against():
    Lengths.of({MAX_LENGTH: 1})
    options.check_shape(1, MAX_LENGTH, "generate")
    with pytest.raises(ValueError, match=f"at most {MAX_LENGTH}"):
        Lengths.of({MAX_LENGTH + 1: 1})
    with pytest.raises(options.OptionError, match=f"prompt_len {MAX_LENGTH + 1} is beyond any model's positions"):
        options.check_shape(1, MAX_LENGTH + 1, "generate")
    with pytest.raises(options.OptionError, match="seq 99999999999 is beyond"):
        options.check_shape(1, 99999999999, "prefill")
    with pytest.raises(options.OptionError, match="batch 99999999999 is beyond"):
        options.check_shape(99999999999, 16)


# -- numpy ---------------------------------------------------------------------------------------------

def test_numpy_integers_are_lengths_and_counts():
    assert Lengths.of(np.array([16, 32, 32])).weights == Lengths.of([16, 32, 32]).weights
    assert Lengths.of({16: np.int64(2), np.int32(32): np.float32(2)}).weights == ((16, 0.5), (32, 0.5))
    assert Lengths.of({np.uint16(16): 1, 32.0: 3}).weights == ((16, 0.25), (32, 0.75))
    assert all(type(n) is int for n in Lengths.of(np.array([16, 32])).lengths)


@pytest.mark.parametrize("counts", [{True: 1}, [True, 16], {np.True_: 1}, {16: np.True_}, {16: True}, {16.5: 1},
                                    [np.float64(16.5)], {"16": 1}, {16: "3"}, "16", {0: 1}, {np.int64(-3): 1}])
def test_bools_fractions_and_text_are_not_lengths(counts):
    with pytest.raises(ValueError) as e:
        Lengths.of(counts)
    assert "prompt length" in str(e.value) and "\n" not in str(e.value)


# -- the command line ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name, text, said", [
    ("inf.json", '{"16": Infinity, "32": 1}', "finite counts of 0 or more; got 16: inf in "),
    ("sup.txt", "16\n\u00b2\n", "sup.txt:2: expected one prompt length"),
    ("huge.json", '{"99999999999999999999": 1}', "prompt length 99999999999999999999 in "),
    ("big.txt", "99999999999\n", "big.txt:1: prompt length 99999999999 is beyond any model's positions"),
])
def test_the_command_line_answers_a_bad_length_file_with_one_line_and_exit_2(tmp_path, capsys, name, text, said):
    p = _read(tmp_path, name, text)
    assert cli.main(["compare", "tiny-llama", "--mode", "generate", "--prompt-lens-from", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: ") and said in err[0], err


def test_the_command_line_answers_a_prompt_length_past_any_model_with_one_line_and_exit_2(capsys):
    assert cli.main(["compare", "tiny-llama", "--mode", "generate", "--num-layers", "1", "--new-tokens", "2",
                     "--prompt-len", "99999999999"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: --prompt-len 99999999999 is beyond any model's positions (at most {MAX_LENGTH} tokens)"]


# -- compare_sweep's checks, before anything is measured ----------------------------------------------

@pytest.fixture
def nothing_measured(monkeypatch):
    def measured(*a, **kw):
        raise AssertionError("measured before the sweep's input was checked")
    monkeypatch.setattr(comparison, "compare", measured)


@pytest.mark.parametrize("requests", [0, -1, 2.5, True, "10", None])
def test_a_sweep_checks_its_run_of_requests_before_measuring(nothing_measured, requests):
    with pytest.raises(options.OptionError, match=r"requests must be a whole number from 1 to 1000000000000, got "):
        compare_sweep(tiny("llama"), [(1, 8), (1, 16)], mode="generate", new_tokens=2,
                      lengths=Lengths.of({8: 1, 16: 1}), requests=requests, backends=["math"])


def test_a_sweep_takes_numpys_integers_as_its_run_of_requests(nothing_measured):
    with pytest.raises(AssertionError, match="measured before"):  # (checked, then measured)
        compare_sweep(tiny("llama"), [(1, 8)], mode="generate", new_tokens=2, lengths=Lengths.of({8: 1}),
                      requests=np.int64(10), backends=["math"])


@pytest.mark.parametrize("mode", ["prefill", "train"])
def test_a_length_mix_is_refused_for_a_sweep_that_is_not_a_generates(nothing_measured, mode):
    with pytest.raises(ValueError, match=f"lengths is a generate sweep's mix of prompt lengths; a {mode} sweep "
                                         "has none"):
        compare_sweep(tiny("llama"), [(1, 8), (1, 16)], mode=mode, lengths=Lengths.of({8: 1, 16: 1}),
                      backends=["math"])


def test_a_length_mix_is_a_lengths(nothing_measured):
    with pytest.raises(TypeError, match="lengths must be a Lengths"):
        compare_sweep(tiny("llama"), [(1, 8)], mode="generate", new_tokens=2, lengths={8: 1}, backends=["math"])


def test_every_length_of_the_mix_is_checked_against_the_models_positions_not_only_those_measured(
        nothing_measured, tmp_path):
    gpt2 = tiny("gpt2")  # 64 positions
    p = _read(tmp_path, "lens.txt", "8\n" * 50 + "9\n" * 50 + "10\n" * 50 + "11\n" * 50 + "12\n" * 50 + "13\n" * 50
              + "500\n")
    lengths = read_lengths(p)
    assert 500 not in lengths.representative()  # (not measured: priced at a measured length's figures)
    with pytest.raises(options.OptionError) as e:
        compare_sweep(gpt2, [(1, n) for n in lengths.representative()], mode="generate", new_tokens=2,
                      lengths=lengths, backends=["math"])
    assert str(e.value) == (f"a prompt of 500 tokens plus 2 new ones (502) is beyond the 64 positions of the model's "
                            f"position table (the longest prompt length of {p})")


def test_the_command_line_checks_every_length_of_the_mix_against_the_model_before_measuring(tmp_path, capsys):
    p = _read(tmp_path, "lens.txt", "".join(f"{n}\n" * 50 for n in range(10, 16)) + "5000\n")
    assert cli.main(["compare", "gpt2", "--mode", "generate", "--num-layers", "1", "--new-tokens", "4",
                     "--prompt-lens-from", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"error: a prompt of 5000 tokens plus 4 new ones (5004) is beyond the 1024 positions of the "
                   f"model's position table (the longest prompt length of {p})"]


def test_a_mix_of_one_length_beyond_the_positions_is_said_of_the_prompts_spread_around_it(tmp_path, capsys):
    # one length is measured by prompts spread around it: the error named 5004 tokens for a file that says 5000
    p = _read(tmp_path, "lens.txt", "5000\n")
    assert cli.main(["compare", "gpt2", "--mode", "generate", "--num-layers", "1", "--new-tokens", "2",
                     "--prompt-lens-from", str(p)]) == 2
    err = capsys.readouterr().err
    assert "a prompt of 5004 tokens (the longest of those spread around 5000) plus 2 new ones (5006)" in err, err


@pytest.mark.parametrize("counts", [[[512, 120]], None, 512])
def test_lengths_that_are_no_mapping_nor_sequence_of_lengths_are_one_line(counts):
    with pytest.raises(ValueError, match=r"prompt lengths are \{length: count\} or a sequence of lengths, not "):
        Lengths.of(counts)
