"""What one request may ask of ``monitor reviewer serve`` (:mod:`monitor.reviewer.serve`).

Kept apart so the command line reads the defaults without importing the server's packages.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ServeLimits:
    """What one request may ask of the served model; each is a ``monitor reviewer serve``
    flag. The defaults keep one request under about a minute on two cores (an 8k-token
    prompt took 120 s)."""

    max_body_bytes: int = 262_144  # a request's body: 413 over it, before it is read
    max_prompt_tokens: int = 2_048  # one prompt's tokens: 400 over it
    max_request_tokens: int = 8_192  # all of a request's prompt tokens: 400 over it
    max_prompts: int = 64  # prompts in one request: 400 over it
    request_timeout_s: float = 60.0  # computing one request: 504 past it
    max_queue: int = 4  # requests waiting for the model: 429 (Retry-After) beyond it
    queue_timeout_s: float = 30.0  # how long a request waits for the model: 503 past it

    def check(self) -> None:
        for name, v in vars(self).items():
            if not v > 0:
                raise ValueError(f"the serve limit {name} must be > 0 (got {v})")
