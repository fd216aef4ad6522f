"""Secret redaction: every text that came from a user or a server (error bodies, stream error events, echoed headers,
flag values, command lines, file content) passes through `redact` before it is printed, logged or written.

Two layers: the exact values registered with `register_secret` (the API key an `EngineClient` read from its
environment variable) are replaced wherever they appear, and anything shaped like a credential is masked whatever its
value (issue 49):

- after a secret-looking name (`secret_name`: any case, `_`/`-`/`.` separators, ending in key, token, secret,
  password, passwd, credential, cookie, session, auth or bearer, or holding secret/password/passwd/credential in its
  last dotted part) or an `Authorization`/`Cookie`/`Set-Cookie` header, the whole value: a quoted string to its closing
  quote, else a `NAME: value` to the end of the line, a `NAME=value` or `--flag value` to the end of the field
  (whitespace, or `&` before the next `name=`);
- `Bearer`/`Basic`/`Token` credentials, the userinfo of a URL up to the last `@` before the host;
- bare token shapes: `sk-…` (`sk-proj-…`), `hf_…`, `ghp_`/`gho_`/`ghu_`/`ghs_`/`ghr_…`, `github_pat_…`,
  `xoxb-`/`xoxp-…`, AWS access key ids (`AKIA…`, `ASIA…`) and JWTs (`eyJ….eyJ….…`).

A file path is not a secret name: `secret.toml:` or `--config my_secret.toml` keep their names (the last dotted part
decides), and `max_tokens=4096` is not masked (`tokens` is not `token`).

`excerpt` is how an error message quotes a value that came from a file or a flag: redacted, control characters
escaped, then cut to `EXCERPT_CHARS` characters; `line` is the last guard on a whole printed line (`LINE_CHARS`).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable

MASK = "[redacted]"
EXCERPT_CHARS = 80  # the most of a file's (or flag's) content an error message quotes
LINE_CHARS = 300  # the longest line the CLI prints about user content (`line`)
_MIN_SECRET = 4  # shorter values would mask ordinary words
_SECRETS: set[str] = set()

# the last word of a secret-looking name (HF_TOKEN, OPENAI_API_KEY, X-Auth-Token, db.password, Set-Cookie)
_LAST = (r"(?:api[-_]?key|apikey|key|token|secret|password|passwd|pwd|credentials?|cookie|session|auth|bearer"
         r"|authorization)")
# words that make a name secret wherever they sit in its last dotted part (AWS_SECRET_ACCESS_KEY_ID, DB_PASSWORD_OLD)
_STRONG = r"(?:secret|password|passwd|credentials?)"
_PART = r"[A-Za-z0-9]+"
# a name that is secret wherever it stands: parts joined by _ - . whose last part is a _LAST word, a last dotted part
# holding a _STRONG part (so `secret.toml` is a file, `client_secret_id` a secret), or a header name
_NAME_ANY = (rf"(?:(?:{_PART}[_.-])+?{_LAST}|(?:{_PART}[_.-])*?(?:{_PART}[_-])*?{_STRONG}(?:[_-]{_PART})*"
             r"|authorization|cookie|apikey)")
# a bare ordinary word that names a secret only as an assignment, a flag, a quoted key or at the start of a field
# (`token=…`, `--token …`, `"token": …`, `token: …` on its own line; not `verl session: cannot start`)
_NAME_WEAK = r"(?:key|token|session|auth|bearer|pwd)"
_NAME_RE = rf"(?:{_NAME_ANY}|{_NAME_WEAK})"
# header and strong words are names even glued to what precedes them (`\x1b[31mAuthorization:`, `mypassword=`)
_GLUED = r"(?:(?:proxy-)?authorization|(?:set-)?cookie|password|passwd|secret|credentials?|api[-_]?key)"
_NAME_FULL = re.compile(rf"(?i){_NAME_RE}")
_QUOTED = r"\"(?:[^\"\\\n]|\\.)*(?:\"|$)|'(?:[^'\\\n]|\\.)*(?:'|$)"
# a documentation placeholder is no secret (`key=value`, `token=<TOKEN>`, `password: ...`)
_PLACEHOLDER = r"(?!(?:value|\.\.\.|…|<[A-Za-z_]*>|\{[A-Za-z_]*\})(?=[\s,;)\]]|$))"
_FIELD_END = r"(?=[\s\"']|&[A-Za-z_][\w.-]*=|$)"  # a NAME=value ends at a blank, a quote, or `&` + the next name=
# what may sit right before a name or a bare token without being part of it: an escaped control character as an
# excerpt shows it (`\n`, `\x1b`, `\u202e`) or a terminal sequence (`\x1b[31m`, raw or escaped)
_ESCAPED = "".join([r"|(?<=\\[abfnrtv0'\"])|(?<=\\x[0-9a-fA-F]{2})|(?<=\\u[0-9a-fA-F]{4})|(?<=[\x00-\x1f\x7f])",
                    *(rf"|(?<=\x1b\[[0-9;]{{{k}}}[A-Za-z])|(?<=\\x1b\[[0-9;]{{{k}}}[A-Za-z])" for k in range(7))])
_NB = rf"(?:(?<![A-Za-z0-9_.-]){_ESCAPED})"  # a name starts at a word edge
_NE = r"(?![A-Za-z0-9_-])"  # and ends at one (a dot may follow: `password.` ends a sentence)

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # NAME: value (header, YAML, JSON with a quoted key): a quoted value to its quote, else to the end of the line
    (re.compile(rf"(?im)((?:{_NB}[\"']?{_NAME_ANY}{_NE}[\"']?|{_GLUED}{_NE}[\"']?|{_NB}[\"']{_NAME_WEAK}[\"']"
                rf"|(?:^|(?<=[{{,;(\[:])|(?<=[{{,;(\[:] )){_NAME_WEAK}{_NE})[ \t]*:[ \t]*)(?!{re.escape(MASK)})"
                rf"({_QUOTED}|[^\n]+)"),
     r"\1" + MASK),
    # NAME=value, NAME = "value"
    (re.compile(rf"(?i)((?:(?:(?:(?<![\w.-]){_ESCAPED})--?|{_NB}){_NAME_RE}|{_GLUED}){_NE}[\"']?[ \t]*=[ \t]*)"
                rf"(?!{re.escape(MASK)}){_PLACEHOLDER}({_QUOTED}|[^\s\"']+?{_FIELD_END})"),
     r"\1" + MASK),
    # --secret-flag value (a command line)
    (re.compile(rf"(?i)((?:(?<![\w-]){_ESCAPED})--?{_NAME_RE}{_NE}[ \t]+)(?!-)(?!{re.escape(MASK)})({_QUOTED}|\S+)"),
     r"\1" + MASK),
    # an authorization scheme and its credentials
    (re.compile(r"(?i)\b(bearer|basic|token|digest)([ \t]+)(?!\[redacted\])(?=[A-Za-z0-9._~+/=:-]*[0-9=._~+/-])"
                r"[A-Za-z0-9._~+/=:-]{6,}"), r"\1\2" + MASK),
    # bare token shapes
    (re.compile(rf"(?=sk-|hf_|gh[pousr]_|github_pat_|xox|AKIA|ASIA|eyJ)(?:(?<![A-Za-z0-9]){_ESCAPED})"
                r"(?:sk-[A-Za-z0-9_-]{8,}|hf_[A-Za-z0-9]{16,}|gh[pousr]_[A-Za-z0-9]{16,}"
                r"|github_pat_[A-Za-z0-9_]{16,}|xox[bpaors]-[A-Za-z0-9-]{8,}|(?:AKIA|ASIA)[A-Z0-9]{16}"
                r"|eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]{4,}\.[A-Za-z0-9_-]*)"), MASK),
    # user:password@ of a URL, to the last @ before the host
    (re.compile(r"(?i)([a-z][a-z0-9+.-]*://)[^\s/?#]*@"), r"\1" + MASK + "@"),
)
_QUICK = re.compile(r"(?i)key|token|secret|pass|pwd|credential|cookie|session|auth|bearer|basic|digest|sk-|hf_"
                    r"|gh[pousr]_|github_pat|xox|AKIA|ASIA|eyJ|://")


def register_secret(value: str | None) -> None:
    """Remember a secret value (an API key) so that `redact` masks it everywhere; short or empty values are ignored."""
    if value and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)


def secret_name(name: str) -> bool:
    """Whether a variable, key, header or flag name looks like it holds a secret (`HF_TOKEN`, `OPENAI_API_KEY`,
    `api_key`, `X-Auth-Token`, `--api-key`, `Set-Cookie`; not `max_tokens`, `secret.toml` or `--api-key-env`)."""
    return bool(_NAME_FULL.fullmatch(name.lstrip("-")))


def redact(text: str) -> str:
    """`text` with every registered secret and every credential-shaped substring replaced by `[redacted]` (module
    docstring)."""
    out = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in out:
            out = out.replace(secret, MASK)
    if not _QUICK.search(out):  # the common case: nothing that could be a credential
        return out
    for pattern, repl in _PATTERNS:
        out = pattern.sub(repl, out)
    return out


def escape_controls(text: str) -> str:
    """`text` with every non-printable character (terminal escapes, newlines, NUL, bidi controls) written as its
    Python escape (`\\x1b`, `\\n`, `\\u202e`)."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def excerpt(value: object, limit: int = EXCERPT_CHARS) -> str:
    """`value` as an error message quotes it: text as its repr, other values as printed; redacted, then cut to
    `limit` characters (`…` and the full length follow a cut)."""
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, str) and len(value) > 64 * limit:  # a huge value: only its head is ever shown
            return clip(repr(value[:8 * limit])[:-1], limit, total=len(value) + 2)
        text = repr(value) if isinstance(value, str) else str(value)
    else:
        try:
            text = str(value)
        except ValueError:  # more digits than int-to-str converts
            return f"{'-' if value < 0 else ''}an integer of about {int(abs(value).bit_length() * 0.30103)} digits"
    return clip(text, limit)


