"""SWE tasks: the task spec, verifier payloads and rewards (task), Harbor conversion (harbor)."""

from .task import (
    DECODE_COMMAND,
    HOST_IMAGE,
    RewardError,
    TaskSpec,
    TaskSpecError,
    decode_payload,
    encode_payload,
    load_task_spec,
    reward_from,
)

__all__ = ["DECODE_COMMAND", "HOST_IMAGE", "RewardError", "TaskSpec", "TaskSpecError", "decode_payload",
           "encode_payload", "load_task_spec", "reward_from"]
