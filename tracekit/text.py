"""Text from outside tracekit (folder, file, host and event names) made safe for where it goes.

A trace is someone else's file: its names can hold ESC, BEL or C1 controls that a terminal
acts on (clear the screen, set the title), characters XML 1.0 forbids, or backticks and
brackets that turn Markdown into live links and raw HTML. The renderers pass every such
string through one of these functions as it leaves for a terminal or a file, so that
what arrives shows the name, visibly, and does nothing else.

A visible escape is written as Python writes it (``\\x1b``, ``\\u202e``). For a terminal or
XML a backslash that was in the name stays as it is (so escaping twice changes nothing):
the text is for people to read, not to be decoded back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from os import PathLike
from typing import Any

# Characters a terminal acts on or that change what the rest of the line looks like: C0
# controls, DEL and the C1 controls (U+009B is a one-byte CSI), lone surrogates (undecodable
# bytes of a file name; the terminal's encoder would fail on them), the line and paragraph
# separators, and the bidirectional marks, embeddings, overrides and isolates that reorder
# the text after them ("Trojan Source").
_BIDI = r"\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069"
_TERMINAL_UNSAFE = re.compile(rf"[\x00-\x1f\x7f-\x9f\ud800-\udfff\u2028\u2029{_BIDI}]")
# What XML 1.0 forbids (C0 controls but tab, newline and carriage return; lone surrogates;
# U+FFFE and U+FFFF), a carriage return (a parser turns it into a newline), and what a CI
# log would act on when it prints a test's message (DEL, C1 and bidi controls, separators).
_XML_UNSAFE = re.compile(rf"[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\ufffe\uffff\u2028\u2029{_BIDI}]")
# What can be live anywhere in a line of CommonMark, GitHub's extensions or linkify: a
# backslash escape, code span, emphasis or strikethrough, link or image bracket, raw HTML or
# autolink, table cell, math; an entity ("&" and a name or "#"); a "_" unless between two
# letters or digits (there it opens and closes nothing); the ":" of a scheme ("http://",
# "mailto:x": one with text right after it); the "." of a domain ("www.", "evil.com": after a
# letter or digit and before a letter); a run of "#" that ends the text (a heading's closing
# sequence). Digits, "+", "-", ".", "%", "(", ")" and the rest need no escape there.
_MARKDOWN_INLINE = re.compile(
    r"[\\`*~\[\]<|$]"
    r"|&(?=[#A-Za-z])"
    r"|(?<![^\W_])_|_(?![^\W_])"
    r"|:(?=\S)"
    r"|(?<=[^\W_])\.(?=[^\W\d_])|(?<=[wW]{3})\."
    r"|#(?=#*[ \t]*$)"
)
# What opens a block where the text starts a line (a quote, list item, heading, setext
# underline, after up to three spaces), and an ordered list's "1." or "1)" before a space.
_MARKDOWN_BLOCK_START = re.compile(r"^ {0,3}(?:[>#+=-]|\d{1,9}[.)](?=[ \t]|$))")
_BACKTICK_RUN = re.compile(r"`+")


_SHORT_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r"}


def _visible(match: re.Match[str]) -> str:
    char = match.group()
    code = ord(char)
    return _SHORT_ESCAPES.get(char) or (f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}")


def for_terminal(text: str | PathLike[str]) -> str:
    """``text`` as one line for a terminal: every control, bidi or separator character
    (newline and tab included) written as a visible escape."""
    return _TERMINAL_UNSAFE.sub(_visible, str(text))


def for_xml(text: str | PathLike[str]) -> str:
    """``text`` for an XML 1.0 attribute or element: what XML forbids or a log would act on
    written as a visible escape; tab and newline kept. The XML library escapes ``<&"``."""
    return _XML_UNSAFE.sub(_visible, str(text))


def for_markdown_code(text: str) -> str:
    """``text`` as an inline Markdown code span, shown literally: the fence is longer than
    any run of backticks inside, and controls and newlines are visible escapes, so that the
    span cannot end early or break the line it is on. Not for a table cell (use
    :func:`for_markdown_text`: GFM splits cells at ``|`` even inside code)."""
    content = for_terminal(text)
    if not content:
        return "` `"  # "``" would be two backticks, not an empty span
    fence = "`" * (max((len(run) for run in _BACKTICK_RUN.findall(content)), default=0) + 1)
    if content[0] in "` " or content[-1] in "` ":
        content = f" {content} "  # CommonMark strips one space each side, and only then
    return f"{fence}{content}{fence}"


def for_markdown_text(text: str, line_start: bool = True) -> str:
    """``text`` as plain Markdown text that renders as itself: controls and newlines as
    visible escapes, a backslash before each character that could start markup where it
    stands (and only those, so that the Markdown stays readable as text), and an invisible
    word joiner after each ``@``: GitHub finds e-mail addresses in the rendered text, where
    escapes no longer count, and links them.

    ``line_start``: the text may begin a line (a quote's line, "> TEXT"), where a list
    marker, quote or heading could open; False for text after other text on its line or in
    a table cell (cells hold inline content only)."""
    escaped = _MARKDOWN_INLINE.sub(_backslashed, for_terminal(text))
    match = _MARKDOWN_BLOCK_START.match(escaped) if line_start else None
    if match:  # the marker is the match's last character
        escaped = f"{escaped[: match.end() - 1]}\\{escaped[match.end() - 1 :]}"
    return escaped.replace("@", "@\u2060")


def _backslashed(match: re.Match[str]) -> str:
    return "\\" + match.group()


def map_strings(value: Any, escape: Callable[[str], str]) -> Any:
    """A copy of a JSON-like ``value`` (dicts, lists, strings, numbers) with ``escape``
    applied to every string in it but the dicts' keys (those are the document's own)."""
    if isinstance(value, str):
        return escape(value)
    if isinstance(value, dict):
        return {key: map_strings(item, escape) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [map_strings(item, escape) for item in value]
    return value
