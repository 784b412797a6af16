"""Reading a placement-rules file that may come from anywhere: bounded size, UTF-8 or a named error, YAML without
aliases (billion-laughs expansion) or deep nesting, parsed once, and name patterns matched by RE2 in linear time (a
pattern like `^(.+)+X$` backtracks for minutes in Python's `re`)."""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Any

import re2
import yaml

from tessera.engine.errors import TesseraError

MAX_RULES_BYTES = 1024 * 1024  # a real rules file is a few hundred bytes
MAX_DEPTH = 32  # nesting of YAML collections
MAX_PATTERN_CHARS = 1000


def read_rules_text(path: str | os.PathLike) -> str:
    path = Path(path)
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):
            raise TesseraError(str(path), "placement rules must be a regular file (this is a FIFO, device or folder)")
        if st.st_size > MAX_RULES_BYTES:
            raise TesseraError(str(path), f"placement rules file is {st.st_size} bytes; the limit is "
                                          f"{MAX_RULES_BYTES} (a rules file is a short YAML list)")
        raw = path.read_bytes()[: MAX_RULES_BYTES + 1]
    except OSError as e:
        raise TesseraError(str(path), f"cannot read placement rules: {e.strerror or e}") from None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        line = raw[: e.start].count(b"\n") + 1
        raise TesseraError(str(path), f"placement rules are not UTF-8 text (byte {e.start}, line {line})") from None


def parse_yaml(text: str, source: str) -> tuple[Any, yaml.Node | None]:
    """(data, root node) of a YAML document with no aliases and at most MAX_DEPTH levels, parsed once."""
    if len(text) > MAX_RULES_BYTES:
        raise TesseraError(source, f"placement rules are over {MAX_RULES_BYTES} characters")
    loader = yaml.SafeLoader(text)
    depth = 0
    try:
        # Check the event stream first (iterative: no recursion, no expansion), then compose from the same parser.
        events = []
        while loader.check_event():
            event = loader.get_event()
            if isinstance(event, yaml.AliasEvent):
                raise TesseraError(source, f"YAML aliases (*{event.anchor}) are not allowed in placement rules "
                                           f"(line {event.start_mark.line + 1})")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise TesseraError(source, f"nested deeper than {MAX_DEPTH} levels "
                                               f"(line {event.start_mark.line + 1})")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            events.append(event)
        loader.dispose()
        replay = _Replay(events)
        node = replay.get_single_node()
        data = None if node is None else replay.construct_document(node)
        return data, node
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise TesseraError(source, f"not valid YAML{where}: {getattr(e, 'problem', e)}") from None


class _Replay(yaml.composer.Composer, yaml.constructor.SafeConstructor, yaml.resolver.Resolver):
    """Composes and constructs from events already checked (the text is parsed once)."""

    def __init__(self, events: list):
        self._events = events
        self._pos = 0
        yaml.composer.Composer.__init__(self)
        yaml.constructor.SafeConstructor.__init__(self)
        yaml.resolver.Resolver.__init__(self)

    def check_event(self, *choices):
        if self._pos >= len(self._events):
            return False
        return not choices or isinstance(self._events[self._pos], choices)

    def peek_event(self):
        return self._events[self._pos]

    def get_event(self):
        event = self._events[self._pos]
        self._pos += 1
        return event


def compile_name_pattern(pattern: Any, where: str):
    """An RE2 pattern (search semantics as Python's re.search); constructs RE2 lacks (backreferences, lookaround)
    are named."""
    text = str(pattern)
    if len(text) > MAX_PATTERN_CHARS:
        raise TesseraError(where, f"match.name is {len(text)} characters; the limit is {MAX_PATTERN_CHARS}")
    options = re2.Options()
    options.log_errors = False  # the error comes back as a named error, not a line on stderr
    try:
        return re2.compile(text, options)
    except re2.error as e:
        why = e.args[0].decode("utf-8", "replace") if e.args and isinstance(e.args[0], bytes) else str(e)
        raise TesseraError(where, f"match.name {text!r} is not a valid regular expression ({why}); rules are matched "
                                  "by RE2 in linear time, without backreferences or lookaround") from None
