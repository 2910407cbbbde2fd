"""Every bound PAI puts on what it takes in, in one table.

Validation errors, rest's 4xx bodies and README.md quote these names and
numbers; change a bound here and nowhere else.

Why the numbers:
- Names become NATS subject tokens, KV keys, file names (`{user}~{name}` under
  the task log directory) and environment variable names. OpenPAI allows 255
  characters for a job name; PAI keeps the whole job id under 100 characters so
  that every derived name stays far below file system and NATS limits.
- A job travels as one NATS message (`job.submitted`, `job.placed`, the
  launcher's status document, which holds the job and about 1 KiB per placed
  task), and NATS refuses messages over 1 MiB: `instances: 2600` once made the
  launcher crash-loop. 512 tasks per job (OpenPAI's largest example job has 501),
  64 KiB of rendered commands per role and 128 KiB for the whole normalised job
  keep each of them under that (tests/unit/test_intake_limits.py checks the
  largest job allowed).
- Nesting: a job is about 8 levels deep; PyYAML's C composer recurses once per
  level and crashes the process at about 25,000, so depth is checked on the
  parser's events before anything is composed.
"""

from __future__ import annotations

# --- bodies -------------------------------------------------------------------
MAX_BODY_BYTES = 1024 * 1024  # a job document (YAML or JSON)
MAX_ADMIN_BODY_BYTES = 64 * 1024  # users, failure rules, executionType
MAX_NESTING_DEPTH = 64  # mappings and lists inside each other, any body

# --- names --------------------------------------------------------------------
MAX_JOB_NAME_LENGTH = 64
MAX_USERNAME_LENGTH = 32
MAX_NAME_LENGTH = 64  # virtual clusters, prerequisites, deployments
MAX_TASK_ROLE_NAME_LENGTH = 64
MAX_EMAIL_LENGTH = 254  # RFC 5321's limit on a path

# --- shape of a job -------------------------------------------------------------
MAX_TASK_ROLES = 32
MAX_INSTANCES_PER_ROLE = 512
MAX_TASKS_PER_JOB = 512  # OpenPAI's largest example job has 501
MAX_COMMANDS_CHARS_PER_ROLE = 64 * 1024  # after templates are rendered, pre/post commands included
MAX_SPEC_BYTES = 128 * 1024  # the normalised job as it travels on the bus

# --- resources per task instance ----------------------------------------------
MAX_CPU = 1024
MAX_MEMORY_MB = 16 * 1024 * 1024  # 16 TiB
MAX_GPU = 64
MAX_PORTS_PER_INSTANCE = 100  # all port labels together
MAX_SHM_MB = MAX_MEMORY_MB
MAX_SKU_NUMBER = 1024  # extras.hivedScheduler.taskRoles.<role>.skuNumber: leaf cells per task

# --- retries ------------------------------------------------------------------
MAX_JOB_RETRY_COUNT = 100
MAX_TASK_RETRY_COUNT = 100

# --- marketplace items (services/rest/market) ----------------------------------------
# An item is one KV value in pai_market; these keep one under MAX_MARKET_ITEM_BYTES.
MAX_MARKET_BODY_BYTES = 192 * 1024  # a create, change or import request
MAX_MARKET_ITEM_ID_LENGTH = 64  # letters, digits, _ and - (a KV key token and a URL segment)
MAX_MARKET_NAME_LENGTH = 64
MAX_MARKET_SUMMARY_CHARS = 256
MAX_MARKET_DESCRIPTION_CHARS = 32 * 1024  # Markdown
MAX_MARKET_PROTOCOL_BYTES = 64 * 1024  # a template's job YAML
MAX_MARKET_URI_LENGTH = 1024  # a data item's storage path or URI
MAX_MARKET_CATEGORY_LENGTH = 32
MAX_MARKET_TAGS = 16
MAX_MARKET_TAG_LENGTH = 32
MAX_MARKET_GROUPS = 32  # groups an item is shared with
MAX_MARKET_REVIEW_NOTE_CHARS = 512
MAX_MARKET_ITEMS_PER_USER = 100
MAX_MARKET_ITEMS = 2000  # in all; the bucket's size follows (libs/common/jetstream_limits.py)
MAX_MARKET_SWEEP_JOBS = 16  # jobs one hyper-parameter sweep makes
MAX_MARKET_ITEM_BYTES = 160 * 1024  # the stored record
