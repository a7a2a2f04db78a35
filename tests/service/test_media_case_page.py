"""The case page of a generated image (an ART endpoint paged by the worker): its thumbnail,
its prompt and the score of every reward model; only inline PNG, JPEG, WebP and GIF images
are ever shown as images, and whatever else a producer sends is shown as text."""

from __future__ import annotations

import re
from typing import Any

import pytest
from fastapi.testclient import TestClient
from markupsafe import escape

from tests.service.conftest import Service
from tests.service.helpers import (
    ART_COLOURS,
    ART_PROMPT,
    ART_REWARDS,
    art_trigger,
    open_case_page,
    png_data_uri,
)


def _section(html: str, step_id: str) -> str:
    m = re.search(rf'<section class="step[^"]*" id="step-{step_id}".*?</section>', html, re.S)
    assert m, f"no section for step {step_id}"
    return m.group(0)


def test_an_image_endpoints_page_shows_its_thumbnail_prompt_and_rewards(
    client: TestClient, service: Service
) -> None:
    html = open_case_page(client, service, art_trigger())
    flagged = _section(html, "v3-e2")
    assert 'class="step flagged"' in flagged
    thumbs = re.findall(r'<img src="([^"]+)" alt="generated image of step 3074" '
                        r'class="thumbnail">', flagged)
    assert thumbs == [png_data_uri(32, 32, ART_COLOURS[2])]  # the endpoint's own thumbnail
    assert 'class="screenshot"' not in flagged  # shown once, with its rewards
    # the prompt, as text: its markup is escaped, never rendered
    assert f'<pre class="prompt">{escape(ART_PROMPT)}</pre>' in flagged
    assert "<b>sign</b>" not in html
    rows = re.findall(r'<tr data-reward-model="(\w+)"><td>\w+</td><td class="mono">([\d.]+)<',
                      flagged)
    assert rows == [(h, f"{v:.3f}") for h, v in sorted(ART_REWARDS[2].items())]
    weighted = 0.5 * 0.934 + 0.2 * 0.018 + 0.3 * 0.777
    assert f"R, the trainer's scalar</td><td class=\"mono\">{weighted:.3f}<" in flagged
    for fact in ("<dt>Policy version</dt><dd class=\"mono\">3</dd>",
                 "<dt>Prompt id</dt><dd class=\"mono\">p042</dd>",
                 "<dt>Endpoint</dt><dd class=\"mono\">3 of 3</dd>",
                 "<dt>Seed</dt><dd class=\"mono\">3074</dd>",
                 "<dt>Full image</dt><dd class=\"mono\">s3://art/run-7/v3/p042/2.png</dd>"):
        assert fact in flagged, fact
    # the endpoints before it are on the page too, each with its own image and rewards
    for i in (0, 1):
        earlier = _section(html, f"v3-e{i}")
        assert f'<img src="{png_data_uri(32, 32, ART_COLOURS[i])}"' in earlier
        assert f'data-reward-model="clipscore"><td>clipscore</td><td class="mono">' \
               f'{ART_REWARDS[i]["clipscore"]:.3f}' in earlier


HOSTILE = [
    "data:image/svg+xml;base64,PHN2ZyBvbmxvYWQ9YWxlcnQoMSk+",
    "javascript:alert(1)",
    'data:image/png;base64,iVBORw0KGgo=" onerror="alert(1)',
    "https://tracker.example/pixel.png",
]


def _art_event_with(screenshot: Any = None, media: Any = None) -> dict[str, Any]:
    """The ART page with the flagged step's thumbnail (or ``media``) replaced, as a producer
    other than the worker could send it."""
    event = art_trigger()
    step = event["payload"]["custom_details"]["trajectory"]["steps"][-1]
    if screenshot is not None:
        step["result"]["screenshot"] = screenshot
    if media is not None:
        step["media"] = media
    return event


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("shot", HOSTILE)
def test_a_thumbnail_that_is_not_an_inline_image_is_shown_as_text(
    client: TestClient, service: Service, shot: str
) -> None:
    html = open_case_page(client, service, _art_event_with(screenshot=shot))
    flagged = _section(html, "v3-e2")
    assert "<img" not in flagged and 'onerror="' not in html
    assert "thumbnail (not an inline image):" in flagged
    assert str(escape(shot))[:60] in flagged
    assert "ocr</td>" in flagged  # the prompt and rewards are still shown


@pytest.mark.parametrize("database_url", ["sqlite"], indirect=True)
@pytest.mark.parametrize("media", ["not a dict", {"rewards": {"ocr": "high"}},
                                   {"rewards": [1, 2]}, {"endpoint": -1}])
def test_malformed_media_shows_the_step_as_any_other(
    client: TestClient, service: Service, media: Any
) -> None:
    html = open_case_page(client, service, _art_event_with(media=media))
    flagged = _section(html, "v3-e2")
    assert 'class="media"' not in flagged and "Rewards</div>" not in flagged
    # the generic step view, with the thumbnail as the result's screenshot
    assert f'<img src="{png_data_uri(32, 32, ART_COLOURS[2])}" alt="screenshot after step' \
           in flagged
    assert 'class="media"' in _section(html, "v3-e1")  # the well-formed ones still show
