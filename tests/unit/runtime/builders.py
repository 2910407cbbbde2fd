"""Builders for the runtime's unit tests."""

from __future__ import annotations

from libs.common.messages import TaskExited

TRAINING_PREAMBLE = (
    "2025-03-04 10:12:01 INFO Loading config from /work/configs/resnet50.yaml\n"
    "2025-03-04 10:12:07 INFO world_size=8 rank=0 local_rank=0 device=cuda:0\n"
    "Epoch 1:  37%|###7      | 1853/5005 [07:41<13:05,  4.01it/s, loss=4.112]\n"
    "2025-03-04 10:20:13 INFO step=1900 loss=4.0871 lr=1.00e-01 grad_norm=2.113\n"
)


def task_exited(
    exit_code: int = 1,
    log: str = "",
    *,
    reason: str = "",
    message: str = "",
    signal: int | None = None,
    role: str = "worker",
    preamble: bool = True,
) -> TaskExited:
    """A task exit as a launcher backend reports it; the log gets a few lines
    of ordinary training output in front, as real tails have."""
    return TaskExited(
        id="alice~resnet/0/worker/0/0/exited",
        job="alice~resnet",
        vc="default",
        attempt=0,
        role=role,
        index=0,
        exitCode=exit_code,
        signal=signal,
        platformReason=reason,
        platformMessage=message,
        userLogTail=(TRAINING_PREAMBLE if preamble else "") + log,
    )
