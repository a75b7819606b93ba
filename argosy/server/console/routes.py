"""All console routes in one router (pages, then forms)."""

from __future__ import annotations

from fastapi import APIRouter

from argosy.server.console import actions, energy_view, pages

router = APIRouter(include_in_schema=False)
router.include_router(actions.router)
router.include_router(pages.router)
router.include_router(energy_view.router)
