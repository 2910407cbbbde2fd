# syntax=docker/dockerfile:1
# One image per PAI service, all from this file. Build from the repository root:
#   docker build --build-arg SERVICE=scheduler -t pai-scheduler:0.1.0 .
#
# The "build" stage does not depend on SERVICE, so BuildKit builds and installs the
# project once and every service image reuses those layers.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# gcc for the launcher's C extension (setup.py: _spawn_as, vfork + exec of tasks run as
# other users); only this stage has it, the service image gets the built module.
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py ./
COPY libs ./libs
COPY services ./services
COPY cli ./cli
RUN pip install --prefix=/install .

FROM python:3.11-slim
# rest, scheduler, launcher, runtime or monitor.
ARG SERVICE
# The commit the image is built from, for pai_build_info (--build-arg PAI_BUILD_COMMIT=$(git rev-parse HEAD)).
ARG PAI_BUILD_COMMIT=unknown
RUN case "$SERVICE" in rest|scheduler|launcher|runtime|monitor) ;; \
      *) echo "--build-arg SERVICE= must name one of rest scheduler launcher runtime monitor" >&2; exit 1 ;; esac
# The launcher's image holds OpenSSH and libnss_wrapper too: on Kubernetes, a task Pod of the
# ssh plugin gets its sshd bundle from them through an init container running this image
# (kube_ssh_image; services/launcher/backends/ssh_bundle.py), whatever the task's image.
RUN if [ "$SERVICE" = launcher ]; then apt-get update \
 && apt-get install -y --no-install-recommends openssh-server openssh-client libnss-wrapper \
 && rm -rf /var/lib/apt/lists/*; fi
# The service's HTTP port is its PAI setting (PAI_<SERVICE>_PORT, default 9186 ... 9190),
# so the health check asks PAI's own config rather than repeating the number here.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PAI_SERVICE=${SERVICE} \
    PAI_BUILD_COMMIT=${PAI_BUILD_COMMIT} \
    PAI_HOST=0.0.0.0 \
    PAI_DATA_DIR=/var/lib/pai
COPY --from=build /install /usr/local
# A fixed non-root uid, so Kubernetes' runAsNonRoot can check it.
RUN groupadd --system --gid 10001 pai \
 && useradd --system --uid 10001 --gid pai --home-dir /var/lib/pai --create-home pai
USER 10001:10001
WORKDIR /var/lib/pai
VOLUME ["/var/lib/pai"]
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; from libs.common.config import load_config; urllib.request.urlopen('http://127.0.0.1:%d/healthz' % load_config().port_of(os.environ['PAI_SERVICE']), timeout=2)"]
CMD ["sh", "-c", "exec python -m services.$PAI_SERVICE"]
