"""fs: engines killed with SIGKILL at random instants, round after round, on one
shared root.

Each round starts three real processes on the same fs root: two chaos writers
(`bench/chaos/child.py`: an fs tier storing random blocks, logging every key the
tier reported stored; both in one namespace, drawing keys from one small space, so
that one often stores a key the other is writing) and `kvtiers bench` (the whole
stack, tiny model, its own namespace), and kills each at its own random instant (a
bench that ends first must exit 0). Then, with nothing running: a tier opened on
the root must serve every block either writer was told was stored, with its bytes;
`kvtiers verify` must find every block good; and `kvtiers inspect`'s usage of each
namespace must equal the bytes of its block files on disk. `longest_wait_s` is the
writers' longest store job (one may wait for the other's write of the same key,
and for a killed writer's)."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from kvtiers.sdk import BlockKey

from bench.chaos import child
from bench.chaos.driver import Driver, open_tier
from bench.chaos.report import Row
from tests.fs.helpers import disk_files

NAME = "fs-engine-kills"
REPO = Path(__file__).resolve().parents[2]
MiB = 1 << 20
#: per namespace; the writer, storing at most RATE blocks a second, never reaches
#: it, so every block it was told was stored must stay
CAPACITY = 512 * MiB
RATE = 200
WRITERS = ("a", "b")  # two writers a round, storing keys of one space of KEY_SPACE
KEY_SPACE = 1000  # (new each round): each often stores a key the other has in flight
SAMPLE = 256  # older blocks checked again after each round but the last
#: rounds, and the window (seconds after start) each process is killed in
PROFILES: dict[str, dict[str, Any]] = {
    "short": {"rounds": 2, "writer_kill": (0.5, 3.0), "bench_kill": (2.0, 7.0)},
    "long": {"rounds": 40, "writer_kill": (0.5, 6.0), "bench_kill": (2.0, 12.0)},
}
BENCH = ["--model", "tiny", "--prefixes", "8", "--prefix-tokens", "128", "--prompt-tokens",
         "32", "--output-tokens", "32", "--turns", "3", "--sessions-in-flight", "4",
         "--no-progress"]


def _kvtiers(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtiers", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=REPO)


def _start(argv: list[str], log: Path) -> subprocess.Popen[bytes]:
    with open(log, "ab") as out:
        return subprocess.Popen(argv, cwd=REPO, stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)


def _kill(proc: subprocess.Popen[bytes]) -> bool:
    """SIGKILL the process group if it still runs; True if it was killed."""
    killed = proc.poll() is None
    if killed:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            killed = False
    proc.wait(30)
    return killed


def _round(rng: random.Random, p: dict[str, Any], root: Path, config: Path, work: Path,
           n: int, row: Row) -> None:
    """Start the writers and the bench, kill each at its instant (or see it end
    well)."""
    procs = []
    for w in WRITERS:
        argv = [sys.executable, "-m", "bench.chaos.child", "--root", str(root),
                "--capacity", str(CAPACITY), "--log", str(work / f"stored{n}-{w}.log"),
                "--seed", str(rng.randrange(1 << 30)), "--blocks-per-s", str(RATE),
                "--key-space", str(KEY_SPACE), "--key-space-seed", f"round-{n}"]
        procs.append((rng.uniform(*p["writer_kill"]), "writer", f"writer-{w}-{n}.out",
                      _start(argv, work / f"writer-{w}-{n}.out")))
    argv = [sys.executable, "-m", "kvtiers", "bench", "--config", str(config),
            "--seed", str(n), "--duration", f"{rng.uniform(1.0, 6.0):.1f}", *BENCH]
    procs.append((rng.uniform(*p["bench_kill"]), "bench", f"bench{n}.out",
                  _start(argv, work / f"bench{n}.out")))
    start = time.monotonic()
    try:
        for at, name, out, proc in sorted(procs, key=lambda t: t[0]):
            time.sleep(max(0.0, at - (time.monotonic() - start)))
            if _kill(proc):
                row.errors[f"{name}:killed"] += 1
            elif proc.returncode != 0:
                row.problems.append(f"round {n}: {name} exited {proc.returncode} "
                                    f"(see {work / out})")
            else:
                row.errors[f"{name}:ended"] += 1
    finally:
        for *_, proc in procs:
            _kill(proc)


def _logged(work: Path, n: int, row: Row) -> list[BlockKey]:
    """The keys the writers of rounds 0..n were told were stored (once each); the
    wrong bytes round n's writers were served, and the writers' longest store, go
    to the row."""
    keys: dict[BlockKey, None] = {}
    for i in range(n + 1):
        for w in WRITERS:
            log = work / f"stored{i}-{w}.log"
            if not log.exists():
                continue
            # the last element is "" or a line the writer did not finish when killed
            for line in log.read_text().split("\n")[:-1]:
                if line.startswith("WAIT "):
                    row.longest_wait_s = max(row.longest_wait_s, float(line.split()[1]))
                elif not line.startswith("WRONG "):
                    keys[BlockKey(bytes.fromhex(line))] = None
                elif i == n:
                    row.wrong_bytes += int(line.split()[2])
                    row.problems.append(f"round {n}: writer {w} was served wrong bytes: "
                                        f"{line}")
    return list(keys)


def _check(root: Path, config: Path, work: Path, n: int, row: Row, rng: random.Random,
           seen: int, last: bool) -> int:
    """The checks after a round, with nothing running on the root: the blocks the
    writer stored in this round and a sample of the older ones (all of them after
    the last round). Returns how many keys the log holds."""
    logged = _logged(work, n, row)
    keys = logged if last else \
        logged[seen:] + rng.sample(logged[:seen], min(SAMPLE, seen))
    tier = open_tier({"type": "fs", "root_dir": str(root), "capacity_bytes": CAPACITY},
                     child.MODEL, child.BLOCK)
    try:
        drive = Driver(tier, row)
        drive.check_all(keys)
        row.blocks_stored = len(logged)
        if tier.stats().usage_bytes > CAPACITY * 0.9:
            row.problems.append("the writer's namespace neared its capacity: evictions by "
                                "policy would count as losses (lower RATE)")
    finally:
        tier.close()
    verify = _kvtiers("verify", str(config), "--json", "--no-progress")
    try:
        report = json.loads(verify.stdout)
    except ValueError:
        report = {"ok": False, "tiers": [{"namespaces": []}]}
    if verify.returncode != 0 or not report["ok"]:
        row.problems.append(f"round {n}: kvtiers verify exited {verify.returncode}: "
                            f"{verify.stdout[-800:]}{verify.stderr[-800:]}")
    inspect = _kvtiers("inspect", str(config), "--json")
    if inspect.returncode != 0:
        row.problems.append(f"round {n}: kvtiers inspect: {inspect.stderr[-800:]}")
        return len(logged)
    row.usage_bytes = row.store_bytes = 0
    for ns in json.loads(inspect.stdout)["tiers"][0]["namespaces"]:
        usage = int(ns["usage_bytes"])
        files = disk_files(root / ns["namespace"])[1]
        row.usage_bytes += usage
        row.store_bytes += files
        if usage != files:
            row.problems.append(f"round {n}: namespace {ns['model']}: usage {usage} B, "
                                f"block files {files} B")
    if last:
        checked = sum(ns["checked"] for ns in report["tiers"][0]["namespaces"])
        row.notes.append(f"kvtiers verify after the last round: {checked} blocks re-read")
    return len(logged)


def run(profile: str, workdir: Path, seed: int) -> list[Row]:
    p = PROFILES[profile]
    row = Row(NAME)
    rng = random.Random(seed)
    work = workdir / "fs-kills"
    root = work / "root"
    root.mkdir(parents=True)
    config = work / "config.json"
    config.write_text(json.dumps({
        "cpu_bytes_to_use": 512 << 10,  # small: the bench's blocks cascade to fs
        "secondary_tiers": [{"type": "fs", "root_dir": str(root), "capacity_bytes": CAPACITY}],
    }))
    seen = 0
    for n in range(p["rounds"]):
        _round(rng, p, root, config, work, n, row)
        seen = _check(root, config, work, n, row, rng, seen, n == p["rounds"] - 1)
        row.rounds += 1
    return [row]