def clip(text: str, limit: int = EXCERPT_CHARS, *, total: int | None = None) -> str:
    """Text from a file as an error message shows it unquoted (a CSV header's columns): control characters escaped,
    redacted, then cut to `limit` characters (`…` and the full length follow a cut; a cut never splits a `[redacted]`
    mask, which is then shown whole). `total`: the length of the whole text when `text` is only its head."""
    text = redact(escape_controls(text))
    if len(text) <= limit and total is None:
        return text
    cut = min(limit, len(text))
    mask = text.find(MASK, max(0, cut - len(MASK) + 1))
    if 0 <= mask < cut:
        cut = mask + len(MASK)
    return f"{text[:cut]}… ({total or len(text):,} characters)"


def line(text: str, limit: int = LINE_CHARS, prefix: str = "") -> str:
    """One printed line about user or server content: its first line, control characters escaped, redacted, at most
    `limit` characters with `prefix` (the last guard of `tailsieve.cli`'s error lines and argparse errors)."""
    first = str(text).strip().split("\n", 1)[0]
    room = limit - len(prefix) - 24  # a cut line ends with `… (N characters)`
    if len(first) > 16 * limit:
        return clip(first[:4 * limit], room, total=len(first))
    return first if len(first) <= room and first.isprintable() and not _QUICK.search(first) else clip(first, room)


