"""Launch-parameter and layout helpers shared by the Triton kernels of this package."""

from __future__ import annotations

import functools

import torch
import triton

# widest row (elements, padded to a power of two) a program holds in registers
MAX_ROW_BLOCK = 65536
CPU_PROGRAMS = 4  # stands in for the SM count when the interpreter runs kernels on the CPU
REGS_PER_SM = 65536  # 32-bit registers per SM on every NVIDIA GPU since Kepler (Hopper included)


def num_sms(device: torch.device) -> int:
    """Number of streaming multiprocessors of a CUDA device; a small constant elsewhere."""
    if device.type != "cuda":
        return CPU_PROGRAMS
    return _cuda_sms(device.index if device.index is not None else torch.cuda.current_device())


@functools.cache
def _cuda_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


_RESIDENT: dict[tuple, int] = {}


def persistent_programs(
    kernel: triton.JITFunction, n_tasks: int, args: tuple, meta: dict, device: torch.device
) -> int:
    """Grid size for a persistent launch `kernel[(grid,)](*args, **meta)` over n_tasks work items:
    as many programs as can be resident on the GPU at once (limited by the compiled kernel's
    registers and shared memory, and by threads per SM), at most n_tasks. The kernel is compiled
    (warmup) on the first call per configuration; the answer is cached."""
    if device.type != "cuda":
        return max(1, min(n_tasks, CPU_PROGRAMS))
    key = (
        kernel,
        device.index,
        *sorted(meta.items()),
        *(a.dtype for a in args if isinstance(a, torch.Tensor)),
    )
    per_sm = _RESIDENT.get(key)
    if per_sm is None:
        compiled = kernel.warmup(*args, grid=(1,), **meta)
        compiled._init_handles()
        props = torch.cuda.get_device_properties(device)
        threads = 32 * meta["num_warps"]
        # programs per SM: each limit is how many fit in one SM's threads, 32-bit registers and
        # shared memory (the occupancy calculator's three terms, without allocation granularity);
        # the smallest binds
        limits = [
            props.max_threads_per_multi_processor // threads,
            REGS_PER_SM // (max(compiled.n_regs, 1) * threads),
        ]
        if compiled.metadata.shared:
            limits.append(props.shared_memory_per_multiprocessor // compiled.metadata.shared)
        per_sm = _RESIDENT[key] = max(1, min(limits))
    return max(1, min(n_tasks, per_sm * num_sms(device)))


def warps_for(tile: int, per_thread: int = 16) -> int:
    """num_warps giving each thread about `per_thread` elements of a `tile`-element block
    (1..32)."""
    return max(1, min(32, tile // (32 * per_thread)))


def row_tile(n_rows: int, n_cols: int, tile: int, per_thread: int = 16) -> tuple[int, int, int]:
    """(BLOCK_M, BLOCK_N, num_warps) for kernels handling BLOCK_M full rows of n_cols per step.

    BLOCK_N = next_power_of_2(n_cols); BLOCK_M packs several short rows into about `tile`
    elements (one row when n_cols >= tile) and never exceeds the padded row count.
    """
    # power-of-two blocks (tl.arange needs them); the padded columns are masked, so a row of
    # n_cols costs the registers of next_power_of_2(n_cols)
    block_n = triton.next_power_of_2(n_cols)
    if block_n > MAX_ROW_BLOCK:
        raise ValueError(
            f"rows of {n_cols} elements exceed the register-resident limit {MAX_ROW_BLOCK}"
        )
    block_m = max(1, min(tile // block_n, triton.next_power_of_2(max(n_rows, 1))))
    return block_m, block_n, warps_for(block_m * block_n, per_thread)


def unit_last_stride(x: torch.Tensor) -> torch.Tensor:
    """x itself when its last dim is contiguous, else a contiguous copy."""
    return x if x.stride(-1) == 1 else x.contiguous()


def rows_2d(x: torch.Tensor) -> torch.Tensor:
    """x as an (N, H) matrix with unit column stride; a view when the strides allow it, else a
    copy."""
    return unit_last_stride(x.reshape(-1, x.shape[-1]))


def row_grid(x: torch.Tensor) -> tuple[int, int, int, int, int]:
    """(n1, n2, s0, s1, s2): row r of a 4-D x, viewed as (n0, n1, n2, H), starts at element
    (r // (n1*n2))*s0 + (r // n2 % n1)*s1 + (r % n2)*s2. Requires x.stride(-1) == 1."""
    assert x.dim() == 4 and x.stride(-1) == 1
    return x.shape[1], x.shape[2], x.stride(0), x.stride(1), x.stride(2)
