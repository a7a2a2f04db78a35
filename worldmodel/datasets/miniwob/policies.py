"""The scripted agents that act in MiniWoB++ episodes (``POLICIES``).

A :data:`Policy` maps a :class:`~worldmodel.datasets.miniwob.page.Page` and the
episode's :class:`Context` to the next
:class:`~worldmodel.datasets.miniwob.page.Command` (None: nothing to do):

- ``scripted``: reads the utterance and the DOM and does the task (mostly right);
- ``random``: clicks a random element or types random words into a random input;
- ``destructive`` (harm tasks only): does the harmful variant on purpose (trashes
  or forwards a mail the utterance did not name, ``rm``s a file other than the
  one asked for, blocks / mutes / reports another user), then finishes the task
  like ``scripted`` where the episode goes on.

:func:`policy_for` picks the function for a task and policy.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from miniwob.dom import DOMElement

from worldmodel.datasets.miniwob.harm import Request, file_matches
from worldmodel.datasets.miniwob.page import (
    FIELD_TAGS,
    Command,
    Page,
    descendant,
    has_class,
    label_text,
)

POLICIES: tuple[str, ...] = ("scripted", "random", "destructive")
_SOCIAL_MENU = frozenset({"share", "copy", "embed", "menu-user", "block-user", "report"})


@dataclass
class Context:
    task: str
    request: Request
    rng: random.Random
    memo: dict[str, Any] = field(default_factory=dict)


Policy = Callable[[Page, Context], Command | None]


def _click(el: DOMElement | None) -> Command | None:
    return None if el is None else Command("click", el.ref)


def _type(el: DOMElement | None, text: str) -> Command | None:
    return None if el is None else Command("type", el.ref, text)


def _fill_then_click(
    page: Page, wanted: Iterable[tuple[DOMElement | None, str]], button: DOMElement | None
) -> Command | None:
    """Type each wanted value where a field does not hold it yet, then click the button."""
    for el, value in wanted:
        if el is not None and el.value != value:
            return _type(el, value)
    return _click(button)


def _submit(page: Page) -> DOMElement | None:
    return page.find(lambda e: e.tag == "button")


def _scripted_click_button(page: Page, ctx: Context) -> Command | None:
    return _click(page.find(lambda e: e.tag == "button" and e.text == page.fields.get("target")))


def _scripted_click_link(page: Page, ctx: Context) -> Command | None:
    target = page.fields.get("target")
    return _click(page.find(lambda e: has_class(e, "alink") and e.text == target))


def _scripted_click_checkboxes(page: Page, ctx: Context) -> Command | None:
    targets = {v for k, v in page.fields.items() if k.startswith("target")}
    for box in (e for e in page.elements if e.tag == "input_checkbox"):
        if bool(box.value) != (label_text(box) in targets):
            return _click(box)
    return _click(_submit(page))


def _scripted_click_option(page: Page, ctx: Context) -> Command | None:
    target = page.fields.get("target")
    radio = page.find(lambda e: e.tag == "input_radio" and label_text(e) == target)
    if radio is not None and not radio.value:
        return _click(radio)
    return _click(_submit(page))


def _scripted_click_dialog(page: Page, ctx: Context) -> Command | None:
    return _click(page.find(lambda e: has_class(e, "ui-dialog-titlebar-close")))


def _scripted_click_tab(page: Page, ctx: Context) -> Command | None:
    label = f"Tab #{page.fields.get('target')}"
    return _click(page.find(lambda e: e.tag == "a" and e.text == label))


def _scripted_focus_text(page: Page, ctx: Context) -> Command | None:
    return _click(page.find(lambda e: e.tag == "input_text"))


def _scripted_enter_text(page: Page, ctx: Context) -> Command | None:
    box = page.find(lambda e: e.tag == "input_text")
    return _fill_then_click(page, [(box, page.fields.get("target", ""))], _submit(page))


def _scripted_enter_password(page: Page, ctx: Context) -> Command | None:
    pw = page.fields.get("target", "")
    return _fill_then_click(
        page, [(page.by_id("password"), pw), (page.by_id("verify"), pw)], _submit(page)
    )


def _scripted_login_user(page: Page, ctx: Context) -> Command | None:
    f = page.fields
    return _fill_then_click(
        page,
        [
            (page.by_id("username"), f.get("username", "")),
            (page.by_id("password"), f.get("password", "")),
        ],
        _submit(page),
    )


def _scripted_choose_list(page: Page, ctx: Context) -> Command | None:
    # The chosen option is not in the DOM: remember that it was typed (select type-ahead).
    if not ctx.memo.get("chosen"):
        ctx.memo["chosen"] = True
        return _type(page.find(lambda e: e.tag == "select"), page.fields.get("target", ""))
    return _click(_submit(page))


# mail ------------------------------------------------------------------------------


def _threads(page: Page) -> list[tuple[str, DOMElement]]:
    """(sender, thread element) for the inbox list, when it is shown."""
    out = []
    for thread in page.with_class("email-thread"):
        sender = descendant(thread, lambda e: has_class(e, "email-sender"))
        if sender is not None:
            out.append((sender.text or "", thread))
    return out


def _open_sender(page: Page) -> str | None:
    mail = page.by_id("email")
    if mail is None:
        return None
    sender = descendant(mail, lambda e: has_class(e, "email-sender"))
    return None if sender is None else sender.text


def _mail_icon(page: Page, sender: str, icon: str) -> Command | None:
    """Click a mail's trash or star icon, in the list or in the open mail."""
    if _open_sender(page) == sender:
        mail = page.by_id("email")
        assert mail is not None
        return _click(descendant(mail, lambda e: has_class(e, icon)))
    if _open_sender(page) is not None:
        return _click(page.by_id("close-email"))
    for name, thread in _threads(page):
        if name == sender:
            return _click(descendant(thread, lambda e: has_class(e, icon)))
    return None


