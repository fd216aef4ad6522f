"""Secret redaction: every text that came from a server (error bodies, stream error events, echoed headers) passes
through `redact` before it is printed, logged or written.

Two layers: the exact values registered with `register_secret` (the API key an `EngineClient` read from its
environment variable) are replaced wherever they appear, and anything shaped like a credential is masked whatever
its value: `Bearer <token>`, an `Authorization`/`api-key`/`x-api-key` header or JSON field, `api_key=...` query
parameters, the value of every secret-looking variable name (`*_KEY`, `*_TOKEN`, `*SECRET*`, `*PASSWORD*`,
`*PASSWD*`, `*CREDENTIAL*`) as `NAME=value`, `"NAME": "value"` or `NAME = "value"`, `sk-...` style keys and the
`user:password@` of a URL.

`excerpt` is how an error message quotes a value that came from a file or a flag: redacted, then cut to
`EXCERPT_CHARS` characters.
"""

from __future__ import annotations

import re

MASK = "[redacted]"
EXCERPT_CHARS = 80  # the most of a file's (or flag's) content an error message quotes
_MIN_SECRET = 4  # shorter values would mask ordinary words
_SECRETS: set[str] = set()
# A secret-looking variable name: HF_TOKEN, OPENAI_API_KEY, AWS_SECRET_ACCESS_KEY, DB_PASSWORD (not max_tokens).
_SECRET_NAME = (r"[A-Za-z0-9_.-]*(?:_KEY|_TOKEN|SECRET[A-Za-z0-9_.-]*|PASSWORD[A-Za-z0-9_.-]*|PASSWD[A-Za-z0-9_.-]*"
                r"|CREDENTIALS?[A-Za-z0-9_.-]*)")

_NAME = re.compile(rf"(?i)(?:{_SECRET_NAME}|(?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]?token)")
_PATTERNS: tuple[re.Pattern[str], ...] = (
    re.compile(r"(?i)(bearer|basic)\s+[A-Za-z0-9._~+/=:-]+"),
    re.compile(r"""(?i)((?:proxy-)?authorization|x-api-key|api[-_]?key|access[-_]?token|secret|"""
               rf"""\b{_SECRET_NAME}\b)(["']?\s*[:=]\s*["']?)(?!\[redacted\]|(?:bearer|basic)\s)[^\s"',;&}}]+"""),
    re.compile(r"\bsk-[A-Za-z0-9_-]{8,}"),
    re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^\s/@'\"]+@"),  # user:password@ in a URL
)


def register_secret(value: str | None) -> None:
    """Remember a secret value (an API key) so that `redact` masks it everywhere; short or empty values are ignored."""
    if value and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)


def secret_name(name: str) -> bool:
    """Whether a variable or key name looks like it holds a secret (`HF_TOKEN`, `OPENAI_API_KEY`, `api_key`, …)."""
    return bool(_NAME.fullmatch(name))


def redact(text: str) -> str:
    """`text` with every registered secret and every credential-shaped substring replaced by `[redacted]`."""
    out = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        out = out.replace(secret, MASK)
    out = _PATTERNS[0].sub(lambda m: f"{m.group(1)} {MASK}", out)
    out = _PATTERNS[1].sub(lambda m: f"{m.group(1)}{m.group(2)}{MASK}", out)
    out = _PATTERNS[2].sub(MASK, out)
    return _PATTERNS[3].sub(lambda m: f"{m.group(1)}{MASK}@", out)


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` as an error message quotes it: text as its repr, other values as printed; redacted, then cut to
    `limit` characters (`…` and the full length follow a cut)."""
    if isinstance(value, bool) or not isinstance(value, int):
        text = repr(value) if isinstance(value, str) else str(value)
    else:
        try:
            text = str(value)
        except ValueError:  # more digits than int-to-str converts
            return f"{'-' if value < 0 else ''}an integer of about {int(abs(value).bit_length() * 0.30103)} digits"
    return clip(text, limit)


def clip(text: str, limit: int = EXCERPT_CHARS) -> str:
    """Text from a file as an error message shows it unquoted (a CSV header's columns): control characters escaped,
    redacted, then cut to `limit` characters (`…` and the full length follow a cut; a cut never splits a `[redacted]`
    mask, which is then shown whole)."""
    text = redact("".join(c if c.isprintable() else repr(c)[1:-1] for c in text))
    if len(text) <= limit:
        return text
    cut = limit
    mask = text.find(MASK, max(0, limit - len(MASK) + 1))
    if 0 <= mask < limit:
        cut = mask + len(MASK)
    return f"{text[:cut]}… ({len(text):,} characters)"


__all__ = ["EXCERPT_CHARS", "MASK", "clip", "excerpt", "redact", "register_secret", "secret_name"]
