# gpu-fence: one image, both entry points.
#
#   docker build -t gpu-fence:dev .
#   docker run --rm gpu-fence:dev --help                         # gpu-fence-webhook (the default ENTRYPOINT)
#   docker run --rm --entrypoint gpu-fence-auditor gpu-fence:dev --help
#
# Releases are built by .github/workflows/release.yml for linux/amd64 and linux/arm64 (docs/install.md).
#
# The manifests set `command:` explicitly for every container (gpu-fence-webhook serve / certs,
# gpu-fence-auditor run), so the default ENTRYPOINT only matters for `docker run`.
# No HEALTHCHECK: Kubernetes ignores it; the manifests probe /readyz, /healthz (webhook) and /healthz (auditor).
#
# Two stages: the first builds the project's wheel and installs it with its dependencies into a virtual
# environment at /opt/gpu-fence; the second copies only that environment onto a fresh base image. The final image
# has no pip, no wheel cache, no source tree and no compiler. Both stages use the same base image, so the
# environment's interpreter link (/usr/local/bin/python3.11) is valid in the final one.
#
# Every Python package comes from a lock file, pinned and hash-checked (--require-hashes), wheels only:
# requirements.lock for what the image runs, requirements-build.lock for the build backend that makes the wheel.
# gpu-fence's own wheel is installed with --no-deps, so nothing outside the lock gets in, and pip check fails the
# build if the lock misses a dependency. `sh scripts/lock` refreshes both files (docs/install.md).

ARG PYTHON_IMAGE=docker.io/library/python:3.11.13-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
WORKDIR /src
COPY requirements.lock requirements-build.lock ./
RUN pip install --no-cache-dir --require-hashes --only-binary=:all: -r requirements-build.lock
COPY pyproject.toml README.md LICENSE ./
COPY gpu_fence/ gpu_fence/
COPY webhook/ webhook/
COPY auditor/ auditor/
COPY chargeback/ chargeback/
# webhook/shipped-policy.yaml is a link to this file: check's default policy is the one the manifests ship.
COPY manifests/base/policy.yaml manifests/base/
RUN pip wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels /src
# The environment gets no pip of its own: the build stage's pip installs into it (--python), so nothing that
# can install packages ends up in the final image.
RUN python -m venv --without-pip /opt/gpu-fence \
    && pip --python /opt/gpu-fence/bin/python install --no-cache-dir --no-compile \
       --require-hashes --only-binary=:all: -r requirements.lock \
    && pip --python /opt/gpu-fence/bin/python install --no-cache-dir --no-compile --no-deps /wheels/*.whl \
    && pip --python /opt/gpu-fence/bin/python check \
    && /opt/gpu-fence/bin/python -m compileall -q /opt/gpu-fence/lib

FROM ${PYTHON_IMAGE}
# Declared again so that the base.name label below names the image this build really used.
ARG PYTHON_IMAGE
# The package version (pyproject.toml); the release workflow passes it, a test keeps this default equal to it.
ARG VERSION=0.2.0
LABEL org.opencontainers.image.title="gpu-fence" \
      org.opencontainers.image.description="Keep Kubernetes GPU access equal to what the kubelet allocated: an admission webhook and a node auditor." \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.base.name="${PYTHON_IMAGE}"
# A fixed uid/gid, matching runAsUser/runAsGroup 10001 in the manifests. The auditor runs as root by its
# manifest (it needs to read other processes' /proc entries); the webhook and the certificate Job never do.
RUN groupadd --system --gid 10001 gpu-fence \
    && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
       --shell /usr/sbin/nologin gpu-fence
# The base image's own installer is of no use at run time; remove it so nothing in the image can install code.
RUN python -m pip uninstall --yes --quiet pip setuptools wheel \
    && rm -rf /root/.cache
COPY --from=build /opt/gpu-fence /opt/gpu-fence
ENV PATH=/opt/gpu-fence/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
ENTRYPOINT ["gpu-fence-webhook"]
CMD ["--help"]
