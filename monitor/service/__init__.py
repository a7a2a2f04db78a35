"""The L3 paging service: events in, escalation to on-call reviewers, verdicts out.

``create_app(settings)`` (in :mod:`monitor.service.app`) builds everything; nothing
is built at import.
"""
