"""parse_job: body in, JobSpec out, or every reason the body was rejected."""

from __future__ import annotations

import msgspec

from libs.common.errors import TooLarge
from libs.common.protocol.commands import referenced_secrets
from libs.common.protocol.document import load_document
from libs.common.protocol.limits import MAX_BODY_BYTES, MAX_SPEC_BYTES
from libs.common.protocol.masking import masked_config, scrub_errors, secret_values
from libs.common.protocol.model import FieldError, JobSpec, ProtocolError
from libs.common.protocol.normalise import build_job_spec
from libs.common.protocol.paths import RawMapping, format_path
from libs.common.protocol.validate import validate_document

ERROR_CODE = "InvalidJobConfigError"


class ParsedJob(msgspec.Struct, frozen=True, kw_only=True):
    spec: JobSpec
    # The submitted document with secret values masked, for GET .../config.
    config: RawMapping
    # One line per field PAI keeps but does not act on, for the submitter.
    warnings: list[str] = []
    # The job's secrets when its commands use them ({} otherwise): rest seals
    # them for the launcher; they are in no other field (commands keep the
    # references, see render.py). Never encode a ParsedJob whole.
    secrets: RawMapping = {}


def parse_job(body: bytes | str, *, content_type: str = "text/yaml", user: str) -> ParsedJob:
    """Parse, validate, normalise and render one OpenPAI v2 job document.

    Raises errors.TooLarge above MAX_BODY_BYTES and ProtocolError listing every
    problem found, in document order.
    """
    size = len(body) if isinstance(body, bytes) else len(body.encode("utf-8", "surrogatepass"))
    if size > MAX_BODY_BYTES:
        raise TooLarge(f"the job config is {size} bytes; the limit is {MAX_BODY_BYTES} bytes",
                       details={"size": size, "limit": MAX_BODY_BYTES})
    document = load_document(body, content_type)
    errors, ignored = validate_document(document.data, document.line_of)
    if errors:
        by_line = sorted(errors, key=lambda e: e.line if e.line is not None else 0)
        raise ProtocolError(scrub_errors(by_line, secret_values(document.data)))
    ignored_fields = [format_path(item.path) for item in ignored]
    spec = build_job_spec(document.data, user=user, ignored_fields=ignored_fields)
    _check_spec_size(spec)
    return ParsedJob(
        spec=spec,
        config=masked_config(document.data),
        # Sealed when a command or an image's registry credentials use them.
        secrets=referenced_secrets(
            document.data, [[*role.commands, *(role.dockerImageAuth or {}).values()] for role in spec.taskRoles]
        ),
        warnings=[f"{format_path(item.path)}: kept but not acted on ({item.reason})" for item in ignored],
    )


def _check_spec_size(spec: JobSpec) -> None:
    """The normalised job travels in one NATS message; with deployments' commands
    folded into every role it can be larger than the document, so it is measured
    as it will travel."""
    size = len(msgspec.json.encode(spec))
    if size > MAX_SPEC_BYTES:
        raise ProtocolError([FieldError(
            path="$", rule="maxSize",
            message=f"the normalised job is {size} bytes; PAI's limit is {MAX_SPEC_BYTES} bytes",
        )])


def protocol_error_body(err: ProtocolError) -> dict[str, object]:
    """The machine-readable 400 body rest sends for a rejected job."""
    count = len(err.errors)
    first = err.errors[0] if err.errors else None
    summary = f"{first.path}: {first.message}" if first is not None else "the job config is invalid"
    more = f" (and {count - 1} more)" if count > 1 else ""
    return {
        "code": ERROR_CODE,
        "message": f"The job config is invalid: {summary}{more}",
        "errors": [_error_item(error) for error in err.errors],
    }


def _error_item(error: FieldError) -> dict[str, object]:
    return {"path": error.path, "rule": error.rule, "message": error.message, "line": error.line}
