"""Stopping the background tasks a component owns."""

from __future__ import annotations

import asyncio
import contextlib


async def cancel(*tasks: asyncio.Task[object] | None) -> None:
    """Cancel the tasks and wait until each has finished (``None`` entries are skipped)."""
    live = [task for task in tasks if task is not None]
    for task in live:
        task.cancel()
    for task in live:
        with contextlib.suppress(asyncio.CancelledError):
            await task
