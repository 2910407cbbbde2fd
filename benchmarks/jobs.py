"""The job the platform benchmarks submit: one task of `true`, one CPU, as OpenPAI v2 YAML."""

TRIVIAL_JOB = """protocolVersion: 2
name: {name}
type: job
taskRoles:
  main:
    instances: 1
    resourcePerInstance: {{cpu: 1, memoryMB: 256, gpu: 0}}
    commands: ["true"]
"""


def trivial_job(name: str) -> bytes:
    """The trivial job named `name`, as the body of a submission."""
    return TRIVIAL_JOB.format(name=name).encode()
