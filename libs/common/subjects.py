"""Every NATS subject, stream and KV bucket name of PAI, declared once.

Job events are published on `pai.v1.<entity>.<event>.<vc>.<user>.<job>` so an
integrator can filter by kind, VC, user and job with wildcards, e.g.
`pai.v1.job.*.vc1.>` (every job event of vc1) or `pai.v1.*.*.*.alice.>`.
Node and alert events use `pai.v1.node.<event>.<node>` and
`pai.v1.alert.<event>.<rule>`; a dead-lettered event is announced on
`pai.v1.event.dead_lettered.<consumer>`.

Versioning: a breaking change to a message is a new `pai.v2...` subject.
"""

from __future__ import annotations

from enum import StrEnum

from libs.common.ids import node_token, split_job_id

PREFIX = "pai.v1"
STREAM = "PAI_EVENTS"
STREAM_SUBJECTS = [f"{PREFIX}.>"]

# Commands over request/reply, outside the event stream (JetStream would store a
# request and answer it with a publish ack first). A monitor's tag-job alert action:
# rest answers (queue group "rest") by changing the job's tags as its tag route does.
JOB_TAG_SUBJECT = "pai.rpc.v1.job_tag"
JOB_TAG_QUEUE = "rest"
# A browser terminal in a running task (services/rest/terminal.py, services/launcher/terminals.py):
# rest asks the launcher (which owns the task) to open a session, then each side sends
# its bytes on the session's own subject, named by a random id rest chose:
# `...session.<id>.in` (keys and resizes, rest -> launcher), `...session.<id>.out`
# (the shell's output and its end, launcher -> rest).
TERMINAL_OPEN_SUBJECT = "pai.rpc.v1.terminal.open"
TERMINAL_SESSION_PREFIX = "pai.rpc.v1.terminal.session"
TERMINAL_INPUT_SUBJECTS = f"{TERMINAL_SESSION_PREFIX}.*.in"
TERMINAL_OUTPUT_SUBJECTS = f"{TERMINAL_SESSION_PREFIX}.*.out"


# Each side of a terminal session sends something at least this often (a ping: an empty
# TerminalInput or TerminalOutput), and ends the session after TERMINAL_LINK_SECONDS
# without a word from the other: a side killed -9 leaves no session open behind it.
TERMINAL_PING_SECONDS = 10.0
TERMINAL_LINK_SECONDS = 35.0


def terminal_input_subject(session: str) -> str:
    return f"{TERMINAL_SESSION_PREFIX}.{session}.in"


def terminal_output_subject(session: str) -> str:
    return f"{TERMINAL_SESSION_PREFIX}.{session}.out"


class Kind(StrEnum):
    """`<entity>.<event>` of every event; the value is the subject middle."""

    JOB_SUBMITTED = "job.submitted"
    JOB_STOP_REQUESTED = "job.stop_requested"
    JOB_PLACED = "job.placed"
    JOB_WAITING = "job.waiting"
    JOB_PREEMPT = "job.preempt"
    JOB_STATE = "job.state"
    JOB_RELEASED = "job.released"
    # A finished job's owner or an admin deleted it (rest); each service removes its records of it.
    JOB_DELETED = "job.deleted"
    # The history database holds a finished job past `live_finished_job_seconds` or the
    # `live_finished_job_max` newest (rest):
    # each service removes its live records of it (services/rest/history/expiry.py).
    JOB_ARCHIVED = "job.archived"
    TASK_STARTED = "task.started"
    TASK_EXITED = "task.exited"
    TASK_VERDICT = "task.verdict"
    # Someone opened, and later closed, a browser terminal in a running task (launcher).
    TERMINAL_OPENED = "terminal.opened"
    TERMINAL_CLOSED = "terminal.closed"
    NODE_STATUS = "node.status"
    # An admin cordoned or uncordoned a node (rest); the monitor folds it into NodeStatus.
    NODE_CORDON = "node.cordon"
    ALERT_FIRING = "alert.firing"
    ALERT_RESOLVED = "alert.resolved"
    # A consumer gave up on an event that failed the same way too often.
    EVENT_DEAD_LETTERED = "event.dead_lettered"


def job_subject(kind: Kind, vc: str, job: str) -> str:
    user, name = split_job_id(job)
    return f"{PREFIX}.{kind}.{vc}.{user}.{name}"  # (a StrEnum formats as its value; `.value` costs more)


def node_subject(kind: Kind, node: str) -> str:
    return f"{PREFIX}.{kind.value}.{node_token(node)}"


def alert_subject(kind: Kind, rule: str) -> str:
    return f"{PREFIX}.{kind.value}.{node_token(rule)}"


def dead_letter_subject(kind: Kind, consumer: str) -> str:
    return f"{PREFIX}.{kind.value}.{consumer}"


def kind_filter(kind: Kind) -> str:
    """Every event of one kind, whatever VC, user, job or node."""
    return f"{PREFIX}.{kind.value}.>"


def kind_of(subject: str) -> Kind:
    parts = subject.split(".")
    return Kind(f"{parts[2]}.{parts[3]}")


class Bucket(StrEnum):
    """KV buckets; each has exactly one writing service (docs/architecture.md, "Services")."""

    JOBS = "pai_jobs"  # rest: the submitted job (spec + raw config), key user.name
    USERS = "pai_users"  # rest: users and their token hashes
    JOB_STATUS = "pai_job_status"  # launcher: lifecycle document per job
    SCHEDULE = "pai_schedule"  # scheduler: placement or waiting reason per job
    CLUSTER = "pai_cluster"  # scheduler: VC and node view for the API
    RULES = "pai_rules"  # runtime: failure rules changed at run time
    NODES = "pai_nodes"  # monitor: latest node sample and health
    # monitor: each node's health as the cluster monitor decided it (conditions,
    # cordon and its reason), so a restarted monitor and the API read one record.
    NODE_HEALTH = "pai_node_health"
    LEASES = "pai_leases"  # single-active services: leader lease
    # rest: each job's secrets, sealed with the launcher's public key; only the
    # launcher can open them (and only it may read the bucket).
    SECRETS = "pai_secrets"
    # monitor: active and recent alerts (`alert.*`), what was mailed (`group.*`,
    # `sent.*`), job tags set by alert actions (`tags.*`); rest lists from it.
    ALERTS = "pai_alerts"
    ALERT_RULES = "pai_alert_rules"  # monitor: the alert rule document changed at run time
    # monitor: each task's utilisation over time (key user.name.role.index), for
    # GET /api/v2/jobs/{id}/metrics; entries expire retention_finished_seconds after their last sample.
    JOB_METRICS = "pai_job_metrics"
    # rest: marketplace items (`item.<id>`) and who starred them (`star.<id>.<user>`)
    # (services/rest/market).
    MARKET = "pai_market"
    # launcher: each browser terminal session it holds open (key: the session id), so
    # a restarted launcher records the end of those a crash cut (services/launcher/core/terminals.py).
    TERMINALS = "pai_terminals"


# Durable consumer names, one per consuming service.
class Durable(StrEnum):
    SCHEDULER = "scheduler"
    LAUNCHER = "launcher"
    RUNTIME = "runtime"
    MONITOR = "monitor"
    REST = "rest"  # job.deleted: rest's own records of a deleted job
    HISTORY = "history"  # rest: the job history database, a projection of job and task events
