"""The ``machine`` block every bench JSON carries: what ran it, and how loaded it was."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def cpu() -> dict[str, Any]:
    """The CPU's model name and its bfloat16 matrix support (model speeds differ by 2-3x
    between a CPU with AMX and one with AVX512-BF16 alone)."""
    try:
        info = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {}
    model = next((line.split(":", 1)[1].strip() for line in info.splitlines()
                  if line.startswith("model name")), "")
    flags = set(next((line.split(":", 1)[1].split() for line in info.splitlines()
                      if line.startswith("flags")), []))
    return {"cpu_model": model, "bf16": sorted(flags & {"amx_bf16", "avx512_bf16"})}


def machine(load_before: tuple[float, float, float]) -> dict[str, Any]:
    """Platform, CPU (model, bfloat16 support, count) and the 1-minute load average before
    (given) and now."""
    return {
        "platform": platform.platform(),
        "processor": platform.processor(),
        **cpu(),
        "python": platform.python_version(),
        "cpu_count": os.cpu_count(),
        "load_average_1m_before": round(load_before[0], 2),
        "load_average_1m_after": round(os.getloadavg()[0], 2),
    }


def write_report(path: str | Path, report: dict[str, Any]) -> None:
    """Write a bench's JSON report (indented, one trailing newline), making its folder."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")


def tree_rss_mb(pid: int) -> float | None:
    """Resident memory of a process and all its descendants now, in MB (worker processes
    count); None once it has exited."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    own = rss_mb(pid)
    if own is None:
        return None
    todo, total = list(children.get(pid, [])), own
    while todo:
        c = todo.pop()
        total += rss_mb(c) or 0.0
        todo.extend(children.get(c, []))
    return total


def rss_mb(pid: int) -> float | None:
    """A process's resident memory now (``VmRSS``), in MB; None once it has exited."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        return None
    return None
