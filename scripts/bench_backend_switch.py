"""A backend switch right after a file's first load, as the settings panel makes it (docs/BENCHMARKS.md, session 24).

    .venv/bin/python scripts/bench_backend_switch.py MODEL [--first AMXInt8] [--second AMXBF16] [--rounds 2]
        [--idle] [--threads N]

Each round runs one process: `engine.load(MODEL, backend=FIRST)` with an empty packed-weight cache of its own
(TESSERA_PACK_CACHE_DIR, a temporary folder removed afterwards), then at once `session.set_backend(SECOND)` while the
first load's packs are still being hashed and written behind it (`--idle`: once they are done), then it waits for every
pack write to end. The model file is read into the page cache before each round. Prints one JSON line a round: the load
and switch seconds, seconds until every pack was written, process CPU seconds, layers hashed, and GB read from disk
during the switch (/proc/self/io). Take /tmp/bench.lock around it on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROUND = r"""
import json, resource, sys, time
import tessera.engine.deferred_keys as deferred_keys
from tessera.engine import pack_store, session as S

path, first, second, idle = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"
hashed = []
real_digest = deferred_keys.layer_digest
deferred_keys.layer_digest = lambda *a, **k: hashed.append(1) or real_digest(*a, **k)


def cpu_s():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def disk_read():
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("read_bytes:"))


def packs_written():
    while pack_store.pending_bytes() > 0:
        time.sleep(0.05)
    pack_store.finish_all()


t0 = time.perf_counter()
session = S.load(path, backend=first)
t1 = time.perf_counter()
if idle:
    packs_written()
t2, read0 = time.perf_counter(), disk_read()
session.set_backend(second)
t3, read1 = time.perf_counter(), disk_read()
packs_written()
t4 = time.perf_counter()
print(json.dumps({"first": first, "second": second, "idle": idle, "load_s": round(t1 - t0, 2),
                  "switch_s": round(t3 - t2, 2), "all_written_s": round(t4 - t0, 2), "cpu_s": round(cpu_s(), 1),
                  "layers_hashed": len(hashed), "switch_disk_read_gb": round((read1 - read0) / 1e9, 3)}))
session.close()
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--first", default="AMXInt8", help="the backend of the first load (default AMXInt8)")
    ap.add_argument("--second", default="AMXBF16", help="the backend switched to (default AMXBF16)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--idle", action="store_true", help="switch once the first load's packs are written")
    args = ap.parse_args()
    if not args.model.is_file():
        print(f"{args.model}: no such file", file=sys.stderr)
        return 2
    for _ in range(args.rounds):
        with open(args.model, "rb") as f:  # into the page cache, as a file just downloaded or used is
            while f.read(1 << 24):
                pass
        with tempfile.TemporaryDirectory(prefix="tessera-switch-") as cache:
            env = {**os.environ, "TESSERA_PACK_CACHE_DIR": cache}
            out = subprocess.run([sys.executable, "-c", ROUND, str(args.model), args.first, args.second,
                                  "1" if args.idle else "0"], env=env, capture_output=True, text=True)
            if out.returncode:
                print(out.stderr[-2000:], file=sys.stderr)
                return out.returncode
            line = [ln for ln in out.stdout.splitlines() if ln.startswith("{")][-1]
            print(json.dumps(json.loads(line)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
