"""How fast prepare_model hashes weights: `hub.sha256_of` (sha256 in 1 MiB chunks, one thread), which it runs
on every file of a hub snapshot, beside a plain read of the same file in the same chunks. Each is timed cold
(the file's pages dropped from the page cache first, posix_fadvise DONTNEED: the read comes from the disk)
and warm (the file just read, in the page cache). The bill (`truthflow.weights_cost`) prices prepare_model's
hashing at the cold sha256 rate and a model job's load of its weights at the cold read's.

    python benchmarks/bench_hash.py --mb 512 --record    # writes hash_rate.tsv
    python benchmarks/bench_hash.py --mb 8               # anywhere, a second
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

from truthflow.hub import sha256_of
from truthflow.sizing import write_rows
from truthflow.weights_cost import HASH_COLUMNS, HASH_RATES

CHUNK = 1 << 20  # hub.sha256_of's chunk


def read_all(path: Path) -> int:
    size = 0
    with path.open("rb") as fh:
        while chunk := fh.read(CHUNK):
            size += len(chunk)
    return size


def drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def timed(fn, path: Path, cold: bool) -> float:
    if cold:
        drop_cache(path)
    t0 = time.perf_counter()
    fn(path)
    return time.perf_counter() - t0


def machine() -> str:
    load = os.getloadavg()[0]
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, load {load:.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--mb", type=int, default=512, help="size of the file hashed (MB, 10^6 bytes)")
    ap.add_argument(
        "--dir", type=Path, default=None, help="where to write it (default: the system's temp dir)"
    )
    ap.add_argument("--record", action="store_true", help=f"write {HASH_RATES.name}")
    args = ap.parse_args()
    size = args.mb * 10**6
    rows = []
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "weights.bin"
        block = os.urandom(CHUNK)
        with path.open("wb") as fh:
            for start in range(0, size, CHUNK):
                fh.write(block[: min(CHUNK, size - start)])
            fh.flush()
            os.fsync(fh.fileno())
        # cold first: a warm run before it would leave the pages that fadvise then drops
        for what, fn, cold in (
            ("read cold", read_all, True),
            ("sha256 cold", sha256_of, True),
            ("read warm", read_all, False),
            ("sha256 warm", sha256_of, False),
        ):
            seconds = timed(fn, path, cold)
            rows.append(
                {
                    "what": what,
                    "mb": args.mb,
                    "seconds": f"{seconds:.3f}",
                    "mb_per_s": f"{args.mb / seconds:.0f}",
                    "machine": machine(),
                    "date": datetime.date.today().isoformat(),
                }
            )
            print(f"{what:<12} {args.mb:,} MB in {seconds:6.2f} s: {args.mb / seconds:8,.0f} MB/s")
    if args.record:
        write_rows(HASH_RATES, HASH_COLUMNS, rows)
        print(f"wrote {HASH_RATES}")


if __name__ == "__main__":
    main()
