"""What the API may show of an error text: the reason, without server paths or tracebacks
(those stay in the store and the service's log), and nothing a JSON answer cannot carry."""

from __future__ import annotations

import re

# An absolute path of two or more parts (not inside a URL); its last part is kept.
_PATH = re.compile(r"(?<![\w.:/~])/(?:[\w.+@~-]+/)+([\w.+@~-]+)")
_FRAME = re.compile(r'^\s*File "[^"]*", line \d+')
_HEADERS = ("Traceback (most recent call last):", "Stack (most recent call first):")
_FAULT_THREAD = re.compile(r"^(Current thread|Thread) 0x[0-9a-f]+ .*most recent call first\):$")


def printable(text: str) -> str:
    """``text`` with control characters (but newlines and tabs) and lone surrogates escaped,
    safe in any JSON answer.

    >>> printable("a\\x00b\\ud800c\\u00e9")
    'a\\\\x00b\\\\ud800cé'
    """
    return "".join(
        c
        if (c.isprintable() or c in "\n\t") and not 0xD800 <= ord(c) <= 0xDFFF
        else c.encode("unicode_escape", "backslashreplace").decode("ascii")
        for c in text
    )


def public_error(text: str) -> str:
    """The error as the API shows it: traceback frames dropped (their exception line kept),
    absolute paths cut to their file name, control characters escaped.

    >>> public_error('Traceback (most recent call last):\\n  File "/srv/x/run.py", line 3, '
    ...              'in f\\n    g()\\nValueError: bad /home/u/.tunehub/build/k-1.c')
    'ValueError: bad k-1.c'
    >>> public_error("/tmp/tunehub/build/kernel-9f.c:12:5: error: 'x' undeclared")
    "kernel-9f.c:12:5: error: 'x' undeclared"
    """
    if not text:
        return text
    kept: list[str] = []
    in_frames = False
    for line in text.splitlines():
        stripped = line.strip()
        if stripped in _HEADERS or _FAULT_THREAD.match(stripped):
            in_frames = True
            continue
        if _FRAME.match(line):
            in_frames = True
            continue
        if in_frames and (line.startswith((" ", "\t")) or not stripped):
            continue  # a frame's source line, or a blank between frames
        in_frames = False
        kept.append(line)
    return printable("\n".join(_PATH.sub(r"\1", line) for line in kept).strip())
