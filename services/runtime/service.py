"""runtime's shell: every task exit in, a verdict out; the failure rules kept and changed.

Stateless apart from the rule set, so replicas scale horizontally (they share
the durable consumer). Classifying is pure; a redelivered exit yields the same
verdict with the same id, which JetStream deduplicates.

Rules change without a restart: admins send commands (over rest) on
`pai.rpc.v1.rules`, which one replica of the queue group answers by writing
the whole rule set to the `pai_rules` bucket. Every replica watches that key
and swaps in a freshly compiled `RuleEngine`; the replica that wrote it swaps
before it answers, so the exit after an admin's change is classified with the
new rules.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable
from pathlib import Path

import msgspec
import nats.errors
import nats.js.errors
from nats.aio.subscription import Subscription

from libs.common import service
from libs.common.bus import Bus
from libs.common.config import Config, load_config
from libs.common.messages import TaskExited, TaskVerdict, task_event_id
from libs.common.rules_rpc import (
    RULES_QUEUE,
    RULES_SUBJECT,
    NoSuchRule,
    Outcome,
    RuleAction,
    RuleProblem,
    RuleSource,
    RulesReply,
    RulesRequest,
)
from libs.common.service import ServiceContext
from libs.common.subjects import Bucket, Durable, Kind
from services.runtime import metrics
from services.runtime.core import Rule, RuleEngine, RuleError, default_rules, load_rules
from services.runtime.store import (
    RuleSnapshot,
    RuleStore,
    add_rule,
    change_rule,
    delete_rule,
    index_of,
    stored_rules,
    to_stored,
)

log = logging.getLogger("pai.runtime")

# Two admins editing at the very same moment: the loser redoes its edit on top
# of the winner's, after a random pause that grows each round, so that one
# replica cannot keep beating another. More rounds than this means something
# keeps writing.
EDIT_ATTEMPTS = 10
EDIT_PAUSE_SECONDS = 0.01
EDIT_PAUSE_MAX_SECONDS = 0.2
# NATS refuses messages over 1 MiB; a rule set this size is hundreds of rules.
MAX_STORED_BYTES = 512 * 1024
# A watch can end silently (NATS restarted under it); re-reading the key this
# often bounds how long a replica may lag behind a change.
RESYNC_SECONDS = 5.0
WATCH_RETRY_SECONDS = 1.0
# What goes wrong talking to NATS; anything else is a bug.
NATS_TROUBLE = (nats.errors.Error, asyncio.TimeoutError, OSError)


class RuleSet(msgspec.Struct, frozen=True, kw_only=True):
    """One version of the rules, with where it came from."""

    rules: tuple[Rule, ...]
    source: RuleSource
    revision: int = 0  # of the bucket's `rules` key; 0 before any change at run time
    changedBy: str = ""
    changedAt: float = 0.0


def baseline_rules(config: Config) -> RuleSet:
    """The rule set in effect while admins changed nothing (or after a reset)."""
    if config.rules_file:
        return RuleSet(rules=tuple(load_rules(Path(config.rules_file))), source=RuleSource.FILE)
    return RuleSet(rules=tuple(default_rules()), source=RuleSource.DEFAULTS)


class ActiveRules:
    """This replica's rule set and its compiled engine, swapped together and
    only ever forward (by bucket revision), whatever order changes arrive in."""

    def __init__(self, baseline: RuleSet):
        self.baseline = baseline
        self.current = baseline
        self.engine = RuleEngine(list(baseline.rules))
        self._unreadable_revision = -1

    def resolve(self, snapshot: RuleSnapshot) -> RuleSet:
        """The rule set a bucket value stands for; RuleError when it is unreadable."""
        if snapshot.revision == self.current.revision:
            return self.current
        stored = snapshot.decode()
        rules = stored_rules(stored) if stored is not None else None
        if stored is None or rules is None:
            return msgspec.structs.replace(
                self.baseline,
                revision=snapshot.revision,
                changedBy=stored.changedBy if stored else "",
                changedAt=stored.changedAt if stored else 0.0,
            )
        return RuleSet(
            rules=tuple(rules),
            source=RuleSource.ADMIN,
            revision=snapshot.revision,
            changedBy=stored.changedBy,
            changedAt=stored.changedAt,
        )

    def install(self, rule_set: RuleSet, engine: RuleEngine | None = None) -> bool:
        if rule_set.revision <= self.current.revision:
            return False
        self.engine = engine or RuleEngine(list(rule_set.rules))
        self.current = rule_set
        log.info(
            "rules at revision %d: %d rules (%s), changed by %s",
            rule_set.revision,
            len(rule_set.rules),
            rule_set.source.value,
            rule_set.changedBy or "-",
        )
        return True

    def follow(self, snapshot: RuleSnapshot) -> None:
        """Take up a change seen in the bucket; an unreadable one is reported
        once and the rules in effect stay (classifying must go on)."""
        if snapshot.revision <= self.current.revision or snapshot.revision == self._unreadable_revision:
            return
        try:
            self.install(self.resolve(snapshot))
        except RuleError as error:
            self._unreadable_revision = snapshot.revision
            log.error("ignoring rule set revision %d in the bucket: %s", snapshot.revision, error.message)


class RuleDesk:
    """Answers rule commands: reads, validates, stores, and installs the result."""

    def __init__(self, store: RuleStore, active: ActiveRules, clock: Callable[[], float] = time.time):
        self.store = store
        self.active = active
        self.clock = clock
        self._decoder = msgspec.json.Decoder(RulesRequest)

    async def answer(self, data: bytes) -> RulesReply:
        try:
            request = self._decoder.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            return RulesReply(outcome=Outcome.INVALID, message=f"not a rules request: {error}")
        try:
            return await self.handle(request)
        except RuleError as error:
            problems = [RuleProblem(path=path, message=message) for path, message in error.errors]
            return RulesReply(outcome=Outcome.INVALID, message=error.message, problems=problems)
        except NoSuchRule as error:
            return RulesReply(outcome=Outcome.NOT_FOUND, message=error.message)
        except NATS_TROUBLE as error:
            log.warning("rules request %s failed on NATS: %r", request.action.value, error)
            return RulesReply(outcome=Outcome.UNAVAILABLE, message=f"the rule store is not reachable: {error!r}")

    async def handle(self, request: RulesRequest) -> RulesReply:
        _check_arguments(request)
        match request.action:
            case RuleAction.LIST:
                rule_set = self.active.resolve(await self.store.read())
                return _reply(rule_set, rules=[rule.to_dict() for rule in rule_set.rules])
            case RuleAction.GET:
                rule_set = self.active.resolve(await self.store.read())
                index = index_of(list(rule_set.rules), request.code)
                return _reply(rule_set, rules=[rule_set.rules[index].to_dict()], position=index)
            case RuleAction.ADD:
                return await self._edit(
                    request,
                    lambda rules: add_rule(rules, request.rule, position=request.position, before=request.before),
                )
            case RuleAction.CHANGE:
                return await self._edit(
                    request,
                    lambda rules: change_rule(
                        rules, request.code, request.rule, position=request.position, before=request.before
                    ),
                )
            case RuleAction.DELETE:
                return await self._edit(request, lambda rules: delete_rule(rules, request.code))
            case RuleAction.RESET:
                return await self._edit(request, lambda rules: (None, None))

    async def _edit(
        self, request: RulesRequest, edit: Callable[[list[Rule]], tuple[list[Rule] | None, int | None]]
    ) -> RulesReply:
        """Apply `edit` to the latest stored rule set and store the result;
        redone on top of a change that got in first, unless the admin pinned
        the revision the edit was meant for."""
        for attempt in range(EDIT_ATTEMPTS):
            if attempt:
                await asyncio.sleep(random.uniform(0, min(EDIT_PAUSE_MAX_SECONDS, EDIT_PAUSE_SECONDS * 2**attempt)))
            snapshot = await self.store.read()
            if request.revision is not None and request.revision != snapshot.revision:
                return RulesReply(
                    outcome=Outcome.STALE,
                    message=(
                        f"the rules changed since revision {request.revision} (now {snapshot.revision}); "
                        "list them again and redo the change"
                    ),
                    revision=snapshot.revision,
                )
            # A reset must work even when the stored rule set cannot be read.
            current = [] if request.action == RuleAction.RESET else list(self.active.resolve(snapshot).rules)
            new_rules, index = edit(current)
            engine = RuleEngine(new_rules) if new_rules is not None else None
            stored = to_stored(new_rules, by=request.by, at=self.clock())
            size = len(msgspec.json.encode(stored))
            if size > MAX_STORED_BYTES:
                raise RuleError([("", f"the rule set would take {size} bytes; at most {MAX_STORED_BYTES} fit")])
            try:
                revision = await self.store.write(stored, last=snapshot.revision)
            except nats.js.errors.KeyWrongLastSequenceError:
                continue
            if new_rules is None:
                rule_set = msgspec.structs.replace(
                    self.active.baseline, revision=revision, changedBy=stored.changedBy, changedAt=stored.changedAt
                )
            else:
                rule_set = RuleSet(
                    rules=tuple(new_rules),
                    source=RuleSource.ADMIN,
                    revision=revision,
                    changedBy=stored.changedBy,
                    changedAt=stored.changedAt,
                )
            self.active.install(rule_set, engine)
            focus = None if index is None else (current if request.action == RuleAction.DELETE else new_rules)[index]
            what = "reset the rules" if focus is None else f"{_DONE[request.action]} rule {focus.code}"
            log.info("%s %s; rules now at revision %d", request.by or "someone", what, revision)
            if focus is None:
                return _reply(rule_set)
            return _reply(rule_set, rules=[focus.to_dict()], position=index)
        return RulesReply(
            outcome=Outcome.BUSY,
            message=f"the rules kept changing under this change ({EDIT_ATTEMPTS} tries); try again",
        )


_DONE = {RuleAction.ADD: "added", RuleAction.CHANGE: "changed", RuleAction.DELETE: "deleted"}


def _check_arguments(request: RulesRequest) -> None:
    problems = []
    if request.action in (RuleAction.GET, RuleAction.CHANGE, RuleAction.DELETE) and request.code is None:
        problems.append(("code", "required: the code of the rule"))
    if request.action in (RuleAction.ADD, RuleAction.CHANGE) and request.rule is None:
        problems.append(("rule", "required: the rule in exit-spec format"))
    if problems:
        raise RuleError(problems)


def _reply(rule_set: RuleSet, *, rules: list[dict] | None = None, position: int | None = None) -> RulesReply:
    return RulesReply(
        outcome=Outcome.OK,
        rules=rules or [],
        position=position,
        revision=rule_set.revision,
        source=rule_set.source,
        changedBy=rule_set.changedBy,
        changedAt=rule_set.changedAt,
    )


async def subscribe_rule_requests(bus: Bus) -> Subscription:
    subscription = await bus.nc.subscribe(RULES_SUBJECT, queue=RULES_QUEUE)
    await bus.nc.flush()  # the server knows this replica answers before it says it is ready
    return subscription


async def serve_rule_requests(subscription: Subscription, desk: RuleDesk) -> None:
    """Answer rule commands, one at a time per replica (the bucket revision
    orders replicas among themselves)."""
    try:
        async for msg in subscription.messages:
            reply = await desk.answer(msg.data)
            if msg.reply:
                await msg.respond(msgspec.json.encode(reply))
    finally:
        try:
            await subscription.unsubscribe()
        except NATS_TROUBLE:
            pass  # the connection is going away anyway


async def follow_rule_changes(store: RuleStore, active: ActiveRules) -> None:
    """Take up every rule change made through any replica."""

    async def watch() -> None:
        while True:
            try:
                async for snapshot in store.watch():
                    active.follow(snapshot)
            except NATS_TROUBLE as error:
                log.warning("watching the rules failed (%r); watching again", error)
            await asyncio.sleep(WATCH_RETRY_SECONDS)

    async def resync() -> None:
        while True:
            await asyncio.sleep(RESYNC_SECONDS)
            try:
                active.follow(await store.read())
            except NATS_TROUBLE:
                pass  # NATS is away; the watch says so too

    await asyncio.gather(watch(), resync())


class RuntimeShell:
    def __init__(self, ctx: ServiceContext, active: ActiveRules):
        self.ctx = ctx
        self.active = active

    async def handle(self, event: TaskExited) -> None:
        with metrics.CLASSIFY_SECONDS.time():
            result = self.active.engine.classify(event)
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
    store = RuleStore(await ctx.bus.kv(Bucket.RULES))
    active = ActiveRules(baseline_rules(ctx.config))
    active.follow(await store.read())
    requests = await subscribe_rule_requests(ctx.bus)
    ctx.spawn(serve_rule_requests(requests, RuleDesk(store, active)), "rule-requests")
    ctx.spawn(follow_rule_changes(store, active), "rule-changes")
    ctx.set_ready()
    shell = RuntimeShell(ctx, active)
    await ctx.bus.consume(Durable.RUNTIME, [Kind.TASK_EXITED], (TaskExited,), shell.handle, stopping=ctx.stopping)


def main() -> None:
    service.run("runtime", load_config(), body)
