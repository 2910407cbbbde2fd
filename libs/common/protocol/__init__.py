"""The OpenPAI job protocol v2: parse, validate, normalise and render a job.

    parsed = parse_job(body, content_type="text/yaml", user="alice")
    parsed.spec      # JobSpec: what every service reads
    parsed.config    # the submitted document, secrets masked (GET .../config)
    parsed.warnings  # fields kept but not acted on

A rejected document raises ProtocolError with every problem found;
`protocol_error_body` turns it into the 400 body.
"""

from libs.common.protocol.limits import MAX_BODY_BYTES
from libs.common.protocol.model import FieldError, JobSpec, ProtocolError
from libs.common.protocol.parse import ParsedJob, parse_job, protocol_error_body

__all__ = [
    "MAX_BODY_BYTES",
    "FieldError",
    "JobSpec",
    "ParsedJob",
    "ProtocolError",
    "parse_job",
    "protocol_error_body",
]
