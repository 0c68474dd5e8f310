"""How much memory this process may still take, so that export and optimize refuse a model that
would not fit before they start, instead of being killed by the kernel's OOM killer midway.

The limit is the smaller of the system's MemAvailable and what the process's cgroup still allows
(``memory.max`` less the cgroup's usage, v2; ``memory.limit_in_bytes``, v1; page cache that
can be dropped not counted as used), or the OPBRIDGE_MEMORY_LIMIT environment variable (a size
such as ``8G``) when it is set: a test, or someone who knows better, can make it smaller or larger.
"""

from __future__ import annotations

import math
import os

# Overrides the memory this process may take (a size: 8G, 8GiB = 8·2**30 bytes, 8GB = 8·10**9).
ENV = "OPBRIDGE_MEMORY_LIMIT"
# A cgroup limit at or above this is "no limit" (v1 writes 2**63 rounded down to a page).
_UNLIMITED = 1 << 60
# Where the kernel says it (module-level so that a test can point them at files of its own).
PROC_CGROUP = "/proc/self/cgroup"
PROC_MEMINFO = "/proc/meminfo"
CGROUP_ROOT = "/sys/fs/cgroup"

_SIZE_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40,
               "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40,
               "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}


def parse_size(text: str, what: str = "--max-memory") -> int:
    """'8G' / '8GiB' (2**30), '8GB' (10**9), '512M', '1.5g', '1000000' -> bytes; ValueError naming
    ``what`` otherwise."""
    t = str(text).strip().lower().replace(" ", "")
    number = t.rstrip("abcdefghijklmnopqrstuvwxyz")
    unit = t[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in _SIZE_UNITS or not (value > 0) or not math.isfinite(value):
        raise ValueError(f"{what} expects a size such as 8G, 8GiB, 8GB or 512M, got {text!r}")
    return int(value * _SIZE_UNITS[unit])


def _read_int(path: str) -> int | None:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    if text == "max":
        return None
    try:
        return int(text)
    except ValueError:
        return None


def _stat(path: str, key: str) -> int:
    try:
        with open(path) as f:
            for line in f:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_paths() -> dict[str, str]:
    """{"v2": path} and/or {"v1": path} of this process's memory cgroup (/proc/self/cgroup)."""
    out: dict[str, str] = {}
    try:
        with open(PROC_CGROUP) as f:
            for line in f:
                _, controllers, path = line.rstrip("\n").split(":", 2)
                if controllers == "":
                    out["v2"] = path
                elif "memory" in controllers.split(","):
                    out["v1"] = path
    except (OSError, ValueError):
        pass
    return out


def cgroup_available() -> int | None:
    """What this process's memory cgroup still allows (bytes), or None where it sets no limit."""
    paths = _cgroup_paths()
    # Inside a container the cgroup's own folder is usually mounted as the root.
    for version, (base, limit_name, usage_name, inactive) in {
        "v2": (CGROUP_ROOT, "memory.max", "memory.current", "inactive_file"),
        "v1": (os.path.join(CGROUP_ROOT, "memory"), "memory.limit_in_bytes", "memory.usage_in_bytes",
               "total_inactive_file"),
    }.items():
        if version not in paths:
            continue
        for folder in (os.path.join(base, paths[version].lstrip("/")), base):
            limit = _read_int(os.path.join(folder, limit_name))
            usage = _read_int(os.path.join(folder, usage_name))
            if limit is None or usage is None:
                continue
            if limit >= _UNLIMITED:
                break
            used = usage - _stat(os.path.join(folder, "memory.stat"), inactive)
            return max(0, limit - max(0, used))
    return None


def mem_available() -> int | None:
    """MemAvailable of /proc/meminfo (bytes), or None where there is no such file."""
    try:
        with open(PROC_MEMINFO) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def available() -> tuple[int | None, str]:
    """(bytes this process may still take, where that figure comes from); (None, "") where
    nothing says. ValueError naming OPBRIDGE_MEMORY_LIMIT when it is set to something else than a
    size."""
    override = os.environ.get(ENV)
    if override is not None and override.strip():
        return parse_size(override, what=ENV), ENV
    found = [(n, "MemAvailable") for n in [mem_available()] if n is not None]
    found += [(n, "the cgroup's memory limit") for n in [cgroup_available()] if n is not None]
    if not found:
        return None, ""
    return min(found)


def gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"
