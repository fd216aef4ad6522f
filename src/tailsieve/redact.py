"""Secret redaction: every text that came from a user or a server (error bodies, stream error events, echoed headers,
flag values, command lines, file content) passes through `redact` before it is printed, logged or written.

Two layers: the exact values registered with `register_secret` (the API key an `EngineClient` read from its
environment variable) are replaced wherever they appear, and anything shaped like a credential is masked whatever its
value (issue 49):

- after a secret-looking name (`secret_name`: any case, `_`/`-`/`.` separators, ending in key, token, secret,
  password, passwd, credential, cookie, session, auth or bearer, or holding secret/password/passwd/credential in its
  last dotted part) or an `Authorization`/`Cookie`/`Set-Cookie` header, the whole value: a quoted string to its closing
  quote (one quoted with an escaped quote, in a repr or JSON, to the same escaped quote or the line's end), else a
  `NAME: value` to the end of the line, a `NAME=value` or `--flag value` to the end of the field (whitespace, or `&`
  before the next `name=`);
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

# Names are classified in Python, not by one regex (a regex of nested repetitions took minutes on a hostile 64 KiB
# error body): a name is a run of [A-Za-z0-9_.-] (at most NAME_CHARS), its parts split at _ - .
WEAK = frozenset({"key", "token", "session", "auth", "bearer", "pwd"})  # a secret only as NAME=, --NAME, a quoted key
# or at the start of a field (`token=…`, `"token": …`, `token: …` on its own line; not `verl session: cannot start`)
LAST = WEAK | {"secret", "password", "passwd", "credential", "credentials", "cookie", "authorization", "apikey"}
STRONG = frozenset({"secret", "password", "passwd", "credential", "credentials"})  # anywhere in the last dotted part
# header and strong words are names even glued to what precedes them (`\x1b[31mAuthorization:`, `mypassword=`)
GLUED = ("authorization", "cookie", "password", "passwd", "secret", "credential", "credentials", "apikey", "api_key",
         "api-key")
NAME_CHARS = 128
_SPLIT = re.compile(r"[_.-]")
_SECRETISH = re.compile(r"(?i)key|token|secret|pass|pwd|credential|cookie|session|auth|bearer")
_CANDIDATE = re.compile(r"[:=]|--")  # where a name's value may follow: NAME: NAME= --NAME
_FLAG = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9_.-]{0,127}+)(?![A-Za-z0-9_.-])(?P<sep>[ \t]++)")
_BLANKS = re.compile(r"[ \t]*+")
_NAME_SET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")
_AUTHORITY = re.compile(r"[^\s/?#]{0,4096}+")  # a URL's authority: to the path, query, fragment or a blank
_UNQUOTED = re.compile(r"[^\s\"']*+")
_NEXT_NAME = re.compile(r"&[A-Za-z_][\w.-]*=")
_QUOTED = {'"': re.compile(r'"(?:[^"\\\n]|\\.)*+(?:"|$)', re.M), "'": re.compile(r"'(?:[^'\\\n]|\\.)*+(?:'|$)", re.M)}
# a value quoted inside an escaped string, at any depth (a repr, JSON, or the repr of either: `HF_TOKEN=\'abc\'`)
_ESCAPED_QUOTE = re.compile(r"\\++[\"']")
_PLACEHOLDER = re.compile(r"(?:value|\.\.\.|…|<[A-Za-z_]*>|\{[A-Za-z_]*\})(?=[\s,;)\]]|$)")
_ESCAPE = re.compile(r"(?:[abfnrtv0]|x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4})")  # what follows `\` in an escaped excerpt
_CSI_TAIL = re.compile(r"[0-9;]*[A-Za-z]")  # the rest of a terminal sequence after `ESC[`
# what may sit right before a bare token without being part of it: an escaped control character as an excerpt shows
# it (`\n`, `\x1b`, `\u202e`) or a terminal sequence (`\x1b[31m`, raw or escaped)
_ESCAPED = "".join([r"|(?<=\\[abfnrtv0'\"])|(?<=\\x[0-9a-fA-F]{2})|(?<=\\u[0-9a-fA-F]{4})|(?<=[\x00-\x1f\x7f])",
                    *(rf"|(?<=\x1b\[[0-9;]{{{k}}}[A-Za-z])|(?<=\\x1b\[[0-9;]{{{k}}}[A-Za-z])" for k in range(7))])

_PATTERNS: tuple[tuple[re.Pattern[str], str], ...] = (
    # an authorization scheme and its credentials
    (re.compile(r"(?i)\b(bearer|basic|token|digest)([ \t]+)(?!\[redacted\])(?=[A-Za-z0-9._~+/=:-]*+(?<=[0-9=._~+/-]))"
                r"[A-Za-z0-9._~+/=:-]{6,}+"), r"\1\2" + MASK),
    # bare token shapes
    (re.compile(rf"(?=sk-|hf_|gh[pousr]_|github_pat_|xox|AKIA|ASIA|eyJ)(?:(?<![A-Za-z0-9]){_ESCAPED})"
                r"(?:sk-[A-Za-z0-9_-]{8,}+|hf_[A-Za-z0-9]{16,}+|gh[pousr]_[A-Za-z0-9]{16,}+"
                r"|github_pat_[A-Za-z0-9_]{16,}+|xox[bpaors]-[A-Za-z0-9-]{8,}+|(?:AKIA|ASIA)[A-Z0-9]{16}"
                r"|eyJ[A-Za-z0-9_-]{4,}+\.eyJ[A-Za-z0-9_-]{4,}+\.[A-Za-z0-9_-]*+)"), MASK),
)
# cheap gates before each scan (most text holds none of these): a secret word not followed by a letter (`tokens`,
# `keyboard`, `secrets` are never names: `_kind`), an authorization scheme and a blank, a bare token's prefix
_NAME_WORDS = ("key", "token", "secret", "passwd", "password", "pwd", "credential", "credentials", "cookie", "session",
               "auth", "authorization", "bearer", "apikey")
_SCHEMES = ("bearer ", "basic ", "token ", "digest ", "bearer\t", "basic\t", "token\t", "digest\t")
_PREFIXES = ("sk-", "hf_", "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_", "xox", "akia", "asia", "eyj")


def _kind(name: str) -> int:
    """0: not a secret name; 1: an ordinary word that names a secret in context (WEAK); 2: a secret name."""
    low = name.lower()
    parts = _SPLIT.split(low)
    if len(parts) == 1:
        return 1 if low in WEAK else 2 if low in LAST or low.endswith(GLUED) else 0
    if parts[-1] in LAST or not STRONG.isdisjoint(re.split(r"[_-]", low.rsplit(".", 1)[-1])):
        return 2
    return 2 if low.endswith(GLUED) else 0


def _name_kind(text: str, start: int, name: str) -> tuple[int, bool]:
    """The kind of the name at `start` and whether it is a flag (`--name`), reading past an escape or terminal
    sequence glued before it (`\\ntoken`, `\\x1b[31mtoken`, `\\x1bHF_TOKEN`, `\\n--api-key`)."""
    before = text[start - 1] if start else ""
    glue = _ESCAPE if before == "\\" else _CSI_TAIL if before == "[" else None
    m = glue.match(name) if glue is not None else None
    core = name[m.end():] if m else name
    bare = core.lstrip("-")
    kind = _kind(name)
    if core != name and bare and (kind == 0 or core.startswith("-")):
        kind = _kind(bare)
    return kind, core.startswith("-") and bare != ""


def _field_start(text: str, start: int) -> bool:
    """Whether `start` begins a field: the text's or a line's start, or after `{ , ; ( [ :` and at most one blank."""
    i = start - 1 if start and text[start - 1] in " \t" else start
    return i == 0 or text[i - 1] in "\n{,;([:"


def _value_end(text: str, pos: int, sep: str) -> int | None:
    """Where the value after a separator ends (None: no value to mask): a quoted string to its closing quote (one
    quoted with an escaped quote, `\\'…\\'` in a repr, to the same escaped quote or the end of the line); after `:`
    the end of the line; after `=` the end of the field (a blank, a quote, `&` before the next name=); after a
    flag's blank, the next word."""
    if pos >= len(text) or text.startswith(MASK, pos) or _PLACEHOLDER.match(text, pos):
        return None
    if text[pos] in _QUOTED:
        m = _QUOTED[text[pos]].match(text, pos)
        return m.end() if m else None
    if text[pos] == "\\" and (q := _ESCAPED_QUOTE.match(text, pos)) is not None:
        stop = _line_end(text, q.end())
        close = text.find(q.group(), q.end(), stop)  # the same escaped quote closes it, else the line's end
        return stop if close < 0 else close + len(q.group())
    if ":" in sep:
        return _line_end(text, pos)
    if "=" in sep:
        end = _UNQUOTED.match(text, pos).end()  # type: ignore[union-attr]
        amp = _NEXT_NAME.search(text, pos, end)
        end = amp.start() if amp else end
        return end if end > pos else None
    if text[pos] == "-":  # a flag without a value before the next flag
        return None
    end = _UNQUOTED.match(text, pos).end()  # type: ignore[union-attr]
    return end if end > pos else None


