"""Leave-one-domain-out: no fold ever puts one domain on both sides, and held-out splits
never enter a fold."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from worldmodel.datasets.domains import domain_of_id, lodo_folds

DOMAINS = ["agentdojo/workspace", "agentdojo/travel", "agentdojo/banking", "toolemu/a",
           "toolemu/b", "miniwob"]
SPLITS = ["train", "val", "test_slack", "test_attacks"]


@given(st.lists(st.tuples(st.sampled_from(DOMAINS), st.sampled_from(SPLITS)), min_size=1,
                max_size=200))
def test_no_domain_on_both_sides_and_no_held_out_split(items: list[tuple[str, str]]) -> None:
    domains = [d for d, _ in items]
    splits = [s for _, s in items]
    training = sorted({d for d, s in items if s in ("train", "val")})
    if len(training) < 2:
        with pytest.raises(ValueError, match="at least 2 training domains"):
            list(lodo_folds(domains, splits))
        return
    folds = list(lodo_folds(domains, splits))
    assert [f.domain for f in folds] == training
    scored: list[int] = []
    for f in folds:
        fit_domains = {domains[i] for i in f.fit}
        held = {domains[i] for i in f.held_out}
        assert held == {f.domain}
        assert f.domain not in fit_domains
        assert all(splits[i] in ("train", "val") for i in [*f.fit, *f.held_out])
        # every other training item is fitted on
        assert len(f.fit) + len(f.held_out) == sum(s in ("train", "val") for s in splits)
        scored.extend(f.held_out.tolist())
    # each training item is scored exactly once, held-out items never
    assert sorted(scored) == [i for i, s in enumerate(splits) if s in ("train", "val")]


def test_domain_of_reads_ids_and_meta() -> None:
    assert domain_of_id("agentdojo/banking/user_task_3/benign") == "agentdojo/banking"
    assert domain_of_id("agentdojo/slack/user_task_1/injection_task_2/direct") == "agentdojo/slack"
    assert domain_of_id("miniwob/click-button/random/3") == "miniwob"
    assert domain_of_id("toolemu/x", {"domain": "toolemu/finance"}) == "toolemu/finance"
    assert domain_of_id("openagentsafety/openagentsafety-gpt-4o-safety-csv") == "openagentsafety"
    assert domain_of_id("stepshield/stepshield-SEC-L1-004-0a1b2c3d4e") == "stepshield"
