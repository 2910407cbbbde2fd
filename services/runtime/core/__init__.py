"""The runtime's failure analysis: OpenPAI exit-spec rules applied to task exits.

Pure and synchronous: no I/O besides reading a rule file when asked to. The
service shell feeds `TaskExited` events to `RuleEngine.classify` and publishes
the verdicts; admins change rules through `RuleBook` (versions, edits, answers),
whose stored value the shell reads and writes.
"""

from services.runtime.core.engine import LOG_LIMIT_BYTES, RuleEngine, cut_log, effective_exit_code
from services.runtime.core.loading import DEFAULT_RULES_PATH, default_rules, load_rules
from services.runtime.core.model import (
    Classification,
    ContainerPattern,
    ExitPattern,
    PodPattern,
    Rule,
    RuntimePattern,
)
from services.runtime.core.regexes import MAX_PROGRAM_SIZE, MAX_REGEX_LENGTH, regex_problems
from services.runtime.core.rulebook import RuleBook, RuleSet
from services.runtime.core.validation import RuleError, validate_rule

__all__ = [
    "DEFAULT_RULES_PATH",
    "LOG_LIMIT_BYTES",
    "MAX_PROGRAM_SIZE",
    "MAX_REGEX_LENGTH",
    "Classification",
    "ContainerPattern",
    "ExitPattern",
    "PodPattern",
    "Rule",
    "RuleBook",
    "RuleEngine",
    "RuleError",
    "RuleSet",
    "RuntimePattern",
    "cut_log",
    "default_rules",
    "effective_exit_code",
    "load_rules",
    "regex_problems",
    "validate_rule",
]
