"""The reliability probe's harness: a corpus of hostile cases run in a child process with a time limit, each case
classified as named error / correct / crash / hang / traceback / silently wrong. Tests fail on anything but the first
two (or on a named error where the case wants the correct result).

A corpus module defines `cases() -> dict[name, Case]` and ends with `if __name__ == "__main__": child_main(cases)`.
The child prints one JSON line per case as it finishes, so a crash or a hang is pinned on the case that was running.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

OK = ("named error", "correct")
REPO = Path(__file__).resolve().parents[2]


@dataclass
class Case:
    """run() returns True when the outcome is right, False when it is silently wrong; a TesseraError it raises is a
    named error (allowed unless `must_succeed`); any other exception is a traceback. `seconds` bounds the case."""

    run: Callable[[], bool]
    must_succeed: bool = False
    seconds: float = 60.0
    named_must_mention: tuple[str, ...] = field(default_factory=tuple)  # words the named error must contain


def _classify(case: Case) -> tuple[str, str]:
    from engine.errors import TesseraError

    try:
        ok = case.run()
    except TesseraError as e:
        text = str(e)
        if case.must_succeed:
            return "silently wrong", f"named error where a correct result was due: {text}"
        missing = [w for w in case.named_must_mention if w.lower() not in text.lower()]
        if missing:
            return "silently wrong", f"named error does not mention {missing}: {text}"
        return "named error", text
    except BaseException as e:  # noqa: BLE001 - classifying is the point
        return "traceback", "".join(traceback.format_exception_only(type(e), e)).strip()[-500:]
    return ("correct", "") if ok else ("silently wrong", "the result differs from the reference")


def child_main(cases: Callable[[], dict[str, Case]]) -> None:
    only = set(sys.argv[1:])
    for name, case in cases().items():
        if only and name not in only:
            continue
        print(json.dumps({"case": name, "start": True}), flush=True)
        t0 = time.monotonic()
        verdict, detail = _classify(case)
        print(json.dumps({"case": name, "verdict": verdict, "detail": detail,
                          "seconds": round(time.monotonic() - t0, 3)}), flush=True)


def run_corpus(module_path: str | Path, timeout: float, env: dict | None = None,
               only: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Runs a corpus module in a child; {case: (verdict, detail)}. The case running when the child died is a crash
    (killed by a signal or exited early) or a hang (past `timeout`)."""
    cmd = [sys.executable, str(module_path), *(only or [])]
    full_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + str(Path(module_path).parent), **(env or {})}
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=full_env, cwd=REPO)
        out, rc, hung = proc.stdout, proc.returncode, False
        err = proc.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        rc, hung = None, True
    results: dict[str, tuple[str, str]] = {}
    running = None
    for line in out.splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if not isinstance(rec, dict) or "case" not in rec:
            continue
        if rec.get("start"):
            running = rec["case"]
        else:
            results[rec["case"]] = (rec["verdict"], rec["detail"])
            running = None
    if running is not None:
        results[running] = ("hang", f"past {timeout} s") if hung else ("crash", f"exit {rc}: {err[-400:]}")
    elif rc not in (0, None) or hung:
        results["<corpus>"] = ("hang" if hung else "crash", err[-400:])
    return results


def assert_all_ok(results: dict[str, tuple[str, str]], expected_cases: int | None = None) -> None:
    bad = {name: v for name, v in results.items() if v[0] not in OK}
    report = "\n".join(f"  {name}: {v[0]}: {v[1]}" for name, v in sorted(results.items()))
    assert not bad, f"{len(bad)} of {len(results)} cases failed:\n{report}"
    if expected_cases is not None:
        assert len(results) == expected_cases, f"{len(results)} of {expected_cases} cases ran:\n{report}"


def can_mount() -> bool:
    """Root with CAP_SYS_ADMIN: tmpfs disks (full, read-only) can be made for real."""
    if os.geteuid() != 0 or sys.platform != "linux":
        return False
    probe = Path(f"/tmp/.tessera-mount-probe-{os.getpid()}")
    probe.mkdir(exist_ok=True)
    try:
        if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(probe)],
                          capture_output=True, timeout=10).returncode != 0:
            return False
        subprocess.run(["umount", str(probe)], capture_output=True, timeout=10)
        return True
    except (OSError, subprocess.TimeoutExpired):
        return False
    finally:
        probe.rmdir()


class Tmpfs:
    """A tmpfs of `size` at `path` (made by the caller) while in the `with`; `readonly()` remounts it read-only."""

    def __init__(self, path: Path, size: str):
        self.path, self.size = Path(path), size

    def __enter__(self) -> Tmpfs:
        self.path.mkdir(parents=True, exist_ok=True)
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={self.size}", "tmpfs", str(self.path)], check=True,
                       timeout=10, capture_output=True)
        return self

    def readonly(self) -> None:
        subprocess.run(["mount", "-o", "remount,ro", str(self.path)], check=True, timeout=10, capture_output=True)

    def __exit__(self, *exc) -> None:
        subprocess.run(["umount", "-l", str(self.path)], timeout=10, capture_output=True)
