"""labkit.instructor.grader.class_report and item_analysis: a class planted from the bug zoo (a known number of
learners per mistake, known prediction answers) gives back exactly those numbers, in the page and the CSV; and
``labkit report`` rebuilds both from the JSON reports alone."""

import base64
import dataclasses
import csv
import io
import json
import re

import pytest

from labkit.exercises import get
from labkit.instructor.cli import main
from labkit.instructor.grader.class_report import read_reports, rebuild, report_html, write_class_report
from labkit.instructor.grader.item_analysis import analyse
from labkit.instructor.grader.reports import NO_KNOWN_MISTAKE, Finding
from synthetic_class import RIGHT, STUB, planted_class

SOFTMAX, SAMPLE = "00.softmax_temperature", "00.sample_token"
# (softmax, sample_token, tokenizer prediction) per learner group, and how many learners in it
PLANTED = [((0, RIGHT, "a"), 3),   # softmax mistake 1 (divides by T = 0)
           ((4, RIGHT, "b"), 2),   # mistake 5 (multiplies by T)
           ((6, 2, "b"), 1),       # mistake 7 (unnormalized); sample_token mistake 3 (argmax)
           ((RIGHT, 2, "c"), 2),
           ((RIGHT, 0, "b"), 1),   # sample_token mistake 1
           ((RIGHT, RIGHT, "b"), 2),
           ((STUB, STUB, STUB), 1)]
KV_GIB = [3.5, 4.375, 4.375, 8.75, 2.0]  # lab 05's numeric prediction: five more learners


def _zeros(logits, temperature):
    import torch

    return torch.zeros_like(logits)


@pytest.fixture(scope="module")
def planted():
    learners, number = {}, 0
    for (softmax, sample, tokenizer), count in PLANTED:
        for _ in range(count):
            number += 1
            learners[f"learner é {number:02d}"] = {SOFTMAX: softmax, SAMPLE: sample, "00.predict_tokenizer": tokenizer}
    learners["nobody's mistake"] = {SOFTMAX: _zeros, SAMPLE: RIGHT, "00.predict_tokenizer": "d"}
    for index, answer in enumerate(KV_GIB):
        learners[f"kv {index}"] = {"05.predict_qwen3_kv_gib": answer}
    reports = planted_class(learners)
    flagged = dataclasses.replace(reports[0], review=(Finding(4, 2, "sys.setprofile (hooks)"),))
    return [flagged, *reports[1:]]


def test_the_mistake_counts_are_the_numbers_planted(planted):
    analysis = analyse(planted)
    by_id = {summary.id: summary for summary in analysis.exercises}
    softmax, sample = get(SOFTMAX), get(SAMPLE)
    assert [(m.number, m.learners) for m in by_id[SOFTMAX].mistakes] == [(1, 3), (5, 2), (None, 1), (7, 1)]
    assert by_id[SOFTMAX].mistakes[0].hint == softmax.mistakes[0].hint
    assert by_id[SOFTMAX].mistakes[2].hint == NO_KNOWN_MISTAKE
    assert [(m.number, m.learners) for m in by_id[SAMPLE].mistakes] == [(3, 3), (1, 1)]
    assert by_id[SAMPLE].mistakes[0].hint == sample.mistakes[2].hint
    assert (by_id[SOFTMAX].passed, by_id[SOFTMAX].failed, by_id[SOFTMAX].not_attempted) == (5, 7, 1)
    assert (by_id[SAMPLE].passed, by_id[SAMPLE].failed, by_id[SAMPLE].not_attempted) == (8, 4, 1)
    assert sum(case.learners for case in by_id[SOFTMAX].first_failed) == 7


def test_the_prediction_counts_are_the_answers_planted(planted):
    predictions = {summary.id: summary for summary in analyse(planted).predictions}
    tokenizer = predictions["00.predict_tokenizer"]
    assert tokenizer.answers == (("a", 3), ("b", 6), ("c", 2), ("d", 1)) and tokenizer.truth == "b"
    assert (tokenizer.close, tokenizer.not_answered) == (6, 1)
    kv = predictions["05.predict_qwen3_kv_gib"]
    assert kv.answers == ((2.0, 1), (3.5, 1), (4.375, 2), (8.75, 1)) and kv.truth == 4.375 and kv.close == 2


def test_the_page_states_the_counts_with_hints_alt_texts_and_flags(planted):
    page = report_html(planted)
    assert "learner é 01" in page and "sys.setprofile (hooks)" in page  # the flagged review, escaped text
    hint = get(SOFTMAX).mistakes[0].hint
    row = re.search(r"<tr><td class=n>(\d+)</td><td><span class=bar[^>]*></span></td><td>1</td><td>([^<]*)</td>",
                    page)
    assert row.group(1) == "3" and row.group(2) == hint.replace("'", "&#x27;")
    images = re.findall(r'<img src="data:image/png;base64,([^"]+)" alt="([^"]+)">', page)
    assert len(images) == 3  # the class picture and one per prediction
    assert all(base64.b64decode(data)[:8] == b"\x89PNG\r\n\x1a\n" for data, _ in images)
    assert "&#x27;b&#x27;: 6" in images[1][1] and "labkit&#x27;s answer &#x27;b&#x27;" in images[1][1]
    assert "<script" not in page and "http" not in page  # self-contained


def test_the_csv_has_a_row_per_exercise_and_mistake(planted, tmp_path):
    _, sheet = write_class_report(planted, tmp_path)
    rows = list(csv.DictReader(io.StringIO(sheet.read_text(encoding="utf-8"))))
    softmax = [(row["mistake number"], row["learners"]) for row in rows if row["exercise"] == SOFTMAX]
    assert softmax == [("1", "3"), ("5", "2"), ("", "1"), ("7", "1")]
    tokenizer = [(row["mistake"], row["learners"]) for row in rows if row["exercise"] == "00.predict_tokenizer"]
    assert tokenizer == [("answered 'a'", "3"), ("answered 'b'", "6"), ("answered 'c'", "2"), ("answered 'd'", "1")]


def test_labkit_report_rebuilds_the_same_page_from_the_json_reports_alone(planted, tmp_path, capsys):
    (tmp_path / "reports").mkdir()
    for number, report in enumerate(planted):
        (tmp_path / "reports" / f"{number:03d}.json").write_text(json.dumps(report.to_json()), encoding="utf-8")
    assert read_reports(tmp_path) == planted
    assert main(["report", str(tmp_path)]) == 0
    assert "class_report.html" in capsys.readouterr().out
    again = (tmp_path / "class_report.csv").read_text(encoding="utf-8")
    write_class_report(planted, tmp_path / "direct")
    assert again == (tmp_path / "direct" / "class_report.csv").read_text(encoding="utf-8")
    with pytest.raises(SystemExit):
        main(["report", str(tmp_path / "nothing")])
    assert "holds no reports/*.json" in capsys.readouterr().err
