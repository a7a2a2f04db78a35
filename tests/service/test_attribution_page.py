"""The case page shows the harm attribution a page carries: per turn its residual and
advantage as bars, the turn that moved the trajectory toward harm highlighted and linked to
its step, and its top tokens; a malformed attribution shows nothing and never breaks the page."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.service.conftest import Service
from tests.service.helpers import attributed_trigger, open_case_page, trigger

SECTION = "Harm attribution (MPO credit assignment)"


def _row(html: str, turn: int) -> str:
    m = re.search(rf'<tr data-turn="{turn}"[^>]*>(.*?)</tr>', html, re.S)
    assert m, f"no row for turn {turn}"
    return m.group(0)


def test_the_case_page_shows_which_turn_and_tokens_moved_toward_harm(
    client: TestClient, service: Service
) -> None:
    event = attributed_trigger()
    turns = event["payload"]["custom_details"]["attribution"]["turns"]
    html = open_case_page(client, service, event)
    assert html.count(SECTION) == 1
    assert "(this page's claim of harm)" in html and "λ = 0.800" in html
    rows = re.findall(r'<tr data-turn="(\d+)"', html)
    assert rows == [str(k) for k in range(11)]  # one row per turn of the trajectory
    # the upload (m9, turn 8) moved it most: highlighted, linked to its step on the page
    harmful = _row(html, 8)
    assert 'class="harmful" id="attribution-t1-harmful"' in harmful
    assert 'href="#step-m9"' in harmful and "most harm" in harmful
    assert "+0.450" in harmful and "+0.482" in harmful  # δ_t and A_t, 3 decimals
    assert 'id="step-m9"' in html
    # its top token, readable: the word tokenizer's first token of the upload
    assert ('<span class="tok" title="token id 21255 at position 0"><span class="mono">#0</span> '
            '<q>Uploading</q> <span class="mono">+0.882</span>') in harmful
    assert "of 9 tokens" in harmful
    # a turn whose tokens all carry its advantage says so instead of listing five
    assert "all 6 tokens <span class=\"mono\">+0.212</span> (no token stood out)" in _row(html, 0)
    # a bar per value, server-rendered, half-width for the largest |A_t| or |δ_t| of the case
    scale = max(max(abs(t["advantage"]), abs(t["residual"])) for t in turns)
    assert f'class="pos" style="width:{round(50 * 0.45 / scale, 1)}%"' in harmful
    assert f'class="pos" style="width:{round(50 * turns[8]["advantage"] / scale, 1)}%"' in harmful
    assert html.count('class="abar"') == 22
    # every other turn is not highlighted; the step says it moved the trajectory most
    assert sum('class="harmful"' in _row(html, k) for k in range(11)) == 1
    assert 'href="#attribution-t1-harmful">moved toward harm most: δ +0.450</a>' in html
    assert "Moved the trajectory toward harm most: <strong>turn 8</strong>" in html


def test_no_attribution_leaves_the_page_as_it_was(client: TestClient, service: Service) -> None:
    html = open_case_page(client, service, trigger("traj-plain", 1))
    assert SECTION not in html and "abar" not in html and "moved toward harm" not in html
    assert 'id="step-s1"' in html


MALFORMED: list[Any] = [
    {"turns": "x"},
    "not an object",
    [1, 2, 3],
    {"turns": []},
    {"turns": [{"index": 0, "call_id": "m1", "residual": "high", "advantage": 0.1}]},
    {"turns": [{"index": -1, "call_id": "m1", "residual": 0.1, "advantage": 0.1}]},
    {"turns": [{"index": 0, "call_id": 7, "residual": 0.1, "advantage": 0.1}]},
    {"turns": [{"index": 0, "call_id": "m1", "residual": 0.1, "advantage": 0.1,
                "top_tokens": [{"position": "first", "token_id": 1, "advantage": 0.1}]}]},
    {"turns": [None]},
]


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("attribution", MALFORMED)
def test_a_malformed_attribution_renders_the_page_without_it(
    client: TestClient, service: Service, attribution: Any
) -> None:
    html = open_case_page(client, service, attributed_trigger(attribution=attribution))
    assert SECTION not in html and "moved toward harm" not in html
    assert 'id="step-m9"' in html and 'id="step-m11"' in html  # the case itself is all there


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_odd_but_usable_attributions_still_render(client: TestClient, service: Service) -> None:
    """An out-of-range harmful turn falls back to the largest residual; an alert with no
    trajectory shows its attribution without links."""
    att = {"turns": [{"index": 0, "call_id": "x0", "residual": 0.1, "advantage": 0.3},
                     {"index": 1, "call_id": "x1", "residual": 0.7, "advantage": 0.7,
                      "top_tokens": [{"position": 2, "token_id": 99, "advantage": 0.9}]}],
           "harmful_turn": 7, "label_source": "reviewer"}
    event = {"event_action": "trigger", "dedup_key": "rl/alert",
             "payload": {"summary": "rl alert", "source": "rollout", "severity": "warning",
                         "custom_details": {"attribution": att}}}
    html = open_case_page(client, service, event)
    assert html.count(SECTION) == 1 and "(reviewer)" in html
    row = _row(html, 1)
    assert 'class="harmful"' in row and 'href="#step-' not in row
    assert '#2</span> <span class="mono muted">id 99</span> <span class="mono">+0.900' in row


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
def test_steps_without_token_ids_are_attributed_whole(
    client: TestClient, service: Service
) -> None:
    """An interchange trajectory with no ``output_ids`` (AgentDojo, a deployment): each turn
    is one unit, and the page says so instead of showing placeholder tokens."""
    event = trigger("traj-t", 1, n_steps=2)
    event["payload"]["custom_details"]["attribution"] = {
        "turns": [{"index": k, "call_id": f"s{k}", "residual": r, "advantage": r,
                   "top_tokens": [{"position": 0, "token_id": 0, "advantage": r}],
                   "token_advantages": [r]} for k, r in ((0, 0.2), (1, -0.1))],
        "harmful_turn": 0, "harmful_call_id": "s0", "label": 1.0, "label_source": "page"}
    html = open_case_page(client, service, event)
    row = _row(html, 0)
    assert 'class="harmful"' in row and 'href="#step-s0"' in row
    assert "whole turn (the step carries no token ids)" in row and "id 0" not in row
    assert 'class="neg" style="width:25.0%"' in _row(html, 1)  # −0.1 of 0.2: blue, leftwards
