"""Classifying a task exit with the rules: which rule explains it, and why.

Matching follows OpenPAI's exit spec:
- exit code 0 with no platform reason is a success (code 0, "Succeeded");
- otherwise the rules are tried in order and the first one with a matching
  pattern decides; a pattern matches when all its fields match;
- an exit no rule recognises falls back to OpenPAI's catch-all codes: 255
  (PAIRuntimeUnknownFailed) for an ordinary non-zero exit code, and the shadow
  codes -8000 (negative) and 256 (above 255), which expose the raw exit code;
- a Python SyntaxError in the output always means NEVER_RETRY, whichever rule
  decided: rerunning the same source cannot help, whatever jobRetryCount says.

What is matched against what:
- `exitCode`: the task's exit code; a task killed by signal n counts as
  128 + n, as a shell reports it;
- `userLogRegex`: the last 64 KiB of the task's output;
- `platformLogRegex`: `platformReason + "\\n" + platformMessage`;
- pod `reasonRegex` / `messageRegex`: `platformReason` / `platformMessage`;
- container `reasonRegex`, `nameRegex`, `exitCode`: the platform reason without
  Kubernetes' `Init:` prefix, `init` for such a reason or else the task role,
  and the exit code.
An exit with code 0 but a platform reason (e.g. stopped while it was exiting)
only counts as a failure when platform evidence matches: a pattern with a
platform regex or a pod pattern; output alone never turns a success into one.

Speed: every regex searched in the same text goes into one RE2 set, so the
output is scanned once for all rules, in time linear in its size.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import msgspec
import re2

from libs.common.exitspecs import (
    BUILTIN,
    SUCCEEDED_EXIT_CODE as SUCCESS_CODE,
    UNDEFINED_NEGATIVE_CODE,
    UNDEFINED_POSITIVE_CODE,
    UNKNOWN_FAILURE_CODE,
)
from libs.common.messages import ExitSpec, Reaction, TaskExited
from services.runtime.core.model import Classification, Rule
from services.runtime.core.regexes import Regex, compile_regex, re2_options
from services.runtime.core.validation import RuleError

# Only the end of a log explains a failure; the rest would only cost time.
LOG_LIMIT_BYTES = 64 * 1024
MAX_MATCHED_LINES = 3
MAX_TAIL_LINES = 5
MAX_DIAGNOSTICS = 8
MAX_LINE_CHARS = 300

# Python reports source that does not compile with one of these as the last
# line, possibly behind a launcher's prefix such as torchrun's `[rank0]:`.
_SYNTAX_ERROR_REGEX = r"(?m)^(\[[^\]\n]*\]:?)?[ \t]*(SyntaxError|IndentationError|TabError): "


class _RegexBank:
    """The distinct regexes searched in one kind of text, matched in one pass.

    RE2's set matcher reports which regexes match anywhere in the text. It
    quietly reports nothing when its automaton runs out of memory, so a
    sentinel regex that always matches (`\\z`) tells a real "no match" from a
    failure; then each regex is searched on its own (RE2 again: still linear).
    """

    def __init__(self) -> None:
        self._index: dict[str, int] = {}
        self.regexes: list[Regex] = []
        self._set: re2.Set | None = None
        self._sentinel = -1

    def add(self, pattern: str) -> int:
        if pattern not in self._index:
            self._index[pattern] = len(self.regexes)
            self.regexes.append(compile_regex(pattern))
        return self._index[pattern]

    def compile(self) -> None:
        if not self.regexes:
            return
        regex_set = re2.Set.SearchSet(re2_options())
        for regex in self.regexes:
            regex_set.Add(regex.pattern)
        self._sentinel = regex_set.Add(r"\z")
        regex_set.Compile()
        self._set = regex_set

    def hits(self, text: bytes) -> frozenset[int]:
        if self._set is None:
            return frozenset()
        found = self._set.Match(text) or []
        if self._sentinel in found:
            return frozenset(index for index in found if index != self._sentinel)
        return frozenset(index for index, regex in enumerate(self.regexes) if regex.search(text))


@dataclass(frozen=True, slots=True)
class _RuntimeCheck:
    exit_code: int | None
    user_log: int | None  # index in the user-log bank
    platform_log: int | None
    needs_gpu_info: bool


@dataclass(frozen=True, slots=True)
class _ContainerCheck:
    name: int | None
    reason: int | None
    message: int | None
    exit_code: int | None


@dataclass(frozen=True, slots=True)
class _PodCheck:
    reason: int | None
    message: int | None
    containers: tuple[_ContainerCheck, ...]


@dataclass(frozen=True, slots=True)
class _CompiledRule:
    rule: Rule
    runtime: tuple[_RuntimeCheck, ...]
    pod: tuple[_PodCheck, ...]


class _Banks:
    def __init__(self) -> None:
        self.user_log = _RegexBank()
        self.platform_log = _RegexBank()
        self.pod_reason = _RegexBank()
        self.container_reason = _RegexBank()
        self.container_name = _RegexBank()
        self.message = _RegexBank()

    def compile(self) -> None:
        for bank in vars(self).values():
            bank.compile()


class _Exit:
    """One exit's texts, cut and encoded once; regex hits computed on demand."""

    def __init__(self, banks: _Banks, exit: TaskExited) -> None:
        self._banks = banks
        self.code = effective_exit_code(exit)
        self.platform_reason = exit.platformReason
        message = cut_log(exit.platformMessage)
        self.user_log = cut_log(exit.userLogTail)
        self.platform_log = exit.platformReason.encode("utf-8", "replace") + b"\n" + message
        self.pod_reason = exit.platformReason.encode("utf-8", "replace")
        self.message = message
        init_reason = exit.platformReason.removeprefix("Init:")
        in_init = init_reason != exit.platformReason
        self.container_reason = init_reason.encode("utf-8", "replace")
        self.container_name = b"init" if in_init else exit.role.encode("utf-8", "replace")

    @cached_property
    def user_log_hits(self) -> frozenset[int]:
        return self._banks.user_log.hits(self.user_log)

    @cached_property
    def platform_log_hits(self) -> frozenset[int]:
        return self._banks.platform_log.hits(self.platform_log)

    @cached_property
    def pod_reason_hits(self) -> frozenset[int]:
        return self._banks.pod_reason.hits(self.pod_reason)

    @cached_property
    def container_reason_hits(self) -> frozenset[int]:
        return self._banks.container_reason.hits(self.container_reason)

    @cached_property
    def container_name_hits(self) -> frozenset[int]:
        return self._banks.container_name.hits(self.container_name)

    @cached_property
    def message_hits(self) -> frozenset[int]:
        return self._banks.message.hits(self.message)