def _line_end(text: str, pos: int) -> int:
    """Where the line holding `pos` ends (its newline, or the end of the text)."""
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _name_before(text: str, end: int) -> int:
    """Where the name run ending at `end` starts (`end` itself when there is none, or it is longer than NAME_CHARS)."""
    start = end
    while start > 0 and text[start - 1] in _NAME_SET:
        start -= 1
        if end - start > NAME_CHARS:
            return end
    return start


def _mask_names(text: str) -> str:
    """Every value after a secret name (module docstring), in one linear scan from separator to separator: each `:`
    or `=` reads the name before it, each `--` the flag after it (C finds the separators; Python looks at a few)."""
    out: list[str] = []
    last = pos = 0
    while (m := _CANDIDATE.search(text, pos)) is not None:
        k = pos = m.end()
        if m.group() == "--":  # --flag value (an `=` after the flag is the next candidate's)
            f = _FLAG.match(text, k)
            if f is None or (m.start() and text[m.start() - 1] in _NAME_SET and not _glued(text, m.start())):
                continue
            sep, head_end, quoted, flag, kind, start = f["sep"], f.end(), False, True, _kind(f["name"]), m.start()
        else:
            b = m.start()
            while b > 0 and text[b - 1] in " \t":
                b -= 1
            quote = text[b - 1] if b > 0 and text[b - 1] in "\"'" else ""
            start = _name_before(text, b - len(quote))
            quoted = bool(quote) and start > 0 and text[start - 1] == quote
            if start == b - len(quote) or (quote and not quoted):
                continue
            start -= quoted
            name = text[start + quoted:b - len(quote)]
            if not _SECRETISH.search(name):  # most names (JSON keys, words before a colon) hold no secret word
                continue
            kind, flag = _name_kind(text, start + quoted, name)
            sep = m.group()
            head_end = _BLANKS.match(text, k).end()  # type: ignore[union-attr]
        if kind == 0 or (kind == 1 and sep == ":" and not quoted and not flag and not _field_start(text, start)):
            continue
        end = _value_end(text, head_end, sep)
        if end is None:
            continue
        out.append(text[last:head_end])
        out.append(MASK)
        last = pos = end
    out.append(text[last:])
    return "".join(out)


