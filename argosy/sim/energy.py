"""Energy of a simulated run: per-chip power from the catalog, over where device-time went.

Each chip pool's owned device-seconds are split by `argosy.sim.idle` into allocated and
idle categories; a device draws its board power (the catalog's `tdp_w`, sourced per
chip) while allocated, and `SimConfig.idle_power_fraction` of it otherwise (an
assumption, stated as such: an idle H100 SXM draws about a tenth of its 700 W). The
facility adds PUE (configured, not simulated). What the run bought with that energy is
the ledger's delivered model FLOPs (`argosy.sim.ledger`), so policies compare on the
same footing:

    energy_report(idle_seconds, ledger, idle_fraction=0.1, pue=1.2)
    # {"it_energy_mwh": ..., "facility_energy_mwh": ..., "joules_per_pflop": ...,
    #  "useful_share": ..., "per_chip": {...}, "how": "..."}

`useful_share` is the IT energy drawn by productive device-time (the ledger's productive
share of allocated time) over all the IT energy: the energy factor of the five-factor
equation, before PUE.
"""

from __future__ import annotations

from argosy.hardware.catalog import default_catalog

J_PER_MWH = 3.6e9


def energy_report(
    idle_seconds: dict[str, dict[str, float]], ledger, *, idle_fraction: float, pue: float
) -> dict:
    """IT and facility energy of the run, joules per delivered PFLOP, the useful share."""
    catalog = default_catalog()
    per_chip: dict[str, dict[str, float]] = {}
    busy_j = total_j = 0.0
    for chip, row in idle_seconds.items():
        tdp = catalog.get(chip).tdp_w
        allocated = row.get("allocated", 0.0)
        idle = sum(v for k, v in row.items() if k != "allocated")
        busy = allocated * tdp
        rest = idle * tdp * idle_fraction
        per_chip[chip] = {"tdp_w": tdp, "allocated_mwh": busy / J_PER_MWH,
                          "idle_mwh": rest / J_PER_MWH}  # fmt: skip
        busy_j += busy
        total_j += busy + rest
    factors = ledger.factors()
    productive = factors["effective_training_time"]  # productive / allocated, peak-weighted
    delivered = ledger.delivered
    return {
        "it_energy_mwh": total_j / J_PER_MWH,
        "facility_energy_mwh": total_j * pue / J_PER_MWH,
        "joules_per_pflop": total_j * pue / (delivered / 1e15) if delivered > 0 else 0.0,
        "useful_share": busy_j * productive / total_j if total_j > 0 else 0.0,
        "per_chip": per_chip,
        "how": f"catalog board power (tdp_w) while allocated, {idle_fraction:g} x it while "
        f"idle (assumed), x PUE {pue:g} (configured) for the facility; per delivered model "
        "PFLOP of the ledger",
    }
