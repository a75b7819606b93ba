"""CPU package energy through Linux powercap (RAPL): the `EnergyReader` for `hardware.energy`.

Reads `<root>/intel-rapl:<N>/energy_uj` (microjoules, wrapping at `max_energy_range_uj`)
of every top-level zone: one per CPU package (`name` is `package-<k>`), so sub-zones
(core, uncore, dram, which lie inside or beside a package) are not counted twice, and the
platform zone `psys` (which contains the packages) is left out. AMD CPUs expose the same
files under the same names. Since Linux 5.10 `energy_uj` is readable by root only
(CVE-2020-8694); an unreadable file makes the reader unavailable, with that reason.
`root` is a seam: tests pass a temporary tree (`argosy.hardware.fake_energy.FakePowercap`).

    reader = RaplReader()              # EnergyUnavailableError: why not, on this machine
    reader.read()["cpu-package-0"]     # Reading(energy_j=..., wrap_j=...)
"""

from __future__ import annotations

from pathlib import Path

from argosy.hardware.energy import EnergyUnavailableError, Reading

POWERCAP = Path("/sys/class/powercap")


class RaplReader:
    """Package energy counters of every top-level RAPL zone under `root`."""

    name = "rapl"

    def __init__(self, root: Path = POWERCAP) -> None:
        if not root.is_dir():
            raise EnergyUnavailableError(f"{root} does not exist (no powercap driver here)")
        zones = sorted(
            (z for z in root.glob("intel-rapl:*") if z.name.count(":") == 1),
            key=lambda z: int(z.name.split(":")[1]),
        )
        self._zones: dict[str, tuple[Path, float | None]] = {}
        for zone in zones:
            name = _text(zone / "name") or zone.name
            if name == "psys":
                continue
            self._zones[_label(name, zone)] = (zone / "energy_uj", _wrap_j(zone))
        if not self._zones:
            raise EnergyUnavailableError(f"{root} has no RAPL package zone")
        first = next(iter(self._zones.values()))[0]
        try:
            first.read_text()
        except OSError as err:
            why = "root only since Linux 5.10" if isinstance(err, PermissionError) else err
            raise EnergyUnavailableError(f"{first} is not readable ({why})") from err

    def devices(self) -> list[str]:
        return list(self._zones)

    def read(self) -> dict[str, Reading]:
        out = {}
        for device, (path, wrap_j) in self._zones.items():
            text = _text(path)
            if text is None:
                continue  # a failed read leaves a gap
            out[device] = Reading(energy_j=int(text) / 1e6, wrap_j=wrap_j)
        return out

    def close(self) -> None:
        """Nothing to release: the files are opened per read."""


def _label(name: str, zone: Path) -> str:
    if name.startswith("package-"):
        return f"cpu-{name}"
    return f"cpu-{name}-{zone.name.split(':')[1]}"


def _wrap_j(zone: Path) -> float | None:
    text = _text(zone / "max_energy_range_uj")
    return int(text) / 1e6 if text else None


def _text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, ValueError):
        return None
