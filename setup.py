"""The one C extension of PAI, built when a compiler is there (pyproject.toml
holds the project's metadata; setuptools reads both).

services.launcher.backends._spawn_as starts a task as another user with vfork +
exec (local_shim._fork_exec_as). It is optional: without a C compiler the
install still succeeds and the shim falls back to subprocess's fork + exec,
which costs more CPU per task; the launcher's startup log says which is in use.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "services.launcher.backends._spawn_as",
            sources=["services/launcher/backends/_spawn_as.c"],
            optional=True,
        )
    ]
)
