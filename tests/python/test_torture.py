"""A short crash campaign (scripts/torture.sh runs the long one): real gloo
writer jobs of 1 and 2 processes, sync saves, async saves and async saves
into a memory tier persisted to the root (both tiers checked), SIGKILLed at
random moments (tests/torture/campaign.py). The power-loss simulation needs
loop mounts and runs in scripts/torture.sh only.

Assertions count outcomes, never time: no committed checkpoint lost or
corrupt, `latest` always names a committed checkpoint, every fresh save
after a crash succeeds and leaves nothing behind, no hang, and at least one
commit observed (a run where every kill landed before the first commit
tested nothing). Deadlines inside the campaign are hang guards only.
Memory mode runs as a test of its own.
The seed is printed; TORTURE_SEED=S replays a run's choices.
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "torture"))
import campaign  # noqa: E402

KILLS = 5  # per configuration: 30 in all
CONFIGS = [(1, "sync"), (1, "async"), (2, "sync"), (2, "async")]
MEMORY_CONFIGS = [(1, "memory"), (2, "memory")]


def _rng() -> tuple[int, random.Random]:
    seed = int(os.environ.get("TORTURE_SEED", random.SystemRandom().randrange(1 << 32)))
    print(f"torture seed {seed}")
    return seed, random.Random(seed)


def _report(seed: int, tallies: list[campaign.Tally]) -> str:
    failures = [f for t in tallies for f in t.failures]
    return (f"seed {seed}\n{campaign.table(tallies)}\n\n{len(failures)} failure(s):\n"
            + "\n\n".join(failures))


def _campaign(configs, shardsafe_bin, tmp_path) -> tuple[campaign.Tally, str]:
    seed, rng = _rng()
    tallies = [campaign.kill_campaign(world, mode, KILLS, rng, str(tmp_path), str(shardsafe_bin))
               for world, mode in configs]
    report = _report(seed, tallies)
    print(report)
    total = campaign.Tally("total")
    for t in tallies:
        total.add(t)
    return total, report


def _check(total: campaign.Tally, report: str, configs) -> None:
    assert not total.failures, report
    assert total.hangs == 0, report
    assert total.iterations == total.kills_all + total.kills_one == KILLS * len(configs), report
    # Every crash was followed by a clean fresh save.
    assert total.fresh_saves == total.iterations, report
    assert total.commits >= 1, "no commit observed: the campaign tested nothing\n" + report
    # Every checkpoint found committed after a crash was verified (a listed
    # checkpoint that failed is a failure above, so this is the count seen).
    assert total.verified >= 1, report


def test_sigkill_campaign(shardsafe_bin, tmp_path):
    _check(*_campaign(CONFIGS, shardsafe_bin, tmp_path), CONFIGS)


def test_sigkill_campaign_memory_tier(shardsafe_bin, tmp_path):
    """Mode memory: both tiers checked after every kill (tier_check.py)."""
    _check(*_campaign(MEMORY_CONFIGS, shardsafe_bin, tmp_path), MEMORY_CONFIGS)
