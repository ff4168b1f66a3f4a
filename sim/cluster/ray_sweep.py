#!/usr/bin/env python3
"""Run a `dstwin sweep` on a Ray cluster: one Ray task per shard, merged into one study.

Each task runs `dstwin sweep ARGS --shard K/N` in a directory of its own and returns the
shard's sweep.csv; the driver writes the shards under OUT/shards/ and merges them with
`dstwin report --merge`, which writes OUT/sweep.csv, the fronts, plots and summary.md exactly
as the sweep on one machine writes them (the shards are disjoint; the merge restores grid
order).

    python3 sim/cluster/ray_sweep.py --shards 8 --out study -- \\
        sim/scenarios/a3-2p1d.toml --vary decode.max_num_seqs=16..64:16 --vary mtp.tokens=0..3

Ray: `--address auto` joins a running cluster (`ray start --head` on one node, `ray start
--address HEAD:6379` on the others); without --address a local Ray instance is started. The
dstwin binary and the scenario (with any file it names) must be at the same paths on every
node: a shared filesystem or the same container image.
"""

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import ray


def sweep_shard(dstwin, args, k, n, jobs):
    """Runs shard k of n; returns its sweep.csv bytes (or raises with dstwin's message)."""
    with tempfile.TemporaryDirectory(prefix=f"dstwin-shard-{k}-") as d:
        cmd = [dstwin, "sweep", *args, "--shard", f"{k}/{n}", "--out", d, "--quiet",
               "--jobs", str(jobs)]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0:
            raise RuntimeError(
                f"shard {k}/{n}: `{' '.join(cmd)}` exited {p.returncode}:\n{p.stderr.strip()}"
            )
        return Path(d, "sweep.csv").read_bytes()


def main():
    ap = argparse.ArgumentParser(
        description="Run a dstwin sweep's shards as Ray tasks and merge them.",
        epilog="Everything after -- is passed to `dstwin sweep` (scenario and --vary axes).",
    )
    ap.add_argument("--shards", type=int, required=True, help="number of shards (Ray tasks)")
    ap.add_argument("--out", required=True, help="directory of the merged study")
    ap.add_argument("--dstwin", default="dstwin", help="the dstwin binary (same path on every node)")
    ap.add_argument("--address", default=None,
                    help="Ray cluster to join (e.g. auto); default: start a local instance")
    ap.add_argument("--cpus-per-shard", type=int, default=1,
                    help="CPUs each task reserves and the sweep's --jobs (default 1)")
    ap.add_argument("sweep_args", nargs=argparse.REMAINDER)
    a = ap.parse_args()
    args = a.sweep_args[1:] if a.sweep_args[:1] == ["--"] else a.sweep_args
    if a.shards < 1:
        ap.error(f"--shards {a.shards}: give at least 1")
    if not args:
        ap.error("give the sweep's scenario and axes after --")
    for flag in ("--shard", "--out"):
        if flag in args:
            ap.error(f"{flag} is set by the driver; leave it out of the sweep arguments")
    dstwin = os.path.abspath(a.dstwin) if os.path.sep in a.dstwin else a.dstwin
    # Relative paths in the sweep's arguments are resolved here, so that tasks running in
    # other directories (or on other nodes with the same tree) find them.
    args = [os.path.abspath(x) if not x.startswith("-") and os.path.exists(x) else x for x in args]

    ray.init(address=a.address, include_dashboard=False, log_to_driver=False)
    task = ray.remote(num_cpus=a.cpus_per_shard)(sweep_shard)
    futures = [task.remote(dstwin, args, k, a.shards, a.cpus_per_shard) for k in range(a.shards)]
    out = Path(a.out)
    shards = out / "shards"
    shards.mkdir(parents=True, exist_ok=True)
    files = []
    for k, f in enumerate(futures):
        csv = ray.get(f)
        p = shards / f"shard-{k}-of-{a.shards}.csv"
        p.write_bytes(csv)
        files.append(str(p))
        print(f"shard {k + 1}/{a.shards} done", file=sys.stderr)
    ray.shutdown()
    p = subprocess.run([dstwin, "report", "--merge", *files, "--out", str(out)])
    sys.exit(p.returncode)


if __name__ == "__main__":
    main()
