"""A command's process tree measured while it runs: the summed RSS and PSS of every process
in it, and the bytes it allocates under some directories, sampled on a fixed grid (Linux /proc).

    measurement = measure_command(["python", "prepare.py", ...], [data_dir], log_dir, cwd=root)
    measurement.seconds, measurement.peaks.rss, measurement.disk_left
"""

from __future__ import annotations

import os
import subprocess
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

SAMPLE_SECONDS = 0.2


def tree_pids(root: int) -> list[int]:
    """`root` and every process descended from it, found by parent pid in /proc."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat", "rb") as f:
                stat = f.read()
        except OSError:  # it ended while we looked
            continue
        parent = int(stat.rsplit(b")", 1)[1].split()[1])  # the name, in (), may hold spaces
        children.setdefault(parent, []).append(int(entry.name))
    found, queue = [], [root]
    while queue:
        pid = queue.pop()
        found.append(pid)
        queue += children.get(pid, [])
    return found


def _proc_kb(path: str, key: bytes) -> int:
    """The `key:` line of a /proc file, in bytes; 0 when unreadable (ended, zombie, not ours)."""
    try:
        with open(path, "rb") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def rss_bytes(pid: int) -> int:
    return _proc_kb(f"/proc/{pid}/status", b"VmRSS:")


def pss_bytes(pid: int) -> int:
    return _proc_kb(f"/proc/{pid}/smaps_rollup", b"Pss:")


def disk_bytes(directories: list[Path]) -> int:
    """Bytes allocated (st_blocks * 512) to the files under `directories`; links are not followed."""
    total = 0
    for top in directories:
        for directory, _, names in os.walk(top):
            for name in names:
                try:
                    total += os.lstat(os.path.join(directory, name)).st_blocks * 512
                except OSError:  # removed while we walked
                    pass
    return total


@dataclass
class Peaks:
    rss: int = 0  # bytes, summed over the process tree
    pss: int = 0
    disk: int = 0
    processes: int = 0
    samples: int = 0
    slowest_sample_s: float = 0.0  # how long the longest sample itself took
    timeline: list = field(default_factory=list)  # [seconds, rss, pss, disk] of every sample


class TreeSampler(threading.Thread):
    """Every `interval` seconds: the process tree's summed RSS and PSS, and the disk use, peaks kept."""

    def __init__(self, pid: int, disk_dirs: list[Path], interval: float = SAMPLE_SECONDS):
        super().__init__(daemon=True)
        self.pid, self.disk_dirs, self.interval = pid, disk_dirs, interval
        self.peaks = Peaks()
        self.done = threading.Event()

    def run(self) -> None:
        start = time.perf_counter()
        while True:
            began = time.perf_counter()
            self.sample(round(began - start, 3))
            now = time.perf_counter()
            self.peaks.slowest_sample_s = max(self.peaks.slowest_sample_s, now - began)
            due = start + self.interval * (1 + int((now - start) / self.interval))  # the next tick on the grid
            if self.done.wait(due - now):
                return

    def sample(self, at: float = 0.0) -> None:
        pids = tree_pids(self.pid)
        rss, pss = sum(rss_bytes(pid) for pid in pids), sum(pss_bytes(pid) for pid in pids)
        disk = disk_bytes(self.disk_dirs)
        peaks = self.peaks
        peaks.rss, peaks.pss, peaks.disk = max(peaks.rss, rss), max(peaks.pss, pss), max(peaks.disk, disk)
        peaks.processes = max(peaks.processes, len(pids))
        peaks.samples += 1
        peaks.timeline.append([at, rss, pss, disk])

    def stop(self) -> Peaks:
        self.done.set()
        self.join()
        return self.peaks


@dataclass
class Measurement:
    returncode: int
    seconds: float
    peaks: Peaks = field(default_factory=Peaks)
    disk_left: int = 0  # bytes under the disk directories once the command has ended


def measure_command(
    command: list[str], disk_dirs: list[Path], log_dir: Path, cwd: Path, env: dict | None = None
) -> Measurement:
    """Run `command` in `cwd`, sampling its process tree; its stdout and stderr go to log_dir."""
    log_dir.mkdir(parents=True, exist_ok=True)
    with open(log_dir / "stdout.log", "wb") as out, open(log_dir / "stderr.log", "wb") as err:
        start = time.perf_counter()
        process = subprocess.Popen(command, cwd=cwd, stdout=out, stderr=err, env=env)
        sampler = TreeSampler(process.pid, disk_dirs)
        sampler.start()
        try:
            returncode = process.wait()
        finally:
            if process.poll() is None:  # interrupted: prepare exits at once on SIGTERM
                process.terminate()
                process.wait()
            seconds = time.perf_counter() - start
            peaks = sampler.stop()
    left = disk_bytes(disk_dirs)
    peaks.disk = max(peaks.disk, left)
    return Measurement(returncode, seconds, peaks, left)
