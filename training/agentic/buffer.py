"""The trainer's side of the asynchronous pipeline: finished trajectories arrive one by one from the rollout
workers; a group is ready once all its samples are back; the trainer takes ready groups once enough
trajectories are buffered (docs/recipe.md, Stage 2).

At take time each group is filtered: samples whose oldest policy version is more than `max_staleness`
versions behind the trainer are dropped as stale; samples the environment crashed on are dropped with
their reason; a group with more than half of its samples left is padded back to full size by repeating
valid samples (in order), otherwise dropped whole. With `drop_uniform`, a group whose valid samples all have
the same trained reward is dropped too (DAPO's dynamic sampling): its advantages are all 0, so it adds no gradient and
only dilutes the token mean of the loss. Every drop is counted, so the counts add up:
received == trained_unique + stale + env_failures + dropped_in_groups + uniform_samples."""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from training.rollout.trajectory import Trajectory


def trained_reward(traj: Trajectory, partial_credit: float, found_credit: float = 0.0) -> float:
    """The reward the trainer optimizes: the verifier's 1 for a success, else `partial_credit` times how close
    the attempt came (`Verdict.partial`) plus `found_credit` if a tool had returned the answer
    (`Verdict.found`), so a group that failed every time still ranks its near misses."""
    if traj.reward >= 1.0 or not (partial_credit or found_credit):
        return traj.reward
    parts = traj.reward_components
    return traj.reward + partial_credit * parts.get("partial", 0.0) + found_credit * parts.get("found", 0.0)


@dataclass
class BufferCounts:
    received: int = 0
    duplicates: int = 0  # the same trajectory id delivered twice (a retried worker): ignored
    stale: int = 0
    env_failures: int = 0
    dropped_groups: int = 0
    dropped_in_groups: int = 0  # valid samples thrown away with a group that had too few valid ones
    padded_samples: int = 0
    uniform_groups: int = 0  # groups dropped because every valid sample had the same reward
    uniform_samples: int = 0
    trained_unique: int = 0
    env_failure_reasons: Counter = field(default_factory=Counter)

    def metrics(self) -> dict[str, float]:
        out = {k: float(v) for k, v in vars(self).items() if isinstance(v, int)}
        return {f"buffer/{k}": v for k, v in out.items()}


class TrajectoryBuffer:
    def __init__(self, group_size: int, max_staleness: int, drop_uniform: bool = False,
                 partial_credit: float = 0.0, found_credit: float = 0.0):  # fmt: skip
        if group_size < 1 or max_staleness < 0:
            raise ValueError(
                f"group_size must be >= 1 and max_staleness >= 0, got {group_size}, {max_staleness}"
            )
        self.group_size, self.max_staleness, self.drop_uniform = group_size, max_staleness, drop_uniform
        self.partial_credit, self.found_credit = partial_credit, found_credit
        self._groups: OrderedDict[str, list[Trajectory]] = OrderedDict()
        self._seen: set[str] = set()
        self.counts = BufferCounts()

    def add(self, traj: Trajectory) -> None:
        if traj.id in self._seen:
            self.counts.duplicates += 1
            return
        self._seen.add(traj.id)
        self.counts.received += 1
        self._groups.setdefault(traj.group_id, []).append(traj)

    def ready_trajectories(self) -> int:
        return sum(len(g) for g in self._groups.values() if len(g) >= self.group_size)

    def in_progress(self) -> int:
        return sum(len(g) for g in self._groups.values() if len(g) < self.group_size)

    def take(self, min_trajectories: int, version: int) -> list[list[Trajectory]] | None:
        """Ready groups, oldest first, until at least `min_trajectories` samples survive the filters; None
        (and nothing consumed) while fewer than that many are ready."""
        if self.ready_trajectories() < min_trajectories:
            return None
        taken: list[list[Trajectory]] = []
        for gid in [g for g, members in self._groups.items() if len(members) >= self.group_size]:
            group = self._filter(self._groups.pop(gid), version)
            if group:
                taken.append(group)
            if sum(len(g) for g in taken) >= min_trajectories:
                break
        return taken

    def _filter(self, group: list[Trajectory], version: int) -> list[Trajectory]:
        valid = []
        for t in group:
            if t.status == "env_failure":
                self.counts.env_failures += 1
                self.counts.env_failure_reasons[t.reason.split(":")[0][:60]] += 1
            elif t.policy_versions and version - min(t.policy_versions) > self.max_staleness:
                t.status, t.reason = "stale", f"oldest version {min(t.policy_versions)}, trainer at {version}"
                self.counts.stale += 1
            else:
                valid.append(t)
        if 2 * len(valid) <= len(group):  # "more than half valid" pads; half or fewer drops the group
            self.counts.dropped_groups += 1
            self.counts.dropped_in_groups += len(valid)
            return []
        if (
            self.drop_uniform
            and len({trained_reward(t, self.partial_credit, self.found_credit) for t in valid}) == 1
        ):
            self.counts.uniform_groups += 1
            self.counts.uniform_samples += len(valid)
            return []
        self.counts.trained_unique += len(valid)
        padding = [valid[i % len(valid)] for i in range(len(group) - len(valid))]
        self.counts.padded_samples += len(padding)
        return valid + padding
