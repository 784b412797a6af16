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


class _Hang(BaseException):
    pass


def _alarm(signum, frame):
    raise _Hang()


def _classify(case: Case) -> tuple[str, str]:
    """Runs one case under SIGALRM after `case.seconds` (a blocking open of a FIFO, a runaway loop: a hang)."""
    import math
    import signal

    from tessera.engine.errors import TesseraError

    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(max(1, math.ceil(case.seconds)))
    try:
        ok = case.run()
    except _Hang:
        return "hang", f"past {case.seconds} s"
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
    finally:
        signal.alarm(0)
    return ("correct", "") if ok else ("silently wrong", "the result differs from the reference")


def corpus_main(cases: Callable[[], dict[str, Case]], work: Path) -> None:
    """A corpus module's `__main__`: run its cases in this child, then remove its scratch folder and exit 0."""
    import shutil

    try:
        child_main(cases)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    sys.exit(0)


def child_main(cases: Callable[[], dict[str, Case]]) -> None:
    import threading

    only = set(sys.argv[1:])
    table = cases()
    print(json.dumps({"all": list(table)}), flush=True)
    for name, case in table.items():
        if only and name not in only:
            continue
        print(json.dumps({"case": name, "start": True}), flush=True)
        t0 = time.monotonic()

        def watchdog(name=name, case=case) -> None:  # stuck in native code the alarm cannot interrupt
            print(json.dumps({"case": name, "verdict": "hang", "detail": f"past {case.seconds} s (watchdog)",
                              "seconds": case.seconds}), flush=True)
            os._exit(3)

        dog = threading.Timer(case.seconds + 5, watchdog)
        dog.daemon = True
        dog.start()
        verdict, detail = _classify(case)
        dog.cancel()
        print(json.dumps({"case": name, "verdict": verdict, "detail": detail,
                          "seconds": round(time.monotonic() - t0, 3)}), flush=True)


def run_corpus(module_path: str | Path, timeout: float, env: dict | None = None,
               only: list[str] | None = None) -> dict[str, tuple[str, str]]:
    """Runs a corpus module in a child; {case: (verdict, detail)}. The case running when the child died is a crash
    (killed by a signal or exited early) or a hang (its own limit, or `timeout` for the whole child); the child is
    then started again for the cases left."""
    here = Path(module_path).resolve().parent
    full_env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + str(here), **(env or {})}
    results: dict[str, tuple[str, str]] = {}
    todo = list(only or [])
    deadline = time.monotonic() + timeout
    while True:
        out, err, rc, hung = _run_child(module_path, todo, full_env, max(1.0, deadline - time.monotonic()))
        names: list[str] = []
        running = None
        for line in out.splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                continue
            if not isinstance(rec, dict):
                continue
            if "all" in rec:
                names = [n for n in rec["all"] if not only or n in only]
            elif rec.get("start"):
                running = rec["case"]
            elif "case" in rec:
                results[rec["case"]] = (rec["verdict"], rec["detail"])
                running = None
        if running is not None:
            results[running] = ("hang", f"past {timeout} s") if hung else ("crash", f"exit {rc}: {err[-400:]}")
        elif rc != 0 and not names:
            results["<corpus>"] = ("hang" if hung else "crash", err[-400:])
        todo = [n for n in names if n not in results]
        if not todo or rc == 0 or time.monotonic() >= deadline:
            for n in todo:
                results[n] = ("hang", "not reached before the corpus's time limit")
            return results


def _run_child(module_path, todo: list[str], env: dict, timeout: float) -> tuple[str, str, int | None, bool]:
    cmd = [sys.executable, str(Path(module_path).resolve()), *todo]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO)
        return proc.stdout, proc.stderr, proc.returncode, False
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = e.stderr.decode() if isinstance(e.stderr, bytes) else (e.stderr or "")
        return out, err, None, True


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
