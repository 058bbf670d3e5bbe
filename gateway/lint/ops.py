"""The linter's two feeds for the ops dashboard (``gateway.ops.view``).

The dashboard shows no prompt text: kinds, counts, models, fixed wording.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gateway.lint.service import LintService
from gateway.ops.view import DriftNotice, LintFindingStat


def dashboard_feeds(service: LintService) -> tuple[Callable[[], Sequence[LintFindingStat]],
                                                   Callable[[], Sequence[DriftNotice]]]:
    def findings() -> list[LintFindingStat]:
        return [LintFindingStat(s.kind, s.count, s.severity, s.suggestion)
                for s in service.top_findings(10)]

    def drifts() -> list[DriftNotice]:
        return [DriftNotice(
            at=e.at, model=e.model, kind="tools" if e.path.startswith("tools") else "system_prompt",
            detail=(f"group {e.group}: requests now differ at {e.path} ({e.kind}); prefix "
                    f"repeated {e.share_before:.0%} -> {e.share_after:.0%}"),
            lost_tokens=e.lost_tokens) for e in service.drift_events(20)]

    return findings, drifts
