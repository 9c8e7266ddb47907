"""Text into XML: ``escape`` for element text and ``quoteattr`` for an attribute value, quotes included.

The same results as :mod:`xml.sax.saxutils`' functions of those names, without importing it: that module
imports ``urllib.request`` (and with it ``http.client``, ``email`` and ``ssl``), 14-20 ms of every command's
start-up for two string replacements (measured with ``python -X importtime``, docs/benchmarks.md).
"""

from __future__ import annotations

_TEXT = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;"})
#: In an attribute, whitespace other than a space is written as a character reference: a parser normalises it.
_ATTR = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\n": "&#10;", "\r": "&#13;", "\t": "&#9;"})


def escape(text: str) -> str:
    """``&``, ``<`` and ``>`` of ``text`` as entities: the text of an element."""
    return text.translate(_TEXT)


def quoteattr(value: str) -> str:
    """``value`` as an attribute value, in the quotes it needs (double, single when it holds a double quote and
    no single one, else double with ``&quot;``)."""
    data = value.translate(_ATTR)
    if '"' not in data:
        return f'"{data}"'
    if "'" not in data:
        return f"'{data}'"
    return '"' + data.replace('"', "&quot;") + '"'
