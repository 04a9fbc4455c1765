"""A portable compile cache: inductor's and Triton's cache folders, packed by one run and restored
by the next on any machine of the same GPU, torch, Triton and CUDA versions.

A run's compile caches live in ``.cache/inductor`` and ``.cache/triton``
(``optbench.cli.bench_env``). After a GPU run, ``pack`` writes them to
``<out>/compile-cache/<key>.tar.xz``; ``nox -s compile_cache -- <file>...`` keeps them in
``.compile-cache/`` of the checkout, which the offline runner recipe carries like the wheelhouse;
before the next run ``restore`` unpacks the one whose key is this machine's. The key names
everything the cached artifacts depend on: GPU model, torch, Triton and CUDA versions. What a run
started from is recorded in its machine record (``info.compile_cache``: ``cold`` or ``restored
<key>``), so a figure says whether its compile times are cold.

    python3 -m optbench.run.compile_cache key|restore|pack [--out DIR]
"""

from __future__ import annotations

import argparse
import re
import sys
import tarfile
from pathlib import Path

from optbench.run.helptext import plain
from optbench.store.store import REPO_ROOT

CACHE_ROOT = REPO_ROOT / ".cache"  # holds inductor/ and triton/ during a run
CARRIED = REPO_ROOT / ".compile-cache"  # packed caches, one per key
FOLDERS = ("inductor", "triton")
# xz at its fastest preset: inductor's and Triton's files repeat one another across files, which
# gzip's 32 KiB window does not reach; a third of gzip's size, under what a lent call carries
SUFFIX, XZ_PRESET = ".tar.xz", 1


def cache_key() -> str:
    """'<gpu>-torch<version>-triton<version>-cuda<version>' of this machine, lower case, runs of
    anything but letters, digits, '.' and '_' as one '-' (torch 2.11.0+cu130: torch2.11.0-cu130)."""
    import torch

    from optbench.measure.machine import machine_info

    info = machine_info()
    gpu = info["gpu_name"] or "cpu"
    text = f"{gpu}-torch{torch.__version__}-triton{info['triton']}-cuda{torch.version.cuda}"
    # letters, digits, . _ - only: a portable name
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-")


COLD = "cold"  # info.compile_cache of a run that started without any compile cache


def holds_caches(root: Path = CACHE_ROOT) -> bool:
    """Whether ``root`` holds any compile cache (a file or folder in one of :data:`FOLDERS`)."""
    return any((root / f).is_dir() and any((root / f).iterdir()) for f in FOLDERS)


def restore(key: str, carried: Path = CARRIED, root: Path = CACHE_ROOT) -> str:
    """Unpack ``<carried>/<key>.tar.xz`` into ``root``; 'restored <key>', or 'cold' where there is
    none (or ``root`` already holds caches: a warm machine keeps its own, and the run says so:
    'local')."""
    if holds_caches(root):
        return "local"
    packed = carried / f"{key}{SUFFIX}"
    if not packed.is_file():
        return COLD
    root.mkdir(parents=True, exist_ok=True)
    with tarfile.open(packed) as tar:
        tar.extractall(root, filter="data")
    return f"restored {key}"


def pack(key: str, out: Path, root: Path = CACHE_ROOT) -> Path | None:
    """``root``'s cache folders as ``<out>/<key>.tar.xz``; None where there is nothing to pack."""
    present = [f for f in FOLDERS if (root / f).is_dir()]
    if not present:
        return None
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{key}{SUFFIX}"
    with tarfile.open(path, "w:xz", preset=XZ_PRESET) as tar:
        for folder in present:
            tar.add(root / folder, arcname=folder)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python3 -m optbench.run.compile_cache", description=plain(__doc__.split("\n\n")[0])
    )
    p.add_argument("action", choices=["key", "restore", "pack"])
    p.add_argument("--out", type=Path, help="pack: the folder to write <key>.tar.xz into")
    args = p.parse_args(argv)
    key = cache_key()
    if args.action == "key":
        print(key)
    elif args.action == "restore":
        print(restore(key))
    else:
        if args.out is None:
            p.error("pack needs --out")
        path = pack(key, args.out)
        print(path or "nothing to pack")
    return 0


if __name__ == "__main__":
    sys.exit(main())
