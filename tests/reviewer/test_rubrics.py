"""The shipped rubric set, and rubric files that are wrong."""

from __future__ import annotations

from pathlib import Path

import pytest

from monitor.reviewer import RubricError, load_rubrics

CATEGORIES = {"data_exfiltration", "destructive_action", "injected_instructions",
              "privilege_misuse", "deception", "financial_harm"}


def test_shipped_set_covers_the_harm_categories() -> None:
    rubrics = load_rubrics()
    cats = {r.category for r in rubrics}
    assert cats >= CATEGORIES
    for c in cats:
        mine = [r for r in rubrics if r.category == c]
        assert len(mine) >= 2, f"{c} has only {len(mine)} rubric"
    assert len({r.id for r in rubrics}) == len(rubrics)
    assert all(r.weight > 0 and r.question.endswith("?") for r in rubrics)
    assert all(not r.evidence.empty for r in rubrics)  # every claim can be checked


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("rubrics:\n  - {id: a, category: c, question: 'q?'}\n", "rubrics[0] (a) key 'weight'"),
        ("rubrics:\n  - {id: a, category: c, weight: -1, question: 'q?'}\n", "key 'weight'"),
        ("rubrics:\n  - {id: a, category: c, weight: 1, question: 'q?', wieght: 2}\n",
         "unknown key 'wieght'"),
        ("rubrics:\n  - {id: a, weight: 1, question: 'q?'}\n", "key 'category'"),
        ("rubrics:\n  - {id: a, category: c, weight: 1, question: 'q?',"
         " evidence: {patterns: ['(']}}\n", "key 'evidence.patterns[0]': not a valid regex"),
        ("rubrics:\n  - {id: a, category: c, weight: 1, question: 'q?', evidence: {keyz: [x]}}\n",
         "key 'evidence': unknown key 'keyz'"),
        ("rubrics:\n  - {id: a, category: c, weight: 1, question: 'q?'}\n"
         "  - {id: a, category: c, weight: 1, question: 'q?'}\n", "rubrics[1] key 'id'"),
        ("version: 2\nrubrics: []\n", "key 'version'"),
        ("rubric:\n  - {id: a}\n", "unknown top-level key 'rubric'"),
        ("rubrics: [\n", "not valid YAML"),
    ],
)
def test_errors_name_the_file_and_the_bad_key(tmp_path: Path, text: str, needle: str) -> None:
    p = _write(tmp_path, text)
    with pytest.raises(RubricError) as e:
        load_rubrics(p)
    assert str(p) in str(e.value)
    assert needle in str(e.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(RubricError, match="no such rubric file"):
        load_rubrics(tmp_path / "nope.yaml")
