"""The portable compile cache: packed by one run, restored by the next of the same key, and what a
run started from is said (cold, restored, local)."""

from __future__ import annotations

from optbench.run import compile_cache as C


def _fill(root, name="kernel.cubin", data=b"x"):
    for folder in C.FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)
        (root / folder / name).write_bytes(data)


def test_pack_then_restore_on_a_fresh_machine(tmp_path):
    used, fresh, carried = tmp_path / "used", tmp_path / "fresh", tmp_path / "carried"
    _fill(used, data=b"compiled")
    packed = C.pack("h100-torch2.11", carried, used)
    assert packed == carried / "h100-torch2.11.tar.xz"
    assert C.restore("h100-torch2.11", carried, fresh) == "restored h100-torch2.11"
    assert all((fresh / f / "kernel.cubin").read_bytes() == b"compiled" for f in C.FOLDERS)


def test_another_key_starts_cold_and_a_warm_machine_keeps_its_own(tmp_path):
    used, carried = tmp_path / "used", tmp_path / "carried"
    _fill(used)
    C.pack("h100-torch2.11", carried, used)
    # another GPU: nothing restored
    assert C.restore("h200-torch2.11", carried, tmp_path / "fresh") == "cold"
    assert not (tmp_path / "fresh").exists()
    # caches already there: left as they are
    assert C.restore("h100-torch2.11", carried, used) == "local"
    assert C.pack("k", tmp_path / "out", tmp_path / "empty") is None


def test_the_machine_record_says_what_the_caches_started_from(monkeypatch):
    from optbench.measure.machine import machine_info

    monkeypatch.setenv("OPTBENCH_COMPILE_CACHE", "restored h100-torch2.11")
    assert machine_info()["compile_cache"] == "restored h100-torch2.11"
    monkeypatch.delenv("OPTBENCH_COMPILE_CACHE")
    assert machine_info()["compile_cache"] == "local"
