import re
import subprocess
from types import SimpleNamespace

import pytest
import torch

from optbench.measure import machine
from optbench.measure.machine import machine_info, machine_name

KEYS = {
    "gpu_name",
    "gpu_count",
    "gpu_uuid",
    "driver",
    "cuda",
    "torch",
    "triton",
    "python",
    "cpu",
    "num_cpu",
    "ram_gb",
    "os",
    "hostname",
    "host_id",
    "profile",
    "sm_clock_mhz",
    "mem_clock_mhz",
    "date",
    "compile_cache",
    "runs_at_once",
    "interconnect",
}


def test_machine_info_without_gpu_or_nvidia_smi(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    info = machine_info()
    assert set(info) == KEYS
    assert info["gpu_name"] is None and info["gpu_count"] == 0 and info["driver"] is None
    assert info["sm_clock_mhz"] is None and info["mem_clock_mhz"] is None
    assert info["profile"] == "cpu" and info["interconnect"] is None
    assert info["torch"] == torch.__version__ and info["num_cpu"] >= 1
    assert info["date"].endswith("+00:00")


def test_the_machine_record_says_how_many_runs_measured_on_the_host_at_once(monkeypatch):
    """A shard of ``run --gpus`` (OPTBENCH_RUNS_AT_ONCE, set by run_on_gpus) says that the others
    shared the host with it; a run alone says 1."""
    monkeypatch.delenv("OPTBENCH_RUNS_AT_ONCE", raising=False)
    assert machine_info()["runs_at_once"] == 1
    monkeypatch.setenv("OPTBENCH_RUNS_AT_ONCE", "4")
    assert machine_info()["runs_at_once"] == 4


def _fake_gpu(monkeypatch, smi_stdout: str | None):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(
        torch.cuda, "get_device_properties", lambda device=None: SimpleNamespace(uuid="bbb")
    )
    monkeypatch.setattr(machine, "_torch_driver", lambda: "cuda-driver 13.0")
    monkeypatch.setattr(
        machine.shutil, "which", lambda name: None if smi_stdout is None else "/bin/nvidia-smi"
    )

    def run(cmd, **kwargs):
        assert cmd[0] == "/bin/nvidia-smi"
        return subprocess.CompletedProcess(cmd, 0, stdout=smi_stdout, stderr="")

    monkeypatch.setattr(machine.subprocess, "run", run)


def test_machine_info_reads_nvidia_smi_for_cuda_device_0(monkeypatch):
    _fake_gpu(monkeypatch, "GPU-aaa, 580.1, 345, 2619\nGPU-bbb, 580.1, 1980, [N/A]\n")
    info = machine_info()
    assert info["gpu_name"] == "NVIDIA H100 80GB HBM3" and info["gpu_count"] == 8
    assert info["profile"] == "h100-sxm"
    assert info["driver"] == "580.1" and info["gpu_uuid"] == "GPU-bbb"
    assert info["sm_clock_mhz"] == 1980 and info["mem_clock_mhz"] is None


def test_machine_info_with_gpu_but_no_nvidia_smi(monkeypatch):
    _fake_gpu(monkeypatch, None)
    info = machine_info()
    assert info["driver"] == "cuda-driver 13.0"
    assert info["sm_clock_mhz"] is None and info["mem_clock_mhz"] is None


def test_machine_info_survives_failing_nvidia_smi(monkeypatch):
    _fake_gpu(monkeypatch, "")

    def fail(cmd, **kwargs):
        raise subprocess.CalledProcessError(9, cmd)

    monkeypatch.setattr(machine.subprocess, "run", fail)
    assert machine_info()["sm_clock_mhz"] is None


@pytest.mark.parametrize(
    "gpu, cpu, name",
    [
        ("NVIDIA H100 80GB HBM3", "x", "h100-sxm"),
        ("Tesla T4", "x", "t4"),
        ("NVIDIA L4", "x", "nvidia-l4"),
        (None, "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz", "cpu-intel-xeon-platinum-8375c"),
        (None, "AMD EPYC 7763 64-Core Processor", "cpu-amd-epyc-7763"),
        (None, "", "cpu-unknown"),
    ],
)
def test_machine_name(gpu, cpu, name):
    assert machine_name({"gpu_name": gpu, "cpu": cpu}) == name


def test_machine_name_is_short_for_long_cpu_models():
    name = machine_name(
        {"gpu_name": None, "cpu": "Some Vendor Extremely Long Model Name With Many Words 9000"}
    )
    assert name.startswith("cpu-some-vendor") and len(name) <= 36 and not name.endswith("-")


def test_machine_name_when_emulating():
    info = {"gpu_name": "NVIDIA H100 80GB HBM3", "cpu": "x"}
    assert machine_name(info, emulate="t4") == "h100-sxm-emulating-t4"
    with pytest.raises(KeyError):
        machine_name(info, emulate="v100")


def test_two_hosts_with_one_cpu_model_get_two_names(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(machine.shutil, "which", lambda name: None)
    monkeypatch.setattr(machine, "_cpu_model", lambda: "AMD EPYC 7763 64-Core Processor")
    names = []
    for host in ("a", "b"):
        (tmp_path / host).write_text(f"{host * 32}\n")
        monkeypatch.setattr(
            machine, "MACHINE_ID_FILES", (str(tmp_path / "none"), str(tmp_path / host))
        )
        names += [machine_name(), machine_name()]  # stable on one host
    assert names[0] == names[1] != names[2] == names[3]
    assert all(re.fullmatch(r"cpu-amd-epyc-7763-[0-9a-f]{6}", name) for name in names)
    # without a machine id, the host's name tells hosts apart
    monkeypatch.setattr(machine, "MACHINE_ID_FILES", (str(tmp_path / "none"),))
    by_hostname = set()
    for host in ("vm1", "vm2"):
        monkeypatch.setattr(machine.socket, "gethostname", lambda host=host: host)
        by_hostname.add(machine_name())
    assert len(by_hostname) == 2 and not by_hostname & set(names)


def test_a_gpu_machine_keeps_its_profile_key_on_every_host():
    for host_id in ("aaaaaa", "bbbbbb"):
        info = {"gpu_name": "NVIDIA H100 80GB HBM3", "cpu": "AMD EPYC", "host_id": host_id}
        assert machine_name(info) == "h100-sxm"


def test_machine_name_of_this_machine():
    assert machine_name() == machine_name(machine_info())


def test_gpu_state_reads_clock_power_heat_and_clock_events(monkeypatch):
    monkeypatch.setattr(machine, "_nvml_device", lambda: None)  # no NVML: nvidia-smi's fields
    monkeypatch.setattr(
        machine,
        "_nvidia_smi",
        lambda fields: ["1695", "690.12", "47", "0x0000000000000004", "702.5"],
    )
    assert machine.gpu_state() == {
        "sm_clock_mhz": 1695,
        "power_w": 690.12,
        "temperature_c": 47,
        "clock_events": "0x0000000000000004",
        "power_instant_w": 702.5,
    }
    monkeypatch.setattr(
        machine, "_nvidia_smi", lambda fields: ["[N/A]", "[N/A]", "47", "[N/A]", "[N/A]"]
    )
    assert machine.gpu_state()["sm_clock_mhz"] is None
    # an older nvidia-smi without power.draw.instant fails the query that names it: the rest is
    # still read
    old_smi = {
        "clocks.sm": "1410",
        "power.draw": "250.5",
        "temperature.gpu": "60",
        "clocks_event_reasons.active": "0x0000000000000000",
    }
    monkeypatch.setattr(
        machine,
        "_nvidia_smi",
        lambda fields: None if "power.draw.instant" in fields else [old_smi[f] for f in fields],
    )
    assert machine.gpu_state() == {
        "sm_clock_mhz": 1410,
        "power_w": 250.5,
        "temperature_c": 60,
        "clock_events": "0x0000000000000000",
        "power_instant_w": None,
    }
    monkeypatch.setattr(machine, "_nvidia_smi", lambda fields: None)
    assert machine.gpu_state() is None


TOPO_NVSWITCH = """\
\x1b[4mGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\x1b[0m
GPU0\t X \tNV18\tPXB\t0-47\t0\t\tN/A
GPU1\tNV18\t X \tSYS\t0-47\t0\t\tN/A
NIC0\tPXB\tSYS\t X

Legend:
  X    = Self
  NV#  = Connection traversing a bonded set of # NVLinks
"""
TOPO_PCIE = """\
\tGPU0\tGPU1\tGPU2\tCPU Affinity
GPU0\t X \tPIX\tSYS\t0-15
GPU1\tPIX\t X \tSYS\t0-15
GPU2\tSYS\tSYS\t X \t16-31
"""


def test_interconnect_is_the_slowest_link_between_gpus():
    # the NIC's PXB/SYS links are not between GPUs
    assert machine.interconnect(TOPO_NVSWITCH) == "NV18"
    assert machine.interconnect(TOPO_PCIE) == "SYS"
    assert machine.interconnect("GPU0\t X \t0-15\n") is None  # one GPU
    assert machine.interconnect("garbage") is None


def test_machine_info_reads_the_interconnect_with_several_gpus(monkeypatch):
    _fake_gpu(monkeypatch, "GPU-bbb, 580.1, 1980, 2619\n")
    monkeypatch.setattr(machine, "interconnect", lambda: "NV18")
    assert machine_info()["interconnect"] == "NV18"
