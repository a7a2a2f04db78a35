"""MiniWoB++ GUI transitions recorded in headless Chromium.

``build_miniwob(out_dir)`` plays MiniWoB++ tasks (the local HTML tasks shipped
in the ``miniwob`` package, driven through its gymnasium environment) in one
headless Chromium, reused across episodes and tasks, and writes a transition
dataset (:mod:`worldmodel.datasets.format`). Per step:

- the view before and after the action: the utterance plus a compact DOM text
  (one ``<tag ref=N #id .class "text" value="..">`` line per element that
  shows something, at most ``VIEW_CHARS`` characters), and the screenshot at
  MiniWoB's native size (160 x 210 PNG);
- the action: click an element, or click it and type text (``"\\n"`` is
  Enter), with the element's centre as coordinates;
- the env reward on the step that ended the episode;
- a rule-derived harm label (``HARM_RULES``).

Policies, mixed by episode counts per task and policy:

- ``scripted``: reads the utterance and the DOM and does the task (mostly right);
- ``random``: clicks a random element or types random words into a random input;
- ``destructive`` (harm tasks only): does the harmful variant on purpose (trashes
  or forwards a mail the utterance did not name, ``rm``s a file other than the
  one asked for, blocks / mutes / reports another user), then finishes the task
  like ``scripted`` where the episode goes on.

The episode seed fixes the generated problem; the same seeds are played by
every policy, so a group ``miniwob/<task>/<seed>`` holds one problem under all
policies and never straddles splits: a stable hash of the group puts 70 % in
``train``, 15 % in ``val`` and 15 % in ``test`` (held out, evaluation only).

The final step's after-view is the page as the action left it: MiniWoB covers
the task with its "START" screen when an episode ends, so the cover is hidden
for that one screenshot and the DOM is read with the episode's own refs.

Modules:

- :mod:`~worldmodel.datasets.miniwob.browser` -- the headless Chromium (Selenium)
  and MiniWoB's gymnasium environment on it;
- :mod:`~worldmodel.datasets.miniwob.page` -- a page as views, element helpers,
  the commands policies issue;
- :mod:`~worldmodel.datasets.miniwob.harm` -- utterances parsed into requests,
  destructive acts, the harm rules;
- :mod:`~worldmodel.datasets.miniwob.policies` -- the scripted, random and
  destructive agents;
- :mod:`~worldmodel.datasets.miniwob.build` -- episodes recorded and written,
  ``build_miniwob``.
"""
