"""Helpers of the browser tests: paths, logging in through the form, screenshots."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCREENS = ROOT / "runs" / "console-screens"


def login(pg, url: str, token: str) -> None:  # noqa: ANN001
    pg.goto(url + "/login")
    pg.fill("input[name=token]", token)
    pg.click("button[type=submit]")
    pg.wait_for_selector("nav")


def shot(pg, name: str) -> Path:  # noqa: ANN001
    SCREENS.mkdir(parents=True, exist_ok=True)
    path = SCREENS / f"{name}.png"
    pg.screenshot(path=str(path), full_page=True)
    return path
