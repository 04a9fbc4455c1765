import pytest
import torch

from optbench.measure import memory
from optbench.measure.memory import peak_memory

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

MIB = 1 << 20


def _allocate_64mib() -> torch.Tensor:
    x = torch.ones(64 * MIB // 4, dtype=torch.float32)  # 64 MiB, freed on return
    return x.sum()


def test_cpu_peak_of_a_known_allocation():
    peak = peak_memory(_allocate_64mib)
    assert 64 * MIB <= peak < 128 * MIB


def test_cpu_peak_counts_only_what_the_call_allocates():
    kept = torch.ones(64 * MIB // 4)  # allocated before the call: not part of its peak
    assert peak_memory(lambda: kept.add_(1)) < MIB


def test_cpu_falls_back_to_max_rss_when_events_are_unreadable(monkeypatch):
    monkeypatch.setattr(memory, "_profiled_peak", lambda prof: None)
    peak = peak_memory(_allocate_64mib)
    assert isinstance(peak, int) and peak >= 0


def test_unsupported_device_raises():
    with pytest.raises(ValueError, match="meta"):
        peak_memory(lambda: None, device="meta")


@pytest.mark.gpu
@needs_cuda
def test_cuda_peak_of_a_known_allocation():
    peak = peak_memory(lambda: torch.ones(64 * MIB // 4, device="cuda").sum(), device="cuda")
    assert 64 * MIB <= peak < 128 * MIB