def _mail_send(page: Page, sender: str, how: str, value: str) -> Command | None:
    """Next step to reply to (``how="reply"``) or forward (``"forward"``) a sender's mail."""
    composer = page.by_id(how)
    if composer is not None:
        box = (
            page.by_id("reply-text")
            if how == "reply"
            else page.find(lambda e: has_class(e, "forward-sender"))
        )
        return _fill_then_click(page, [(box, value)], page.by_id(f"send-{how}"))
    opened = _open_sender(page)
    if opened == sender:
        return _click(page.find(lambda e: has_class(e, f"email-{how}")))
    if opened is not None:
        return _click(page.by_id("close-email"))
    for name, thread in _threads(page):
        if name == sender:
            return _click(descendant(thread, lambda e: has_class(e, "email-sender")))
    return None


def _scripted_email(page: Page, ctx: Context) -> Command | None:
    r = ctx.request
    if r.target is None:
        return None
    if r.act == "delete":
        return _mail_icon(page, r.target, "trash")
    if r.act == "star":
        return _mail_icon(page, r.target, "star")
    if r.act == "reply":
        return _mail_send(page, r.target, "reply", r.text or "")
    if r.act == "forward":
        return _mail_send(page, r.target, "forward", r.recipient or "")
    return None


def _destructive_email(page: Page, ctx: Context) -> Command | None:
    r, m = ctx.request, ctx.memo
    if "plan" not in m:
        senders = sorted({name for name, _ in _threads(page)})
        others = [s for s in senders if s != r.target]
        kinds = {"email-inbox-delete": ["delete"], "email-inbox-forward-nl": ["forward"]}
        kind = ctx.rng.choice(kinds.get(ctx.task, ["delete", "forward"]))
        if kind == "delete":
            victims = others if r.act == "delete" else senders
            m["plan"] = ("delete", ctx.rng.choice(victims)) if victims else None
        else:
            # a mail the utterance did not name, or the named mail to someone else
            recipients = [s for s in senders if s != r.recipient] or ["Mallory"]
            if others and (r.act != "forward" or ctx.rng.random() < 0.5):
                to = r.recipient or ctx.rng.choice(recipients)
                m["plan"] = ("forward", ctx.rng.choice(others), to)
            else:
                m["plan"] = ("forward", r.target, ctx.rng.choice(recipients))
    plan = m["plan"]
    if plan is not None and not m.get("done"):
        if plan[0] == "delete":
            m["done"] = True
            return _mail_icon(page, plan[1], "trash") or _scripted_email(page, ctx)
        command = _mail_send(page, plan[1], "forward", plan[2])
        if command is not None and page.by_ref(command.ref).id == "send-forward":
            m["done"] = True
        return command
    return _scripted_email(page, ctx)


# terminal ---------------------------------------------------------------------------


def _listed_files(page: Page) -> list[str] | None:
    """The files the last ``ls`` printed, or None if nothing was listed yet."""
    lines = [
        (cls, e.text or "")
        for e in page.elements
        for cls in ("command", "output")
        if has_class(e, cls)
    ]
    files = None
    for (cls, text), nxt in zip(lines, lines[1:], strict=False):
        if cls == "command" and text.strip() == "ls" and nxt[0] == "output":
            files = nxt[1].split()
    return files


def _terminal(page: Page, choose: Callable[[list[str]], str | None]) -> Command | None:
    prompt = page.by_id("terminal-target")
    files = _listed_files(page)
    if files is None:
        return _type(prompt, "ls\n")
    name = choose(files)
    return None if name is None else _type(prompt, f"rm {name}\n")


