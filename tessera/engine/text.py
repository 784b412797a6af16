"""Strings from files (tensor names, metadata, paths) made safe to print: a terminal must not receive escape sequences
from a downloaded model (they can retitle, clear or rewrite the screen)."""

from __future__ import annotations

import unicodedata


def terminal_safe(text: str, *, keep_newlines: bool = False) -> str:
    """`text` with control and format characters (ESC, BEL, C1 controls, bidi overrides, ...) written as Python-style
    escapes (\\x1b, \\u202e); tabs kept, newlines kept only when asked."""
    out = []
    for ch in str(text):
        if ch == "\t" or (keep_newlines and ch == "\n"):
            out.append(ch)
        elif unicodedata.category(ch) in ("Cc", "Cf", "Cs", "Co", "Zl", "Zp"):
            code = ord(ch)
            out.append(f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")
        else:
            out.append(ch)
    return "".join(out)
