"""``metaq_releases_to_prune``: which of a host's ``releases/<version>`` directories go,
so that ``keep`` remain (roles/metaq_common/tasks/prune.yml).

The release ``current`` points at and the one being installed always stay, whatever
``keep`` says; of the others, the newest versions (PEP 440 order) fill what is left of
``keep``. A directory whose name is no version is not the role's and is left alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from packaging.version import InvalidVersion, Version


def metaq_releases_to_prune(names: Iterable[str], keep: int, protected: Iterable[str]) -> list[str]:
    """``names``: the directories in ``releases/``; ``protected``: the current and the new
    release's names (an empty name is ignored). The names to remove, oldest first."""
    if int(keep) < 1:
        raise ValueError(f"metaq_releases_kept is {keep}: it must be 1 or more")
    kept = {name for name in protected if name}
    versions = []
    for name in set(names) - kept:
        try:
            versions.append((Version(name), name))
        except InvalidVersion:
            continue
    versions.sort(reverse=True)
    room = max(int(keep) - len(kept), 0)
    return [name for _, name in reversed(versions[room:])]


class FilterModule:
    def filters(self) -> dict[str, object]:
        return {"metaq_releases_to_prune": metaq_releases_to_prune}
