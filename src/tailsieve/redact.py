"""Secret redaction: every text that came from a server (error bodies, stream error events, echoed headers) passes
through `redact` before it is printed, logged or written.

Two layers: the exact values registered with `register_secret` (the API key an `EngineClient` read from its
environment variable) are replaced wherever they appear, and anything shaped like a credential is masked whatever
its value: `Bearer <token>`, an `Authorization`/`api-key`/`x-api-key` header or JSON field, `api_key=...` query
parameters, `sk-...` style keys and the `user:password@` of a URL.
"""

from __future__ import annotations

import re

MASK = "[redacted]"
_MIN_SECRET = 4  # shorter values would mask ordinary words
_SECRETS: set[str] = set()

_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=:-]+"),
    re.compile(r"""(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]?token|secret)(["']?\s*[:=]\s*["']?)"""
               r"""(?!\[redacted\]|(?:bearer|basic)\s)[^\s"',;&}]+"""),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@'\"]+@"),  # user:password@ in a URL
)


def register_secret(value: str | None) -> None:
    """Remember a secret value (an API key) so that `redact` masks it everywhere; short or empty values are ignored."""
    if value and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)


def redact(text: str) -> str:
    """`text` with every registered secret and every credential-shaped substring replaced by `[redacted]`."""
    out = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        out = out.replace(secret, MASK)
    out = _PATTERNS[0].sub(lambda m: f"{m.group(1)} {MASK}", out)
    out = _PATTERNS[1].sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
    out = _PATTERNS[2].sub(MASK, out)
    return _PATTERNS[3].sub(lambda m: f"{m.group(1)}{MASK}@", out)


__all__ = ["MASK", "redact", "register_secret"]
