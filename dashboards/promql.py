"""PromQL for recall with Wilson intervals, over any window, from ``vigil_labelled_steps_total``.

Recall at tier k over a window is the share of harmful labelled steps screened in
the window that reached tier k::

    increase(vigil_labelled_steps_total{label="1", tier="k"}[w])
      / increase(vigil_labelled_steps_total{label="1", tier="0"}[w])

and its 95 % Wilson score interval is written out in PromQL (``wilson``), so a
dashboard shows the interval for whatever window it is looking at. The same
formula in Python is :func:`vigil.metrics.wilson_interval`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

Z = 1.96  # 95 % two-sided


def _matchers(**labels: str) -> str:
    """``{a="x", b=~"y"}``: a value starting with ``~`` is a regex match."""
    parts = []
    for k, v in labels.items():
        parts.append(f'{k}=~"{v[1:]}"' if v.startswith("~") else f'{k}="{v}"')
    return "{" + ", ".join(parts) + "}"


def labelled(tier: int, window: str, *, by: Sequence[str] = (), label: str = "1",
             **match: str) -> str:
    """Labelled steps (of ``label``) that reached ``tier`` in ``window``, summed ``by``."""
    sel = _matchers(label=label, tier=str(tier), **match)
    agg = f"sum by ({', '.join(by)})" if by else "sum"
    return f"{agg} (increase(vigil_labelled_steps_total{sel}[{window}]))"


def recall(tier: int, window: str, *, by: Sequence[str] = (), **match: str) -> str:
    """Recall at ``tier`` over ``window`` (harmful steps that reached it / harmful screened)."""
    return f"{labelled(tier, window, by=by, **match)} / {labelled(0, window, by=by, **match)}"


def false_positive_rate(tier: int, window: str, *, by: Sequence[str] = (),
                        **match: str) -> str:
    """Share of benign labelled steps that reached ``tier`` (the budget actually spent)."""
    return (f"{labelled(tier, window, by=by, label='0', **match)} / "
            f"{labelled(0, window, by=by, label='0', **match)}")


def wilson(caught: str, total: str, bound: str, z: float = Z) -> str:
    """The lower or upper (``bound``) end of the Wilson interval of ``caught / total``."""
    if bound not in ("lower", "upper"):
        raise ValueError(f"bound must be 'lower' or 'upper', got {bound!r}")
    c, n = f"({caught})", f"({total})"
    p = f"({c} / {n})"
    z2 = z * z
    sign = "-" if bound == "lower" else "+"
    expr = (
        f"({p} + {z2 / 2:.6g} / {n} {sign} {z:.6g} * "
        f"sqrt({p} * (1 - {p}) / {n} + {z2 / 4:.6g} / ({n} * {n}))) / (1 + {z2:.6g} / {n})"
    )
    # At p = 0 (lower) or p = 1 (upper) the bound is p itself, as in
    # vigil.metrics.wilson_interval; the formula can miss it by a rounding hair there.
    if bound == "lower":
        return f"clamp_min(({p} <= 0) or ({expr}), 0)"
    return f"clamp_max(({p} >= 1) or ({expr}), 1)"


def recall_interval(tier: int, window: str, bound: str, *, by: Sequence[str] = (),
                    **match: str) -> str:
    """The Wilson ``bound`` of :func:`recall`."""
    return wilson(labelled(tier, window, by=by, **match), labelled(0, window, by=by, **match),
                  bound)


def _page_verdicts(window: str, verdict: str | None = None) -> str:
    """Verdicts on pages in ``window``. ``max``, not ``sum``: every instance of the paging
    service reads the same database and reports the same counts."""
    sel = f'{{verdict="{verdict}"}}' if verdict else ""
    return f"max(increase(vigil_page_verdicts_total{sel}[{window}]))" if verdict else (
        f"max(sum by (instance) (increase(vigil_page_verdicts_total[{window}])))")


def page_precision(window: str) -> str:
    """Share of human verdicts on pages that said harmful, over ``window``."""
    return f"{_page_verdicts(window, 'harmful')} / {_page_verdicts(window)}"


def page_precision_interval(window: str, bound: str) -> str:
    return wilson(_page_verdicts(window, "harmful"), _page_verdicts(window), bound)


def per_tier(expr_of: Callable[[int], str], tiers: Sequence[int] = (1, 2, 3)) -> str:
    """``expr_of(k)`` for every tier ``k`` as one vector, each series labelled ``tier="k"``.

    For a table with a row per tier: ``per_tier(lambda k: recall(k, "1h", by=["origin"]))``.
    """
    return " or ".join(f'label_replace({expr_of(k)}, "tier", "{k}", "", "")' for k in tiers)


def reached(tier: int, window: str, *, by: Sequence[str] = (), label: str = "1",
            **match: str) -> str:
    """:func:`labelled`, but 0 (rather than no series) for a group that screened steps of
    ``label`` in ``window`` and had none reach ``tier``."""
    return (f"({labelled(tier, window, by=by, label=label, **match)} or "
            f"{labelled(0, window, by=by, label=label, **match)} * 0)")


def reached_share(tier: int, window: str, *, label: str = "1", bound: str | None = None,
                  by: Sequence[str] = (), **match: str) -> str:
    """Recall (``label="1"``) or the false-positive rate (``label="0"``) at ``tier``, or its
    Wilson ``bound``: :func:`recall` and :func:`false_positive_rate` with a tier nothing
    reached reading 0 (a dashboard shows 0 %, not "no data"); no series only where no step
    of ``label`` was screened."""
    caught = reached(tier, window, by=by, label=label, **match)
    total = labelled(0, window, by=by, label=label, **match)
    return f"{caught} / {total}" if bound is None else wilson(caught, total, bound)