class RuleEngine:
    """Explains task exits with an ordered rule set. Immutable once built:
    to change the rules, build a new engine and swap it in."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules: tuple[Rule, ...] = tuple(rules)
        self._by_code = {rule.code: rule for rule in self.rules}
        self._banks = _Banks()
        problems: list[tuple[str, str]] = []
        self._compiled = tuple(self._compile(rule, index, problems) for index, rule in enumerate(self.rules))
        if problems:
            raise RuleError(problems)
        self._syntax_error = self._banks.user_log.add(_SYNTAX_ERROR_REGEX)
        self._banks.compile()

    def spec_for(self, code: int) -> ExitSpec | None:
        """The spec of the rule with this code (e.g. to report a stop), if any."""
        if code in self._by_code:
            return self._by_code[code].to_spec()
        return BUILTIN.get(code)

    def classify(self, exit: TaskExited) -> Classification:
        if effective_exit_code(exit) == SUCCESS_CODE and not exit.platformReason:
            return self._success()
        facts = _Exit(self._banks, exit)
        platform_only = facts.code == SUCCESS_CODE
        for compiled in self._compiled:
            for check in compiled.runtime:
                if self._runtime_matches(check, facts, platform_only):
                    return self._verdict(compiled.rule, facts, self._runtime_diagnostics(check, facts))
            for pod in compiled.pod:
                if self._pod_matches(pod, facts):
                    return self._verdict(compiled.rule, facts, [_platform_line(exit)])
        return self._fallback(exit, facts)

    # --- matching -----------------------------------------------------------

    @staticmethod
    def _runtime_matches(check: _RuntimeCheck, facts: _Exit, platform_only: bool) -> bool:
        if check.needs_gpu_info:
            return False
        if platform_only and check.platform_log is None:
            return False
        if check.exit_code is not None and check.exit_code != facts.code:
            return False
        if check.platform_log is not None and check.platform_log not in facts.platform_log_hits:
            return False
        return check.user_log is None or check.user_log in facts.user_log_hits

    @staticmethod
    def _pod_matches(pod: _PodCheck, facts: _Exit) -> bool:
        if pod.reason is not None and pod.reason not in facts.pod_reason_hits:
            return False
        if pod.message is not None and pod.message not in facts.message_hits:
            return False
        for container in pod.containers:
            if container.exit_code is not None and container.exit_code != facts.code:
                return False
            if container.reason is not None and container.reason not in facts.container_reason_hits:
                return False
            if container.name is not None and container.name not in facts.container_name_hits:
                return False
            if container.message is not None and container.message not in facts.message_hits:
                return False
        return True

    # --- verdicts -----------------------------------------------------------

    def _success(self) -> Classification:
        spec = self.spec_for(SUCCESS_CODE)
        assert spec is not None
        return Classification(spec=spec, diagnostics=[], rule_code=SUCCESS_CODE)

    def _verdict(self, rule: Rule, facts: _Exit, diagnostics: list[str]) -> Classification:
        return self._finish(Classification(spec=rule.to_spec(), diagnostics=diagnostics, rule_code=rule.code), facts)

    def _fallback(self, exit: TaskExited, facts: _Exit) -> Classification:
        if facts.code == SUCCESS_CODE:  # a platform reason that no rule treats as a failure
            return self._success()
        if facts.code < 0:
            rule_code = UNDEFINED_NEGATIVE_CODE
        elif facts.code > 255:
            rule_code = UNDEFINED_POSITIVE_CODE
        else:
            rule_code = UNKNOWN_FAILURE_CODE
        spec = self.spec_for(rule_code)
        assert spec is not None
        if rule_code != UNKNOWN_FAILURE_CODE:
            # OpenPAI's shadow codes stand for "any undefined code": the raw
            # code is what people can compare between jobs, so it is exposed.
            spec = msgspec.structs.replace(spec, code=facts.code)
        diagnostics = [_platform_line(exit)] if exit.platformReason else []
        diagnostics += _last_lines(facts.user_log)
        return self._finish(Classification(spec=spec, diagnostics=diagnostics, rule_code=rule_code), facts)

    def _finish(self, verdict: Classification, facts: _Exit) -> Classification:
        """Never retry a Python syntax error; keep the diagnostics short."""
        if (
            verdict.spec.reaction == Reaction.NEVER_RETRY
            or facts.platform_reason
            or self._syntax_error not in facts.user_log_hits
        ):
            if len(verdict.diagnostics) <= MAX_DIAGNOSTICS:
                return verdict
            return msgspec.structs.replace(verdict, diagnostics=verdict.diagnostics[:MAX_DIAGNOSTICS])
        lines = _matched_lines(self._banks.user_log.regexes[self._syntax_error], facts.user_log)
        return Classification(
            spec=msgspec.structs.replace(verdict.spec, reaction=Reaction.NEVER_RETRY),
            diagnostics=_unique(lines + verdict.diagnostics)[:MAX_DIAGNOSTICS],
            rule_code=verdict.rule_code,
        )

    def _runtime_diagnostics(self, check: _RuntimeCheck, facts: _Exit) -> list[str]:
        if check.user_log is not None:
            return _matched_lines(self._banks.user_log.regexes[check.user_log], facts.user_log)
        if check.platform_log is not None:
            return _matched_lines(self._banks.platform_log.regexes[check.platform_log], facts.platform_log)
        return _last_lines(facts.user_log)  # an exit code alone: the end of the log tells the story

    # --- compiling ----------------------------------------------------------

    def _compile(self, rule: Rule, index: int, problems: list[tuple[str, str]]) -> _CompiledRule:
        where = f"rules[{index}].pattern"
        pattern = rule.pattern
        if pattern is None:
            return _CompiledRule(rule=rule, runtime=(), pod=())

        def add(bank: _RegexBank, regex: str | None, path: str) -> int | None:
            if regex is None:
                return None
            try:
                return bank.add(regex)
            except ValueError as error:
                problems.append((path, f"not a valid regex ({error})"))
                return None

        banks = self._banks
        runtime = []
        for i, item in enumerate(pattern.runtimeContainerPatterns):
            path = f"{where}.runtimeContainerPatterns[{i}]"
            runtime.append(
                _RuntimeCheck(
                    exit_code=item.exitCode,
                    user_log=add(banks.user_log, item.userLogRegex, f"{path}.userLogRegex"),
                    platform_log=add(banks.platform_log, item.platformLogRegex, f"{path}.platformLogRegex"),
                    needs_gpu_info=bool(item.gpuInfo),
                )
            )
        pod = []
        for i, pod_pattern in enumerate(pattern.controllerPodPatterns):
            path = f"{where}.controllerPodPatterns[{i}]"
            containers = tuple(
                _ContainerCheck(
                    name=add(banks.container_name, c.nameRegex, f"{path}.containers[{j}].nameRegex"),
                    reason=add(banks.container_reason, c.reasonRegex, f"{path}.containers[{j}].reasonRegex"),
                    message=add(banks.message, c.messageRegex, f"{path}.containers[{j}].messageRegex"),
                    exit_code=c.exitCode,
                )
                for j, c in enumerate(pod_pattern.containers)
            )
            pod.append(
                _PodCheck(
                    reason=add(banks.pod_reason, pod_pattern.reasonRegex, f"{path}.reasonRegex"),
                    message=add(banks.message, pod_pattern.messageRegex, f"{path}.messageRegex"),
                    containers=containers,
                )
            )
        return _CompiledRule(rule=rule, runtime=tuple(runtime), pod=tuple(pod))


def effective_exit_code(exit: TaskExited) -> int:
    """The exit code rules see: a signal death counts as 128 + signal."""
    if exit.signal and exit.signal > 0 and exit.exitCode <= 0:
        return 128 + exit.signal
    return exit.exitCode


def cut_log(text: str, limit: int = LOG_LIMIT_BYTES) -> bytes:
    """The last `limit` bytes of `text` as UTF-8, starting on a character."""
    if len(text) <= limit // 4:  # cannot exceed the limit: skip the cut
        return text.encode("utf-8", "replace")
    data = text.encode("utf-8", "replace")
    if len(data) <= limit:
        return data
    data = data[-limit:]
    start = 0
    while start < len(data) and start < 4 and 0x80 <= data[start] < 0xC0:  # a character's continuation bytes
        start += 1
    return data[start:]


def _matched_lines(regex: Regex, text: bytes) -> list[str]:
    lines: list[str] = []
    for match in regex.finditer(text):
        line = _line_at(text, match.start())
        if line and line not in lines:
            lines.append(line)
        if len(lines) >= MAX_MATCHED_LINES:
            break
    return lines


def _line_at(text: bytes, offset: int) -> str:
    while offset < len(text) and text[offset] in b"\r\n":
        offset += 1
    start = max(text.rfind(b"\n", 0, offset), text.rfind(b"\r", 0, offset)) + 1
    ends = [end for end in (text.find(b"\n", offset), text.find(b"\r", offset)) if end != -1]
    end = min(ends) if ends else len(text)
    if end - start > MAX_LINE_CHARS:
        # Keep the part around the match of a very long line (progress bars).
        start = max(start, offset - MAX_LINE_CHARS // 4)
        end = min(end, start + MAX_LINE_CHARS)
    return text[start:end].decode("utf-8", "replace").strip()


def _last_lines(text: bytes) -> list[str]:
    tail = text[-(MAX_TAIL_LINES * MAX_LINE_CHARS * 2) :].decode("utf-8", "replace")
    lines = [line.strip() for line in tail.splitlines() if line.strip()]
    return [line[:MAX_LINE_CHARS] for line in lines[-MAX_TAIL_LINES:]]


def _platform_line(exit: TaskExited) -> str:
    lines = exit.platformMessage[: MAX_LINE_CHARS * 4].strip().splitlines()
    message = lines[0] if lines else ""
    line = f"{exit.platformReason}: {message}" if message else exit.platformReason
    return line[:MAX_LINE_CHARS]


def _unique(lines: list[str]) -> list[str]:
    return list(dict.fromkeys(lines))