def shown_command(argv: Iterable[str]) -> str:
    """A command line as printed or logged (dry runs, replica logs): shell-quoted, the value of every secret-looking
    flag (`--api-key KEY`, `--hf-token=KEY`) masked and every argument redacted (`shown_args`)."""
    return " ".join(a if a == MASK else shlex.quote(a) for a in shown_args(argv))


# a word whose next word is a secret: an authorization scheme or a header name
_LEADS = re.compile(rf"(?i)(?:bearer|basic|token|digest|(?:.*[^\w-])?{_NAME_RE}:)")


def shown_args(argv: Iterable[str]) -> list[str]:
    """`shown_command` as a list (one entry per argument) for JSON files such as `launch.json`: the value after a
    secret-looking flag (`--api-key KEY`, `--hf-token=KEY`), an authorization scheme (`Bearer KEY`) or a header name
    (`Authorization: …`) masked, every argument redacted."""
    out: list[str] = []
    hide, prev = False, ""
    for arg in argv:
        arg = str(arg)
        word = arg.strip()
        name, eq, _ = word.partition("=")
        flag = word.startswith("-") and secret_name(name)
        out.append(MASK if hide else f"{name}={MASK}" if flag and eq else redact(arg))
        bare = word.rstrip("=:").strip("\"'")  # `NAME=` / `NAME:` as a word of its own, or `=` after NAME
        hide = ((flag and not eq) or bool(_LEADS.fullmatch(word))
                or (bare != word.strip("\"'") and secret_name(bare)) or (word in ("=", ":") and secret_name(prev)))
        prev = word.strip("\"'")
    return out


__all__ = ["EXCERPT_CHARS", "LINE_CHARS", "MASK", "clip", "escape_controls", "excerpt", "line", "redact",
           "register_secret", "secret_name", "shown_args", "shown_command"]