def _glued(text: str, i: int) -> bool:
    """Whether the name characters before index `i` are an escape glued to it (`\\n--api-key`)."""
    return i >= 2 and text[i - 2] == "\\" and text[i - 1] in "abfnrtv0"


def register_secret(value: str | None) -> None:
    """Remember a secret value (an API key) so that `redact` masks it everywhere; short or empty values are ignored."""
    if value and len(value) >= _MIN_SECRET:
        _SECRETS.add(value)


def secret_name(name: str) -> bool:
    """Whether a variable, key, header or flag name looks like it holds a secret (`HF_TOKEN`, `OPENAI_API_KEY`,
    `api_key`, `X-Auth-Token`, `--api-key`, `Set-Cookie`; not `max_tokens`, `secret.toml` or `--api-key-env`)."""
    bare = name.lstrip("-")
    return len(bare) <= NAME_CHARS and bool(re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*", bare)) and _kind(bare) > 0


def redact(text: str) -> str:
    """`text` with every registered secret and every credential-shaped substring replaced by `[redacted]` (module
    docstring)."""
    out = str(text)
    for secret in sorted(_SECRETS, key=len, reverse=True):
        if secret in out:
            out = out.replace(secret, MASK)
    low = out.lower()
    if _name_word(low):
        out = _mask_names(out)
    for (pattern, repl), words in zip(_PATTERNS, (_SCHEMES, _PREFIXES), strict=True):
        if any(w in low for w in words):
            out = pattern.sub(repl, out)
    return _mask_userinfo(out) if "://" in out else out


def _name_word(low: str) -> bool:
    """Whether lowered text holds a secret word not followed by a letter (`tokens`, `keyboard` are never names), the
    gate of `_mask_names` (str.find in C; a regex with IGNORECASE alternatives costs ten times more)."""
    for w in _NAME_WORDS:
        i = low.find(w)
        while i >= 0:
            j = i + len(w)
            if j == len(low) or not "a" <= low[j] <= "z":
                return True
            i = low.find(w, j)
    return False


def _mask_userinfo(text: str) -> str:
    """The userinfo of every URL (`scheme://USER:PASSWORD@host`) up to the last `@` before the host."""
    out: list[str] = []
    last = 0
    i = text.find("://")
    while i >= 0:
        j = i
        while j > 0 and i - j < 32 and (text[j - 1].isascii() and (text[j - 1].isalnum() or text[j - 1] in "+.-")):
            j -= 1
        m = _AUTHORITY.match(text, i + 3)
        at = text.rfind("@", i + 3, m.end()) if m else -1
        if j < i and at > i + 3 and not text.startswith(MASK, i + 3):
            out.append(text[last:i + 3])
            out.append(MASK)
            last = at
        i = text.find("://", max(i + 3, at))
    out.append(text[last:])
    return "".join(out)


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
    return clip(first, room)


def shown_command(argv: Iterable[str]) -> str:
    """A command line as printed or logged (dry runs, replica logs): shell-quoted, the value of every secret-looking
    flag (`--api-key KEY`, `--hf-token=KEY`) masked and every argument redacted (`shown_args`)."""
    return " ".join(a if a == MASK else shlex.quote(a) for a in shown_args(argv))


# a word whose next word is a secret: an authorization scheme or a header name
_LEADS = re.compile(r"(?i)bearer|basic|token|digest")


def shown_args(argv: Iterable[str]) -> list[str]:
    """`shown_command` as a list (one entry per argument) for JSON files such as `launch.json`: the value after a
    secret-looking flag (`--api-key KEY`, `--hf-token=KEY`; also after an argument that ends in one, `'0 --api-key'
    KEY`, as a shell-escaped blank makes, or in a secret name and its `=`: `'0 HF_TOKEN' = KEY`), an authorization
    scheme (`Bearer KEY`) or a header name (`Authorization: …`) masked, every argument redacted."""
    out: list[str] = []
    hide, prev = False, ""
    for arg in argv:
        arg = str(arg)
        word = arg.strip()
        name, eq, _ = word.partition("=")
        flag = word.startswith("-") and secret_name(name)
        out.append(MASK if hide else f"{name}={MASK}" if flag and eq else redact(arg))
        tail = word.rsplit(None, 1)[-1] if word else ""  # the last piece: a shell-escaped blank joins `0 HF_TOKEN`
        bare = tail.rstrip("=:").strip("\"'")  # `NAME=` / `NAME:` (a header name too) ending the argument
        last = tail.strip("\"'")  # an argument ending in a flag: `0 --api-key`
        ends_flag = last.startswith("-") and "=" not in last and secret_name(last)  # `--api-key` itself included
        hide = (ends_flag or bool(_LEADS.fullmatch(word)) or (bare != last and secret_name(bare))
                or (word in ("=", ":") and secret_name(prev)))  # or `=` / `:` after NAME
        prev = last
    return out


__all__ = ["EXCERPT_CHARS", "LINE_CHARS", "MASK", "clip", "escape_controls", "excerpt", "line", "redact",
           "register_secret", "secret_name", "shown_args", "shown_command"]
