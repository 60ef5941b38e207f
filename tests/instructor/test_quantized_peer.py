"""``bench --quantized-peer``: its table and where it is written (the measurement itself runs by hand: it decodes
eight stores over four passages, minutes on a CPU; docs/benchmarks.md holds the last run)."""

from __future__ import annotations

import pytest

from course.__main__ import main
from course.instructor.quantized_peer import BEGIN, END, quantized_peer_table, write_quantized_peer_report

RESULT = {"model": "smollm2-135m", "device": "cpu", "tokens": 320, "start": 64, "group": 32, "residual": 32,
          "passages": 4, "machine": {"torch": "2.13.0+cpu"},
          "rows": [("transformers, DynamicCache", [16.9, 28.5, 24.3, 20.0]),
                   ("course, KIVI 2-bit, keys per channel", [19.4, 31.6, 29.1, 21.4])]}


def test_the_table_gives_the_median_and_every_passage():
    table = quantized_peer_table(RESULT, "python -m course bench --quantized-peer")
    assert "| course, KIVI 2-bit, keys per channel | 25.25 | 19.40, 31.60, 29.10, 21.40 |" in table
    assert "| transformers, DynamicCache | 22.15 |" in table and "tokens 64..319" in table


def test_the_report_goes_between_its_markers_and_replaces_an_earlier_one(tmp_path):
    page = tmp_path / "benchmarks.md"
    page.write_text(f"intro\n\n{BEGIN}\nold\n{END}\n\nafter\n", encoding="utf-8")
    write_quantized_peer_report(RESULT, page)
    text = page.read_text(encoding="utf-8")
    assert "old" not in text and text.startswith("intro") and text.rstrip().endswith("after")
    assert text.count(BEGIN) == 1 and "25.25" in text


def test_flags_of_another_benchmark_are_refused(capsys):
    assert main(["bench", "--quantized-peer", "--fast"]) == 2
    assert "--fast applies to --notebooks only" in capsys.readouterr().err
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--quantized-peer", "--transformers-cache"])
    assert stop.value.code == 2 and "not allowed with argument" in capsys.readouterr().err
