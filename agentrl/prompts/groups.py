"""What each group of a rollout is, as the trainer opened it: the payload of the ledger's rollout spec.

The trainer decides which prompt row each group is and at which temperature it is sampled (it
computes the sampler's log-probs at that temperature), and records both when it opens the rollout
(`rollout_payload`). Pool workers read them from the spec (`RolloutGroups.parse`) and never
recompute the mapping: a pool started with another seed, batch size or config would otherwise
grade task A while the trainer credits prompt B. `check_rows` refuses prompt data other than the
trainer's, naming both hashes, before a worker claims anything of the rollout.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field

from hpc.ledger import DEFAULT_MAX_TRIES, Ledger
from hpc.validation import validate_section

from .source import PromptSource, rows_fingerprint

PAYLOAD_KIND: Final = "agentrl.pool-groups"
PAYLOAD_VERSION: Final = 1


class RolloutGroupsError(ValueError):
    """A rollout's groups cannot be done by this worker (other data, or a payload it cannot read)."""


class GroupTask(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    row: int = Field(ge=0)                 # index into the prompt data's rows
    instance_id: str | None = None         # the row's metadata.instance_id, if it has one


class RolloutGroups(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["agentrl.pool-groups"] = PAYLOAD_KIND
    version: Literal[1] = PAYLOAD_VERSION
    prompt_data_sha256: str
    num_rows: int = Field(gt=0)
    temperature: float = Field(gt=0)       # train.rollout_temperature: the log-probs' temperature
    groups: dict[int, GroupTask]           # absolute group index -> its task

    @classmethod
    def parse(cls, payload: Mapping[str, Any] | None, where: str) -> RolloutGroups:
        if payload is None:
            raise RolloutGroupsError(f"{where}: the rollout was opened without its groups' tasks (by an older "
                                     "trainer); restart the trainer with this version so it reopens the rollout")
        return validate_section(cls, payload, f"{where}: payload", RolloutGroupsError)

    def task(self, group: int, rows: Sequence[Mapping[str, Any]]) -> Mapping[str, Any]:
        """The prompt row of `group`; refuses a group the trainer did not open or a row of another task."""
        if group not in self.groups:
            raise RolloutGroupsError(f"group {group} is not one of the rollout's groups")
        entry = self.groups[group]
        row = rows[entry.row]
        found = (row.get("metadata") or {}).get("instance_id")
        if found != entry.instance_id:
            raise RolloutGroupsError(f"group {group}: row {entry.row} is task {found!r} here but "
                                     f"{entry.instance_id!r} to the trainer")
        return row


def rollout_payload(source: PromptSource, rollout: int, *, temperature: float) -> dict[str, Any]:
    """The payload the trainer opens rollout `rollout` with."""
    groups = {}
    for g in source.group_indices(rollout):
        row = source.row_index(g)
        groups[g] = GroupTask(row=row, instance_id=(source.rows[row].get("metadata") or {}).get("instance_id"))
    return RolloutGroups(prompt_data_sha256=source.fingerprint, num_rows=source.num_rows, temperature=temperature,
                         groups=groups).model_dump(mode="json")


def open_rollout(ledger: Ledger, source: PromptSource, rollout: int, *, attempts: int, temperature: float,
                 max_tries: int = DEFAULT_MAX_TRIES) -> int:
    """Open rollout `rollout` of `source` in the ledger, with what each group is; its generation."""
    return ledger.open_rollout(rollout, list(source.group_indices(rollout)), attempts, max_tries,
                               payload=rollout_payload(source, rollout, temperature=temperature))


def check_rows(groups: RolloutGroups, rows: Sequence[Mapping[str, Any]], fingerprint: str | None = None,
               where: str = "prompt data") -> None:
    """Refuse rows other than those the trainer opened the rollout over, naming both hashes."""
    mine = fingerprint or rows_fingerprint(rows)
    if mine != groups.prompt_data_sha256 or len(rows) != groups.num_rows:
        raise RolloutGroupsError(
            f"{where} ({len(rows)} rows, sha256 {mine}) is not the data the trainer opened the rollout over "
            f"({groups.num_rows} rows, sha256 {groups.prompt_data_sha256}): the pool would grade other tasks "
            "than the trainer credits. Point train.prompt_data of the pool's config at the trainer's file")
