"""Markdown to the HTML subset QTextDocument understands, with pygments colours inline and a copy link per code
block."""

from __future__ import annotations

import html
import re

import markdown
from pygments import highlight
from pygments.formatters import HtmlFormatter
from pygments.lexers import TextLexer, get_lexer_by_name, guess_lexer
from pygments.util import ClassNotFound

_CODE_SPAN = re.compile(r"(`+)(.+?)\1", re.S)
_FENCE = re.compile(r"^```[ \t]*([\w+#.-]*)[^\n]*\n(.*?)(?:^```[ \t]*$|\Z)", re.S | re.M)


def _lexer(lang: str, code: str):
    if lang:
        try:
            return get_lexer_by_name(lang)
        except ClassNotFound:
            pass
    try:
        return guess_lexer(code) if len(code) > 40 else TextLexer()
    except ClassNotFound:
        return TextLexer()


def _escape_html(text: str) -> str:
    """Model output is text, not HTML: `<vector>` must show, and no tag may reach the renderer. Code spans are left to
    Markdown, which escapes them itself."""
    out, last = [], 0
    for m in _CODE_SPAN.finditer(text):
        out.append(text[last:m.start()].replace("&", "&amp;").replace("<", "&lt;"))
        out.append(m.group(0))
        last = m.end()
    out.append(text[last:].replace("&", "&amp;").replace("<", "&lt;"))
    return "".join(out)


def render(text: str, dark: bool = False) -> tuple[str, list[str]]:
    """Return (html, code_blocks). Anchors `copy-code:N` in the HTML refer to code_blocks[N].

    Fenced blocks are cut out before Markdown runs (an unterminated fence while streaming still renders as code),
    coloured by pygments with inline styles, and put back.
    """
    codes: list[str] = []
    rendered: list[str] = []
    style = "monokai" if dark else "friendly"
    bg = "#272822" if dark else "#f4f4f4"
    formatter = HtmlFormatter(noclasses=True, nowrap=True, style=style)

    def cut(match: re.Match) -> str:
        lang, code = match.group(1), match.group(2)
        code = code.rstrip("\n")
        n = len(codes)
        codes.append(code)
        body = highlight(code, _lexer(lang, code), formatter)
        label = html.escape(lang or "code")
        rendered.append(
            f'<table width="100%" cellspacing="0" cellpadding="6" style="background:{bg};margin:4px 0">'
            f'<tr><td style="color:#888;font-size:small">{label}</td>'
            f'<td align="right" style="font-size:small"><a href="copy-code:{n}">Copy</a></td></tr>'
            f'<tr><td colspan="2"><pre style="margin:0;font-family:monospace">{body}</pre></td></tr></table>')
        return f"\n\nTESSERACODEBLOCK{n}X\n\n"

    text = _escape_html(_FENCE.sub(cut, text))
    out = markdown.markdown(text, extensions=["tables", "sane_lists"], output_format="html")
    for n, block in enumerate(rendered):
        out = out.replace(f"<p>TESSERACODEBLOCK{n}X</p>", block).replace(f"TESSERACODEBLOCK{n}X", block)
    return out, codes
