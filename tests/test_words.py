"""The words reports share: a count with its noun in the right number, reasons joined as clauses."""

from reports_fixed import fixed, report_of

from attnswitch.results import BackendResult
from attnswitch.words import clauses, counted


def test_a_count_of_one_takes_the_singular():
    assert [counted(n, "new token") for n in (0, 1, 2)] == ["0 new tokens", "1 new token", "2 new tokens"]


def test_reasons_read_as_one_sentences_clauses_without_a_period_before_each_semicolon():
    # "Both fused kernels do not support non-zero dropout.; the CPU flash kernel ..." read garbled
    said = clauses(["Both fused kernels do not support non-zero dropout.", "the CPU flash kernel needs X "])
    assert said == "Both fused kernels do not support non-zero dropout; the CPU flash kernel needs X"
    assert clauses(["it stopped...", "then."]) == "it stopped...; then"  # (an ellipsis is no full stop)
    r = report_of([fixed("math", [1.0] * 6),
                   BackendResult("flash", "unavailable", reasons=("No dropout here.", "nor there."))])
    assert "flash unavailable: No dropout here; nor there" in r.to_markdown()
