"""PAI configuration: one flat Struct, read from a YAML file and then the environment.

Precedence: defaults < file named by `PAI_CONFIG` (or passed explicitly) < `PAI_<FIELD>`
environment variables (upper-case field name, e.g. `PAI_NATS_URL`, `PAI_REST_PORT`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import msgspec
import yaml

from libs.common.errors import BadInput


class Config(msgspec.Struct, kw_only=True, frozen=True):
    nats_url: str = "nats://127.0.0.1:4222"
    data_dir: str = ".pai"
    # HiveD-format cluster file; empty: this machine as a one-node cluster.
    cluster_file: str = ""
    backend: str = "local"  # "local" or "kubernetes"
    host: str = "127.0.0.1"
    # HTTP ports (each service serves /healthz, /readyz, /metrics; rest also the API).
    rest_port: int = 9186
    scheduler_port: int = 9187
    launcher_port: int = 9188
    runtime_port: int = 9189
    monitor_port: int = 9190
    admin_user: str = "admin"
    # Where `pai up` writes the admin token it created at first start; a file already
    # there (the Helm chart's Secret) is the admin's token, which rest registers.
    admin_token_file: str = ""
    # Seconds between SIGTERM and SIGKILL when a task is stopped or preempted.
    grace_seconds: float = 10.0
    task_log_cap_bytes: int = 64 * 1024 * 1024
    node_sample_seconds: float = 5.0
    # A job's utilisation over time (docs/monitoring.md): points kept per task (older
    # ones merge as a job runs longer, so a task's history stays this size), and the
    # portal's idle-GPU flag: GPUs under job_idle_gpu_percent for job_idle_gpu_minutes.
    job_metrics_points: int = 360
    job_idle_gpu_percent: float = 5.0
    job_idle_gpu_minutes: float = 10.0
    # Grafana's address where PAI's dashboards are loaded (e.g. https://grafana.example.org):
    # the job page links the job's dashboard (pai-job); empty: no link.
    grafana_url: str = ""
    rules_file: str = ""  # failure rules to load instead of the shipped defaults
    # Storages declared at rest's start (docs/storage.md): a YAML list of declarations,
    # each written as the file has it; admins grant them to groups.
    storages_file: str = ""
    smtp_host: str = ""
    smtp_port: int = 25
    mail_from: str = "pai@localhost"
    admin_emails: str = ""  # comma-separated recipients of alert mail
    alert_rules_file: str = ""
    # --- alerts and mail (docs/alerts.md) ---
    # Log in to the SMTP server as smtp_user with the password in this file
    # (a mounted Secret); empty: no login.
    smtp_user: str = ""
    smtp_password_file: str = ""
    smtp_starttls: bool = False  # upgrade the connection with STARTTLS (port 587)
    smtp_ca_file: str = ""  # CA bundle the SMTP server's certificate is checked against; empty: the system's
    # Base URL people open PAI at, for the links in mail; empty: http://<host>:<rest_port>.
    portal_url: str = ""
    alert_evaluate_seconds: float = 15.0  # how often the cluster monitor evaluates the rules
    # A job rule fires for at most this many of one user's jobs at once (0: no bound):
    # a tenant whose jobs all fail raises that many JobFailed alerts, mails and tags,
    # not one per job (docs/alerts.md, "One user's many jobs").
    alert_max_job_alerts_per_user: int = 100
    # The /readyz the ServiceDown rule probes, "name=url,..."; empty: each
    # service's port on `host`; "-": probe none.
    alert_probe_urls: str = ""
    # Alertmanagers (base URLs, comma-separated) the cluster monitor also posts every
    # alert to (their v2 API), firing ones again every alertmanager_resend_seconds;
    # empty: none.
    alertmanager_urls: str = ""
    alertmanager_resend_seconds: float = 60.0
    # A URL that gets each alert notification as JSON (Alertmanager's webhook format;
    # docs/alerts.md), with the bearer token in alert_webhook_token_file if set.
    alert_webhook_url: str = ""
    alert_webhook_token_file: str = ""
    # The weekly usage report goes to admin_emails on this weekday (0 Monday .. 6
    # Sunday) at 08:00 UTC; -1: never (`pai report --send` still mails it).
    usage_report_weekday: int = 0
    kube_namespace: str = "default"
    kube_api_url: str = ""  # empty: in-cluster config or kubeconfig
    # Task Pods on the node's network (OpenPAI's way) rather than the Pod network:
    # an admin's choice for every job (services/launcher/backends/kube_pods.py).
    kube_host_network: bool = False
    # Whether a job may ask for its node's network itself (extraContainerOptions.hostNetwork).
    kube_job_host_network: bool = True
    # The uid and gid task containers run as (never root: the Pod's securityContext
    # is Kubernetes' "restricted" one).
    kube_task_uid: int = 1000
    kube_task_gid: int = 1000
    # PAI's launcher image (it holds OpenSSH): a task Pod of the ssh plugin gets the sshd
    # bundle from it through an init container, so the task's image need not have sshd.
    # Empty: no bundle; the plugin uses the image's own sshd where it has one.
    kube_ssh_image: str = ""
    log_level: str = "INFO"
    # Which replica this process is, for the single-active services' lease: a
    # process restarted as the same replica takes its own lease back at once, a
    # standby (another replica) waits until the lease expires. Empty: the host
    # name (one replica per host, one per pod on Kubernetes).
    replica: str = ""
    # --- security (issue: a platform safe to share) ---
    # NATS credentials of this process (each service has its own user; see
    # libs/common/busauth.py). Empty: connect without credentials.
    nats_user: str = ""
    # Its nkey seed ("SU..."), or a secret PAI derives the seed from (the chart's).
    nats_nkey_seed: str = ""
    nats_password: str = ""  # only for a NATS of your own that still uses passwords
    # The CA file a NATS server's certificate is checked against when nats_url says
    # tls:// (the Helm chart's nats.tls); empty: the system's CAs.
    nats_tls_ca_file: str = ""
    # Job secrets are sealed with the public key (rest) and opened with the
    # private key (the launcher alone). `pai up` generates both in the data dir.
    secrets_public_key_file: str = ""
    secrets_private_key_file: str = ""
    # Local backend: the unprivileged user task processes run as (when PAI runs
    # as root). Empty: `pai up` chooses/creates one; tasks never run as root.
    task_user: str = ""
    # Local backend: processes and threads per task (cgroup pids.max) and the bound
    # on a task's working directory in MiB (docs/local-isolation.md; 0: no bound).
    task_pids_max: int = 4096
    task_work_dir_mb: int = 10 * 1024
    # Local backend: the container engine tasks with an image run under
    # (docs/containers.md): "auto" (a podman or Docker socket that answers, else
    # podman's API service started by PAI, else none), "none" (every task a process
    # on the host) or the path of an engine's unix socket.
    container_engine: str = "auto"
    # rest: the argon2id cost of each password hash it makes (argon2-cffi's defaults,
    # 3 passes over 64 MiB: about 0.4 CPU s here). A hash carries its own cost, so a
    # change applies to passwords set from then on; the check of a name that does not
    # exist costs what a wrong password does at this cost.
    password_hash_time_cost: int = 3
    password_hash_memory_kib: int = 65536
    # rest: requests per bearer token, a token bucket (services/rest/ratelimit.py):
    # this many at once, refilled at this many per second; past it 429.
    rest_rate_limit_burst: int = 200
    rest_rate_limit_per_second: float = 100.0
    # rest: per-user quotas, so that no user fills the shared store for everyone
    # (docs/api.md "Quotas"; services/rest/quotas.py). Past a stored-jobs or token
    # limit 507, past the submissions in flight 429, each naming the limit. 0: no limit.
    # Jobs a user keeps stored (unfinished and finished: `pai delete` frees them).
    rest_user_max_jobs: int = 10_000
    # Bytes of a user's job records (spec, raw config with `extras`): 1/8 of the
    # job bucket's 1 GiB, so one user alone cannot fill it.
    rest_user_max_job_bytes: int = 128 * 1024 * 1024
    # Live tokens per user: past it a sign-in ends the user's oldest sign-in,
    # a new application token is refused.
    rest_user_max_tokens: int = 1000
    # Submissions of one user being taken at once by one rest process.
    rest_user_max_submissions_in_flight: int = 32

    # --- the one-node cluster of a laptop (no cluster_file; README "Quick start") ---
    # CPUs of this machine to offer (`pai up --cpus N`); 0: every CPU detected.
    local_cpus: int = 0
    # Without GPUs each core is this many CPU cells, so a 2-core laptop runs 8
    # one-CPU tasks at once (example jobs mostly print and wait). A cluster file keeps exact cells.
    cpu_oversubscription: int = 4
    # rest: how long bearer tokens live, in seconds (services/rest/identity):
    # from a login (`pai login`), an application token's default, and the most
    # anyone may ask for. The admin token `pai up` writes does not expire.
    rest_login_token_seconds: float = 7 * 86400.0
    rest_application_token_seconds: float = 90 * 86400.0
    rest_token_max_seconds: float = 366 * 86400.0
    # rest: seconds between heartbeat comments on GET /api/v2/events (SSE).
    rest_events_heartbeat_seconds: float = 15.0
    # A browser terminal in a task (GET /api/v2/jobs/{id}/terminal; services/launcher/terminals.py):
    # closed after this long with nothing typed (output alone does not keep it open); and at
    # most this many sessions open at once on one launcher (past it 503).
    terminal_idle_seconds: float = 900.0
    terminal_sessions_max: int = 64
    # --- every service's HTTP server, rest's API above all (docs/api.md "Abuse") ---
    # A request's header must arrive whole this long after the connection opened or
    # the previous answer was sent, or the connection is closed (slow-loris).
    http_header_timeout_seconds: float = 15.0
    # A request's body must arrive whole this long after its header: past it 408.
    http_body_timeout_seconds: float = 60.0
    # A connection idle this long between requests (keep-alive) is closed.
    http_keepalive_seconds: float = 75.0
    # Open connections at most, in all and from one peer address (behind a proxy the
    # proxy is one peer: raise the second); past them a new one gets 503 and is closed.
    # The total is kept under the process's file limit, which the service raises to its hard limit.
    http_max_connections: int = 8192
    http_max_connections_per_peer: int = 1024
    # The bus's NATS client (libs/common/bus/, docs/architecture.md "The bus"): "fast",
    # its own receive and send paths over nats-py's internals (bus/wire.py), or
    # "plain", nats-py's public API alone (a nats-py past the pinned one; ruling the
    # fast path out). Bus.connect reads PAI_BUS_CLIENT when not told.
    bus_client: Literal["fast", "plain"] = "fast"
    # --- the NATS store (docs/deploy.md; libs/common/jetstream_limits.py) ---
    # nats_url may list several servers of one NATS cluster, comma-separated
    # ("nats://a:4222,nats://b:4222"): a client moves to another when its own goes.
    # Copies of the event stream and every bucket, made by the platform's
    # bootstrap: 3 on a three-node JetStream cluster (one node may fail), 1 on a
    # single server.
    nats_replicas: int = 1
    # Overrides of jetstream_limits' table; 0 keeps the table's value.
    nats_events_max_bytes: int = 0
    nats_events_max_age_seconds: float = 0.0
    # How long a retried event is recognised by its id; also how long a deleted job's
    # name waits before it is used again (a new job's events must not pass for the old one's).
    nats_events_duplicate_window_seconds: float = 0.0
    nats_bucket_max_bytes: int = 0  # every bucket alike
    nats_max_message_bytes: int = 0  # the event stream and every bucket but the lease
    # GOMAXPROCS of the nats-server `pai up` runs (a NATS of your own is yours to tune);
    # 0: half this machine's cores, at least one. That server shares the machine with
    # the five services and the tasks: with a Go thread per core its scheduler spins
    # idle threads looking for work and moves goroutines between cores, and on two
    # cores that cost it a quarter more CPU per job (docs/throughput.md,
    # "nats-server's GOMAXPROCS").
    nats_embedded_max_procs: int = 0

    # --- node agent, node health and traces (docs/monitoring.md) ---
    # "agent": sample this node only; "cluster": node health, metrics of every
    # event, alerts; "both" (what `pai up` runs): one process does both.
    monitor_mode: str = "both"
    # The agent tells a task's processes by their environment (PAI_TASK_KEY and
    # OpenPAI's PAI_* variables); false: by their Kubernetes Pod's cgroup alone, never
    # reading another process's environment (the Helm chart's node agent: an
    # environment may hold a job's secrets).
    monitor_read_task_environ: bool = True
    # A node whose agent has been silent this long is lost: unhealthy, its tasks
    # are ended (exit spec PodNodeLost) and retried elsewhere.
    node_lost_seconds: float = 30.0
    # The data disk this full (percent used) makes a node unhealthy (disk pressure).
    node_disk_full_percent: float = 95.0
    # Memory this full (percent used) makes a node unhealthy (memory pressure).
    node_memory_full_percent: float = 98.0
    # OTLP/HTTP endpoint spans are exported to, e.g. http://otel-collector:4318;
    # empty: spans are not exported.
    otlp_endpoint: str = ""

    # --- retention (docs/reliability.md) ---
    # The launcher removes a finished job's task directories and logs this long
    # after the job ended (its record stays; asking for a log says it was
    # removed). 0: keep them forever.
    retention_finished_seconds: float = 7 * 86400.0
    # How often the launcher looks for finished jobs past that age.
    retention_sweep_seconds: float = 600.0

    # --- job history (services/rest/history; docs/deploy.md "History database") ---
    # rest's SQL database of every job's history, a projection of the event stream:
    # "postgresql+asyncpg://user:password@host:5432/pai" in production; empty: SQLite
    # at <data_dir>/history.sqlite (one host: replicas on other hosts need PostgreSQL).
    history_dsn: str = ""
    # A finished job's live records (pai_jobs, pai_schedule, pai_job_status) leave the
    # buckets this long after it finished, once the history holds it (job.archived); its
    # reads then come from the history. The launcher's record stays until its logs go
    # (retention_finished_seconds). Recent finished jobs stay live for quick reads.
    live_finished_job_seconds: float = 3600.0
    # And at most this many finished jobs stay live: past it the oldest-finished are
    # archived first, so every service's memory is bounded by count, not only by time,
    # however fast jobs finish (an hour at hundreds of jobs/s is ~10^6 jobs). 10,000 keeps
    # rest's index and each service's copies to tens of MiB, and minutes of finished jobs
    # live at tens of jobs/s; below ~3 jobs/s the hour above comes first.
    live_finished_job_max: int = 10_000
    # How often rest looks for finished jobs to archive and history rows to purge.
    history_sweep_seconds: float = 60.0
    # Finished jobs older than this many days leave the history database; 0: kept forever.
    history_retention_days: float = 0.0
    # Where rest runs the projection (events -> history rows) and the expiry sweep:
    # "process": a child process of each rest (services/rest/history/projector.py), at
    # `history_projection_nice` lower CPU priority, so under load the API's requests
    # come first and the history catches up in bigger batches; "inline": on rest's own
    # event loop (for a rest built inside another program, e.g. a test, whose bus the
    # child could not log in to).
    history_projection: Literal["process", "inline"] = "process"
    history_projection_nice: int = 10
    # --- sign-in through the organisation's identity provider (OIDC; docs/deploy.md
    # "Sign-in with OIDC"; services/rest/identity/oidc.py) ---
    # The provider's issuer URL (discovery at <issuer>/.well-known/openid-configuration); empty: off.
    oidc_issuer: str = ""
    oidc_client_id: str = ""
    # A file holding the client secret (a mounted Secret): never in the config or the logs.
    # Empty: a public client, PKCE alone.
    oidc_client_secret_file: str = ""
    # The callback registered at the provider, <PAI's URL>/api/v2/authn/oidc/return;
    # empty: the origin the browser called PAI at.
    oidc_redirect_url: str = ""
    oidc_scopes: str = "openid profile email"
    oidc_groups_claim: str = "groups"  # the ID token's (or userinfo's) list of directory groups
    oidc_username_claim: str = "email"  # OpenPAI's: the PAI user is the part before its '@'
    oidc_provider_name: str = ""  # the portal's "Sign in with <name>"; empty: the issuer's host
    # OpenPAI's groupConfig (admin-group, default-group, grouplist with externalName and
    # acls) as a YAML file: groups created at start if absent, their externalName set.
    oidc_group_config_file: str = ""
    # Password sign-in (POST /api/v2/authn/basic/login); false: OIDC and tokens only.
    basic_auth: bool = True

    @property
    def data_path(self) -> Path:
        return Path(self.data_dir).expanduser()

    @property
    def token_path(self) -> Path:
        return Path(self.admin_token_file).expanduser() if self.admin_token_file else self.data_path / "admin-token"

    def port_of(self, service: str) -> int:
        return int(getattr(self, f"{service}_port"))

    def to_env(self) -> dict[str, str]:
        """The environment that makes a child process load this same config."""
        return {f"PAI_{k.upper()}": str(v) for k, v in msgspec.structs.asdict(self).items()}


def load_config(path: str | Path | None = None, *, env: dict[str, str] | None = None, **overrides: Any) -> Config:
    env = dict(os.environ if env is None else env)
    values: dict[str, Any] = {}
    path = path or env.get("PAI_CONFIG")
    if path:
        try:
            loaded = yaml.safe_load(Path(path).read_text()) or {}
        except (OSError, yaml.YAMLError) as exc:
            raise BadInput(f"config file {path}: {exc}") from exc
        if not isinstance(loaded, dict):
            raise BadInput(f"config file {path}: expected a mapping at the top level")
        values.update(loaded)
    for field in msgspec.structs.fields(Config):
        key = f"PAI_{field.name.upper()}"
        if key in env:
            values[field.name] = env[key]
    values.update(overrides)
    try:
        return msgspec.convert(values, Config, strict=False)
    except msgspec.ValidationError as exc:
        raise BadInput(f"configuration: {exc}") from exc
