"""OpenPAI's command templates: `<% $parameters.x %>`, `<% $secrets.x %>`, `<% $data.uri[0] %>`.

A reference is `$<root>` followed by `.key` and `[index]` steps. Roots:

- `parameters`, `secrets`: the job's top-level sections, shared by all task roles;
- `script`, `data`, `output`: the prerequisite the task role selects with its
  `script:` / `data:` / `output:` field (any of its fields: name, uri, version, ...).

Spaces inside the brackets are optional (`<%$parameters.x%>` is OpenPAI's own
spelling too). Values are rendered the way OpenPAI's JavaScript renderer prints
them: booleans as `true`/`false`, null as empty, a list of plain values joined by
commas; a mapping is rendered as JSON. Shell variables (`$PAI_WORK_DIR`) are not
templates and are left for the shell.

Secrets are rendered late: at intake `render(..., keep_secrets=True)` checks a
`<% $secrets.x %>` reference and writes it back in its canonical form
(`<% $secrets.x %>`), so the JobSpec, the events and the buckets carry the
reference, never the value; the launcher, the only service that can open the
job's sealed secrets, fills them in with `render_secrets` just before the task
starts. (A parameter whose value happens to spell a secret reference is filled
in too: it is the job's own secret, given to the job's own task.)
"""

from __future__ import annotations

import json
import re

import msgspec

from libs.common.protocol.paths import RawMapping

TEMPLATE = re.compile(r"<%\s*(\$[^%]*?)\s*%>")
# Every template starts so: a line without it renders as itself.
TEMPLATE_START = "<%"
REFERENCE = re.compile(r"^\$(?P<root>[A-Za-z_][A-Za-z0-9_]*)(?P<steps>(?:\.[A-Za-z0-9_-]+|\[\d+\])*)$")
STEP = re.compile(r"\.([A-Za-z0-9_-]+)|\[(\d+)\]")

SHARED_ROOTS = ("parameters", "secrets")
PREREQUISITE_ROOTS = ("script", "data", "output")


class UnknownReference(Exception):
    """A template names something the job does not define; the message never holds a value."""


class RenderContext(msgspec.Struct, frozen=True, kw_only=True):
    parameters: RawMapping = {}
    secrets: RawMapping = {}
    # "script" / "data" / "output" -> the prerequisite the task role selected
    selected: dict[str, RawMapping] = {}


# A secret reference in its canonical form, as the JobSpec keeps it.
SECRET_TEMPLATE = re.compile(r"<%\s*(\$secrets(?:\.[A-Za-z0-9_-]+|\[\d+\])*)\s*%>")


def references(text: str) -> list[str]:
    return [match.group(1) for match in TEMPLATE.finditer(text)]


def render(text: str, context: RenderContext, *, keep_secrets: bool = False) -> str:
    """Replace every template in `text`; raises UnknownReference for the first unresolved one.

    With `keep_secrets`, a secret reference is checked and kept (canonically
    spelled) for `render_secrets` to fill in later.
    """

    def replace(match: re.Match[str]) -> str:
        reference = match.group(1)
        value = resolve(reference, context)
        if keep_secrets and reference.startswith("$secrets"):
            parsed = REFERENCE.match(reference)  # it resolved, so it parses
            if parsed is not None and parsed.group("root") == "secrets":
                return f"<% {reference} %>"
        return _to_text(value)

    return TEMPLATE.sub(replace, text)


def has_secret_references(lines: list[str]) -> bool:
    """Whether any line still holds a secret reference (cheap: no secret is needed)."""
    return any("$secrets" in line and SECRET_TEMPLATE.search(line) for line in lines)


def render_secrets(text: str, secrets: RawMapping) -> str:
    """Fill in the secret references `render(..., keep_secrets=True)` kept.

    A reference the secrets do not resolve is left as it is (intake checked
    every reference the job wrote; one that slipped in through a parameter's
    value is not ours to reject)."""
    context = RenderContext(secrets=secrets)

    def replace(match: re.Match[str]) -> str:
        try:
            return _to_text(resolve(match.group(1), context))
        except UnknownReference:
            return match.group(0)

    return SECRET_TEMPLATE.sub(replace, text)


def unresolved(text: str, context: RenderContext) -> list[str]:
    """Messages for every template in `text` that cannot be resolved (for validation)."""
    problems = []
    for reference in references(text):
        try:
            resolve(reference, context)
        except UnknownReference as exc:
            problems.append(str(exc))
    return problems


def resolve(reference: str, context: RenderContext) -> object:
    parsed = REFERENCE.match(reference)
    if parsed is None:
        raise UnknownReference(f"'<% {reference} %>' is not a reference PAI understands "
                               "(expected e.g. <% $parameters.name %>)")
    root = parsed.group("root")
    if root in SHARED_ROOTS:
        value: object = context.parameters if root == "parameters" else context.secrets
    elif root in PREREQUISITE_ROOTS:
        if root not in context.selected:
            raise UnknownReference(f"{reference} is used but this task role selects no {root} prerequisite "
                                   f"(set `{root}:` in the task role)")
        value = context.selected[root]
    else:
        raise UnknownReference(f"{reference}: ${root} is not a known reference; use one of "
                               "$parameters, $secrets, $script, $data, $output")
    walked = f"${root}"
    for step in STEP.finditer(parsed.group("steps")):
        key, index = step.group(1), step.group(2)
        if key is not None:
            if not isinstance(value, dict) or _lookup(value, key) is _MISSING:
                raise UnknownReference(f"{reference}: {walked} has no {key!r}" if walked != f"${root}"
                                       else _missing_message(root, key, reference))
            value = _lookup(value, key)
            walked += f".{key}"
        else:
            position = int(index)
            if not isinstance(value, list) or position >= len(value):
                raise UnknownReference(f"{reference}: {walked} has no item [{position}]")
            value = value[position]
            walked += f"[{position}]"
    return value


_MISSING = object()


def _lookup(mapping: RawMapping, key: str) -> object:
    if key in mapping:
        return mapping[key]
    # YAML keys may be numbers or booleans (`1: x`); a template can only spell them as text.
    for candidate, value in mapping.items():
        if not isinstance(candidate, str) and _to_text(candidate) == key:
            return value
    return _MISSING


def _missing_message(root: str, key: str, reference: str) -> str:
    if root in SHARED_ROOTS:
        return f"{reference}: no {root[:-1]} named {key!r} is defined in `{root}`"
    return f"{reference}: the selected {root} prerequisite has no field {key!r}"


def _to_text(value: object) -> str:
    match value:
        case bool():
            return "true" if value else "false"
        case None:
            return ""
        case str():
            return value
        case list() if all(not isinstance(item, (dict, list)) for item in value):
            return ",".join(_to_text(item) for item in value)
        case dict() | list():
            return json.dumps(value, default=str, separators=(",", ":"))
        case _:
            return str(value)
