"""Export a conversation to Markdown or JSON (plain functions over store data)."""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from tessera.app.store import Conversation, Message

FORMAT_VERSION = 1


def to_markdown(conversation: Conversation, messages: list[Message]) -> str:
    lines = [f"# {conversation.title}", ""]
    if conversation.model:
        lines += [f"_Model: {conversation.model}_", ""]
    for m in messages:
        lines.append(f"## {m.role.capitalize()}")
        lines.append("")
        if m.thinking:
            secs = f" ({m.thinking_s:.1f} s)" if m.thinking_s is not None else ""
            lines.append(f"<details><summary>Thinking{secs}</summary>")
            lines.append("")
            lines.append(m.thinking.strip())
            lines.append("")
            lines.append("</details>")
            lines.append("")
        lines.append(m.content.strip())
        if m.state not in ("done", "streaming"):
            lines += ["", f"_({m.state})_"]
        lines.append("")
    return "\n".join(lines).rstrip() + "\n"


def to_json(conversation: Conversation, messages: list[Message]) -> str:
    doc = {
        "format": "tessera-conversation",
        "version": FORMAT_VERSION,
        "conversation": asdict(conversation),
        "messages": [asdict(m) for m in messages],
    }
    return json.dumps(doc, indent=2, ensure_ascii=False) + "\n"


def write_atomic(path: str | Path, text: str) -> None:
    """Write via a temporary file in the same folder, then rename. The file gets the permissions a new file of the
    user's gets (0666 less the umask, usually 0644), not mkstemp's private 0600: an export is for other programs."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    mask = os.umask(0)  # reading the umask means setting it; put it straight back
    os.umask(mask)
    return mask
