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


def image_job(name: str, image: str) -> bytes:
    """The trivial job in a container of `image` (its role's dockerImage)."""
    body = TRIVIAL_JOB.format(name=name).replace("    instances: 1\n", "    instances: 1\n    dockerImage: img\n")
    return (body + f"prerequisites:\n  - name: img\n    type: dockerimage\n    uri: {image}\n").encode()
