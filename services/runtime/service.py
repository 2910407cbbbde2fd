"""runtime's shell: every failed task's exit in, a verdict out; the failure rules kept and changed.

Stateless apart from the rule set, so replicas scale horizontally (they share
the durable consumer). Exits come in batches (all that wait, up to a bound):
each is classified, and the batch's verdicts are published together, all in
flight at once, before the batch is acked. Classifying is pure; a redelivered
exit yields the same verdict with the same id, which JetStream deduplicates.
An exit 0 needs no verdict: the launcher settles such a task at once.

Rules change without a restart: admins send commands (over rest) on
`pai.rpc.v1.rules`, which one replica of the queue group answers by writing
the whole rule set to the `pai_rules` bucket (an admin-editable document:
`libs.common.documents`); what to write, and the answer, come from the core's
`RuleBook` (versions and edits), the shell only reads, writes and watches the
bucket. Every replica watches that key
and swaps in a freshly compiled `RuleEngine`; the replica that wrote it swaps
before it answers, so the exit after an admin's change is classified with the
new rules.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from libs.common import documents, service
from libs.common.config import Config, load_config
from libs.common.messages import TaskExited, TaskVerdict, task_event_id
from libs.common.rules_rpc import RULES_QUEUE, RULES_SUBJECT, Outcome, RuleSource, RulesReply, RulesRequest
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.runtime import metrics
from services.runtime.core import RuleBook, RuleSet, default_rules, load_rules
from services.runtime.core.rulebook import Edit
from services.runtime.store import RuleSnapshot, RuleStore

log = logging.getLogger("pai.runtime")

# Two admins editing at the very same moment: the loser redoes its edit on top
# of the winner's (`DocumentStore.edit`). More rounds than this means something
# keeps writing.
EDIT_ATTEMPTS = 10
# Under load, task exits gather this long between batches, so a batch's fixed
# costs are shared: most exited 0 and need nothing; a failed task's verdict (and
# so its job's retry) comes at most this much later, and only under load.
GATHER_SECONDS = 0.05


def baseline_rules(config: Config) -> RuleSet:
    """The rule set in effect while admins changed nothing (or after a reset)."""
    if config.rules_file:
        return RuleSet(rules=tuple(load_rules(Path(config.rules_file))), source=RuleSource.FILE)
    return RuleSet(rules=tuple(default_rules()), source=RuleSource.DEFAULTS)


def follow(book: RuleBook, snapshot: RuleSnapshot) -> None:
    before = book.current.revision
    problem = book.follow(snapshot.value, snapshot.revision)
    if problem is not None:
        log.error("ignoring rule set revision %d in the bucket: %s", snapshot.revision, problem)
    elif book.current.revision != before:
        _log_installed(book.current)


def _log_installed(rule_set: RuleSet) -> None:
    log.info(
        "rules at revision %d: %d rules (%s), changed by %s",
        rule_set.revision,
        len(rule_set.rules),
        rule_set.source.value,
        rule_set.changedBy or "-",
    )


class RuleDesk:
    """Answers rule commands: the core plans each change, the store reads and
    writes the bucket, and plans again a change that lost a race."""

    def __init__(self, store: RuleStore, book: RuleBook, clock: Callable[[], float] = time.time):
        self.store = store
        self.book = book
        self.clock = clock
        self.answer = documents.answering(RulesRequest, self.handle, RulesReply, what="a rules", store="rule store")

    async def handle(self, request: RulesRequest) -> RulesReply:
        def plan(snapshot: RuleSnapshot) -> documents.Write[bytes, Edit] | RulesReply:
            planned = self.book.plan(request, snapshot.value, snapshot.revision, now=self.clock())
            return planned if isinstance(planned, RulesReply) else documents.Write(planned.value, planned)

        done: tuple[Edit, int] | RulesReply | None = await self.store.edit(plan, attempts=EDIT_ATTEMPTS)
        if done is None:
            return RulesReply(
                outcome=Outcome.BUSY,
                message=f"the rules kept changing under this change ({EDIT_ATTEMPTS} tries); try again",
            )
        if isinstance(done, RulesReply):
            return done
        edit, revision = done
        reply = self.book.commit(edit, revision)
        _log_installed(self.book.current)
        log.info("%s", RuleBook.describe(edit, revision))
        return reply


class RuntimeShell:
    def __init__(self, ctx: ServiceContext, book: RuleBook):
        self.ctx = ctx
        self.book = book

    async def handle(self, event: TaskExited) -> None:
        """One exit (a consumer that hands them one at a time)."""
        await self.handle_batch([event])

    async def handle_batch(self, events: Sequence[TaskExited]) -> None:
        """Classify every failed exit of a fetched batch and publish the verdicts
        together. A task that exited 0 gets none: the launcher settles it as
        SUCCEEDED without waiting for one, and the monitor counts it from its
        TaskExited. Returns once every verdict is stored (a redelivered exit
        gives the same verdict under the same id, stored once)."""
        verdicts = [self.verdict(event) for event in events if event.exitCode != 0]
        if verdicts:
            await self.ctx.bus.publish_many(verdicts)
        # Counted once the batch is done: a batch handed again counts only its second time.
        if succeeded := len(events) - len(verdicts):
            metrics.EXITS.labels(outcome="succeeded").inc(succeeded)
        if verdicts:
            metrics.EXITS.labels(outcome="failed").inc(len(verdicts))
        for verdict in verdicts:
            metrics.VERDICTS.labels(phrase=verdict.spec.phrase, reaction=verdict.spec.reaction.value).inc()

    def verdict(self, event: TaskExited) -> TaskVerdict:
        with metrics.CLASSIFY_SECONDS.time():
            result = self.book.engine.classify(event)
        return TaskVerdict(
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


async def body(ctx: ServiceContext) -> None:
    store = RuleStore(await ctx.bus.kv(Bucket.RULES))
    book = RuleBook(baseline_rules(ctx.config))
    follow(book, await store.read())
    requests = await documents.subscribe(ctx.bus, RULES_SUBJECT, RULES_QUEUE)
    ctx.spawn(documents.serve(requests, RuleDesk(store, book).answer), "rule-requests")
    # Every change made through any replica taken up (again after a reconnect).
    ctx.spawn(store.follow(ctx.bus, ctx.stopping, lambda snapshot: follow(book, snapshot)), "rule-changes")
    ctx.set_ready()
    shell = RuntimeShell(ctx, book)
    await ctx.bus.consume_batches(Durable.RUNTIME, [Kind.TASK_EXITED], (TaskExited,), shell.handle_batch,
                                  stopping=ctx.stopping, gather_seconds=GATHER_SECONDS)


def main() -> None:
    service.run("runtime", load_config(), body)
