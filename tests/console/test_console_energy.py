"""The energy page in a real headless Chromium against a real `argosy server`: a metered
attempt (written into the server's store as its control loop would) is charted as average
power over time, with the energy factor, and the page runs without a script error."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from console_helpers import shot

from argosy.server.energy import EnergyLedger
from argosy.server.store import Store

pytestmark = pytest.mark.integration


def add_metered_attempt(home: Path) -> None:
    store = Store(f"sqlite:///{home}/argosy.db")
    energy = {"measured": True, "total_j": 3.6e6, "productive_j": 2.7e6, "devices": {}}
    summary = {"status": "completed", "wall_s": 1800.0, "energy": energy}
    EnergyLedger(store.engine).record_attempt("jbrowser", 1, ["vm"], summary, time.time() - 60)
    store.close()


def test_energy_page_charts_metered_power(page, server):
    url, home = server
    add_metered_attempt(home)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(url + "/energy?window_h=6")
    page.wait_for_selector(".chart .uplot canvas")
    assert "1 kWh" in page.inner_text(".cards")
    assert page.inner_text("#energy-factor").endswith("%")
    assert "vm" in page.inner_text("#energy-nodes")
    shot(page, "energy")
    assert errors == []
