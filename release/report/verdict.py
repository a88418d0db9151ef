"""The channel's verdict, in one sentence: whether every gate the channel requires
(``[release.channels.<name>].requires``) passed on the wheels being released, and one of them
(the payload gate) on the build's sdist, and if not which did not and why; then the other gates,
as not part of that verdict. The summary and the report both lead with it."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from release.evidence import Evidence
from release.manifest import Manifest

NOT_RUN_PREFIX = "not run: "  # how a gate's evidence says why it did not run
# A verdict on other wheels than the build's: shown with its reason, never as this run's verdict.
STALE = "other-wheels"


@dataclass(frozen=True)
class GateRow:
    """One gate as the summary and the report show it: declared, recorded, or both."""

    name: str
    runner: str  # the manifest's runner, or "not in the manifest"
    required: bool  # by the channel
    verdict: str  # the evidence's, or "not-run"
    reason: str  # the evidence's, or why there is none
    evidence: Evidence | None
    attested_by: Path | None = None  # the committed attestation whose pass this row shows


@dataclass(frozen=True)
class ChannelVerdict:
    channel: str
    releasable: bool
    headline: str  # "dev: releasable — every gate dev requires (…) passed on all 3 wheels"
    others: str  # the gates the channel does not require, in one line; "" where there are none
    required: tuple[GateRow, ...]
    not_required: tuple[GateRow, ...]

    @property
    def tone(self) -> str:
        return "pass" if self.releasable else "fail"


def names(items: list[str]) -> str:
    """ "a", "a and b", "a, b and c"."""
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def why_not_run(row: GateRow) -> str:
    """Why a gate did not run, in its evidence's words ("no GPU runner")."""
    reason = row.reason or "its evidence gives no reason"
    return reason[len(NOT_RUN_PREFIX) :] if reason.lower().startswith(NOT_RUN_PREFIX) else reason


def outcomes(rows: tuple[GateRow, ...]) -> list[str]:
    """The gates of `rows` in a few phrases: those that did not run (by reason), failed, judged
    other wheels, passed."""
    not_run: dict[str, list[str]] = {}
    for row in rows:
        if row.verdict == "not-run":
            not_run.setdefault(why_not_run(row), []).append(row.name)
    phrases = [f"{names(gates)} did not run ({why})" for why, gates in not_run.items()]
    for verdict, said in (("fail", "failed"), (STALE, "judged other wheels than this build's"),
                          ("pass", "passed")):  # fmt: skip
        gates = [row.name for row in rows if row.verdict == verdict]
        if gates:
            phrases.append(f"{names(gates)} {said}")
    return phrases


def _wheels(count: int, sdist: dict[str, str]) -> str:
    wheels = f"all {count} wheels" if count > 1 else "the one wheel"
    return f"{wheels} and the sdist" if sdist else wheels


def _sdist_unjudged(required: tuple[GateRow, ...], sdist: dict[str, str]) -> str:
    """Why no required gate's pass covers the build's sdist; "" where one does (or none was
    built)."""
    judged = [row.evidence.judged_sdist for row in required
              if row.verdict == "pass" and row.evidence is not None]  # fmt: skip
    if not sdist or sdist in judged:
        return ""
    return (
        f"no gate it requires passed on the sdist {next(iter(sdist))} (the payload gate judges it)"
    )


def channel_verdict(
    manifest: Manifest,
    channel: str,
    gate_rows: Sequence[GateRow],
    built_wheels: Mapping[str, str],
    sdist: dict[str, str],
) -> ChannelVerdict:
    """The verdict of `channel` from every gate's row and the build's wheels and sdist."""
    requires = manifest.channel(channel).requires
    rows = {row.name: row for row in gate_rows}
    required = tuple(
        rows.get(gate) or GateRow(gate, "?", True, "not-run", "no evidence in this run", None)
        for gate in requires
    )
    not_required = tuple(row for row in rows.values() if not row.required)
    built = len(built_wheels)
    passed = all(row.verdict == "pass" for row in required)
    unjudged = _sdist_unjudged(required, sdist)
    releasable = bool(built) and passed and not unjudged
    if releasable:
        every = f"every gate {channel} requires ({', '.join(requires)})"
        headline = f"{channel}: releasable — {every} passed on {_wheels(built, sdist)}"
    elif not built:
        headline = (f"{channel}: refused — no wheel was built (no build record), so no gate "
                    "judged the wheels to release")  # fmt: skip
    else:
        said = outcomes(required) if not passed else [*outcomes(required), unjudged]
        headline = f"{channel}: refused — " + "; ".join(said)
    others = ""
    if not_required:
        others = (f"Not required by {channel}, so not part of its verdict: "
                  + "; ".join(outcomes(not_required)) + ".")  # fmt: skip
    return ChannelVerdict(channel, releasable, headline, others, required, not_required)
