"""What machine a number was measured on: every run summary and benchmark JSON records it (CPUs of one kind
differ by ~3x in speed, so a time is meaningless without it)."""
from __future__ import annotations

import os
import platform
from functools import lru_cache


@lru_cache(maxsize=1)
def cpu_model() -> str:
    """The CPU model name as `lscpu` prints it ('Model name'), e.g. 'AMD EPYC'; platform.processor() otherwise."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine_info() -> dict[str, object]:
    """{'cpu_model', 'cpus'} for summaries and benchmark files."""
    return {"cpu_model": cpu_model(), "cpus": os.cpu_count()}
