"""Every registered backend obeys the backend contract; discovery reports this host."""

import pytest

from argosy.hardware.backends import AcceleratorBackend, Device, backends
from argosy.hardware.discovery import discover
from argosy.plugins.registry import Registry


@pytest.mark.parametrize("name", list(backends))
def test_backend_contract(name: str) -> None:
    backend = backends.get(name)()
    assert isinstance(backend, AcceleratorBackend)
    assert backend.name == name
    detected = backend.detect()
    assert isinstance(detected, bool)
    if detected:
        for device in backend.inventory():
            assert isinstance(device, Device) and device.backend == name
            assert device.memory_gib >= 0


def test_cpu_is_reported_when_no_accelerator_is_found() -> None:
    registry: Registry[type] = Registry("accelerator backend")

    class Absent:
        name = "absent"

        def detect(self) -> bool:
            return False

        def inventory(self) -> list[Device]:
            raise AssertionError("inventory of an undetected backend must not be taken")

    registry.register("absent", Absent)
    registry.register("cpu", backends.get("cpu"))
    found = discover(registry)
    assert [d.backend for d in found] == ["cpu"]
    assert found[0].catalog_id == "cpu" and found[0].memory_gib > 0
    assert int(found[0].details["cores"]) >= 1


def test_accelerators_come_before_the_cpu() -> None:
    registry: Registry[type] = Registry("accelerator backend")

    class Fake:
        name = "fake"

        def detect(self) -> bool:
            return True

        def inventory(self) -> list[Device]:
            return [Device(backend="fake", index=0, name="NVIDIA H100 80GB HBM3", memory_gib=79.1)]

    registry.register("fake", Fake)
    registry.register("cpu", backends.get("cpu"))
    assert [d.backend for d in discover(registry)] == ["fake"]
    assert [d.backend for d in discover(registry, include_cpu=True)] == ["fake", "cpu"]