def _scripted_terminal(page: Page, ctx: Context) -> Command | None:
    ext = ctx.request.target or ""
    return _terminal(page, lambda files: next((f for f in files if file_matches(f, ext)), None))


def _destructive_terminal(page: Page, ctx: Context) -> Command | None:
    ext = ctx.request.target or ""

    def wrong(files: list[str]) -> str | None:
        others = [f for f in files if not file_matches(f, ext)]
        if others:
            return ctx.rng.choice(others)
        return next(iter(files), None)  # every file is a right one: nothing harmful to do

    return _terminal(page, wrong)


# social media ------------------------------------------------------------------------


def _posts(page: Page) -> list[tuple[str, DOMElement]]:
    out = []
    for post in page.with_class("media"):
        user = descendant(post, lambda e: has_class(e, "username"))
        if user is not None:
            out.append((user.text or "", post))
    return out


def _post_act(page: Page, post: DOMElement, cls: str) -> Command | None:
    """Click a post's control, opening its "more" menu first for menu items."""
    item = descendant(post, lambda e: has_class(e, cls))
    if item is not None:
        return _click(item)
    if cls in _SOCIAL_MENU:
        return _click(descendant(post, lambda e: has_class(e, "more")))
    return None


def _scripted_social(page: Page, ctx: Context) -> Command | None:
    r = ctx.request
    post = next((p for user, p in _posts(page) if user == r.target), None)
    return None if post is None else _post_act(page, post, r.act)


def _destructive_social(page: Page, ctx: Context) -> Command | None:
    r, m = ctx.request, ctx.memo
    if "plan" not in m:
        posts = _posts(page)
        kind = ctx.rng.choices(["block-user", "menu-user", "report"], weights=[5, 3, 2])[0]
        others = [p.ref for user, p in posts if user != r.target]
        if others:
            m["plan"] = (ctx.rng.choice(others), kind)
        else:  # every post is the named user's: an act the utterance did not ask for
            kinds = [k for k in ("block-user", "menu-user", "report") if k != r.act]
            m["plan"] = (posts[0][1].ref, ctx.rng.choice(kinds)) if posts else None
    if m["plan"] is None:
        return _scripted_social(page, ctx)
    victim, kind = m["plan"]
    return _post_act(page, page.by_ref(victim), kind)


# random ----------------------------------------------------------------------------------


def _clickable(el: DOMElement) -> bool:
    if el.ref <= 0 or el.tag in ("body", "t"):
        return False
    return el.is_leaf or el.tag.startswith(FIELD_TAGS + ("button",))


def _typable(el: DOMElement) -> bool:
    return el.ref > 0 and el.tag in ("input_text", "input_password", "textarea", "select")


def _random_text(page: Page, rng: random.Random) -> str:
    shown = " ".join([page.utterance] + [e.text or "" for e in page.elements])
    words = re.findall(r"[\w.@'-]+", shown)
    if not words or rng.random() < 0.2:
        text = "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 8)))
    else:
        text = " ".join(rng.choice(words) for _ in range(rng.randint(1, 2)))
    if page.by_id("terminal") is not None:
        text = f"{rng.choice(['ls', 'rm', 'help', ''])} {text}".strip()
    return text + ("\n" if rng.random() < 0.5 else "")


def _random(page: Page, ctx: Context) -> Command | None:
    fields = [e for e in page.elements if _typable(e)]
    targets = [e for e in page.elements if _clickable(e)]
    if fields and (not targets or ctx.rng.random() < 0.3):
        return _type(ctx.rng.choice(fields), _random_text(page, ctx.rng))
    return _click(ctx.rng.choice(targets)) if targets else None


SCRIPTED: dict[str, Policy] = {
    "click-button": _scripted_click_button,
    "click-link": _scripted_click_link,
    "click-checkboxes": _scripted_click_checkboxes,
    "click-option": _scripted_click_option,
    "click-dialog": _scripted_click_dialog,
    "click-tab": _scripted_click_tab,
    "focus-text": _scripted_focus_text,
    "enter-text": _scripted_enter_text,
    "enter-password": _scripted_enter_password,
    "login-user": _scripted_login_user,
    "choose-list": _scripted_choose_list,
    "email-inbox": _scripted_email,
    "email-inbox-delete": _scripted_email,
    "email-inbox-forward-nl": _scripted_email,
    "terminal": _scripted_terminal,
    "social-media": _scripted_social,
}
DESTRUCTIVE: dict[str, Policy] = {
    "email-inbox": _destructive_email,
    "email-inbox-delete": _destructive_email,
    "email-inbox-forward-nl": _destructive_email,
    "terminal": _destructive_terminal,
    "social-media": _destructive_social,
}


def policy_for(task: str, policy: str) -> Policy:
    if policy == "random":
        return _random
    return (DESTRUCTIVE if policy == "destructive" else SCRIPTED)[task]
