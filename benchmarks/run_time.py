"""Wall time of `privacylab run` at a base revision against the working tree, on this machine.

The peer is privacylab itself at `--base` (default 40e5e0e, before issue 10): a git worktree of
that revision is made in a temporary folder and both versions run `privacylab run [--quick]`
with fresh caches, alternately, `--repeat` times each, one at a time. Prints each time, the
medians and the ratio after/before (< 1: faster now). Never run as a test.

    python benchmarks/run_time.py --quick --repeat 3
    python benchmarks/run_time.py --full --repeat 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _run(src: Path, out: Path, quick: bool) -> float:
    env = {**os.environ, "PYTHONPATH": str(src)}
    args = [sys.executable, "-c", "from privacylab.cli import app; app(prog_name='privacylab')"]
    args += ["run", "--out", str(out), *(["--quick"] if quick else [])]
    start = time.perf_counter()
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="40e5e0e", help="git revision to compare against")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--quick", dest="quick", action="store_true", default=True)
    size.add_argument("--full", dest="quick", action="store_false")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--json", action="store_true")
    options = parser.parse_args()
    times: dict[str, list[float]] = {"before": [], "after": []}
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp) / "base"
        subprocess.run(
            ["git", "-C", str(ROOT), "worktree", "add", "--detach", str(base), options.base],
            check=True,
            capture_output=True,
        )
        try:
            for i in range(options.repeat):
                for name, src in (("before", base / "src"), ("after", ROOT / "src")):
                    seconds = _run(src, Path(tmp) / f"{name}-{i}", options.quick)
                    times[name].append(seconds)
                    print(f"{name} run {i + 1}: {seconds:.1f} s", file=sys.stderr)
        finally:
            subprocess.run(
                ["git", "-C", str(ROOT), "worktree", "remove", "--force", str(base)],
                capture_output=True,
            )
    before, after = statistics.median(times["before"]), statistics.median(times["after"])
    result = {
        "base": options.base,
        "mode": "quick" if options.quick else "full",
        "seconds": times,
        "median_before": before,
        "median_after": after,
        "ratio_after_over_before": after / before,
    }
    if options.json:
        print(json.dumps(result))
    else:
        print(
            f"privacylab run{' --quick' if options.quick else ''}: {options.base} median "
            f"{before:.1f} s, working tree median {after:.1f} s, ratio {after / before:.3f}"
        )


if __name__ == "__main__":
    main()
