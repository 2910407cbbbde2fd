"""runtime's shell: every task exit in, a verdict out.

Stateless apart from the rule set, so replicas scale horizontally (they share
the durable consumer). Classifying is pure; a redelivered exit yields the same
verdict with the same id, which JetStream deduplicates.
"""

from __future__ import annotations

import logging
import time

from libs.common import service
from libs.common.config import load_config
from libs.common.messages import TaskExited, TaskVerdict, task_event_id
from libs.common.service import ServiceContext
from libs.common.subjects import Durable, Kind
from services.runtime import metrics
from services.runtime.core import RuleEngine, default_rules, load_rules

log = logging.getLogger("pai.runtime")


class RuntimeShell:
    def __init__(self, ctx: ServiceContext, engine: RuleEngine):
        self.ctx = ctx
        self.engine = engine

    async def handle(self, event: TaskExited) -> None:
        with metrics.CLASSIFY_SECONDS.time():
            result = self.engine.classify(event)
        metrics.VERDICTS.labels(phrase=result.spec.phrase, reaction=result.spec.reaction.value).inc()
        await self.ctx.bus.publish(
            TaskVerdict(
                id=task_event_id(event.job, event.attempt, event.role, event.index, event.taskAttempt, "verdict"),
                job=event.job,
                cause=event.id,
                at=time.time(),
                vc=event.vc,
                attempt=event.attempt,
                role=event.role,
                index=event.index,
                taskAttempt=event.taskAttempt,
                exitCode=event.exitCode,
                spec=result.spec,
                diagnostics=result.diagnostics,
            )
        )


async def body(ctx: ServiceContext) -> None:
    rules = load_rules(ctx.config.rules_file) if ctx.config.rules_file else default_rules()
    shell = RuntimeShell(ctx, RuleEngine(rules))
    ctx.set_ready()
    await ctx.bus.consume(Durable.RUNTIME, [Kind.TASK_EXITED], (TaskExited,), shell.handle, stopping=ctx.stopping)


def main() -> None:
    service.run("runtime", load_config(), body)
