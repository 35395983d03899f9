# cron-runner: the entrypoint every CronJob pod of the chart runs.
#
#   docker build -t cron-runner .
#
# BASE_IMAGE is any Debian-like image with python3 and its venv module: python:3.12-slim for
# users, a local bookworm base in this repository's tests (scripts/image.sh), where no
# registry is reachable. Both stages use it, so the venv copied below matches its interpreter.
#
# The default is pinned by digest, the tag beside it for people: a rebuild gets the same base
# until the digest is bumped on purpose (image/README.md, Supply chain).
ARG BASE_IMAGE=python:3.12-slim@sha256:78387bc3881b8273120a12ebe6c1ab22b018ccc2c9adf565ae1ac9b536e184ea

FROM ${BASE_IMAGE} AS builder
# The extras the image carries (hiredis, telemetry, queue, import, serve) are those image/requirements.txt
# is compiled with: adding one is adding a word to IMAGE_EXTRAS in the Makefile, then
# `make image-lock`.
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore
WORKDIR /src
COPY image/requirements.txt image/build-tools.txt ./image/
# Every download is checked against a hash locked in image/ (`make image-lock` writes them):
# the build backend and the SBOM generator in a venv of their own, the runtime's packages in
# the runner's venv. The wheel of cron-runner itself is built here, from this source.
RUN python3 -m venv /opt/build-tools \
 && /opt/build-tools/bin/pip install --require-hashes --no-deps -r image/build-tools.txt \
 && python3 -m venv /opt/cron-runner \
 && /opt/cron-runner/bin/pip install --require-hashes --no-deps -r image/requirements.txt
COPY pyproject.toml README.md ./
COPY runner ./runner
# The runtime venv ends without pip (and setuptools, which 3.11's venvs carry): nothing in
# the image can install code at run time. examples/custom-image shows how a user's image
# adds its tasks. Bytecode is compiled once, here, with hashes that are never checked
# against source mtimes: the root filesystem is read-only at run time.
RUN /opt/build-tools/bin/pip wheel --no-deps --no-build-isolation --wheel-dir /wheels . \
 && /opt/cron-runner/bin/pip install --no-deps --no-index /wheels/redis_cron_runner-*.whl \
 && /opt/cron-runner/bin/pip check \
 && /opt/cron-runner/bin/python -m pip uninstall --yes --quiet setuptools pip \
 && test ! -e /opt/cron-runner/bin/pip \
 && mkdir -p /opt/cron-runner/share \
 && /opt/build-tools/bin/cyclonedx-py environment --pyproject pyproject.toml \
        --output-reproducible --of JSON -o /opt/cron-runner/share/sbom.cdx.json \
        /opt/cron-runner/bin/python \
 && /opt/cron-runner/bin/python -m compileall -q --invalidation-mode unchecked-hash \
        /opt/cron-runner/lib

# The self-contained runner for app images without Python (the chart's `runner.inject`): a
# PyInstaller bundle of the same runner, with the interpreter and every library inside.
# A directory rather than one file: a one-file build unpacks itself to /tmp and runs the
# runner as its child on every start (2.8x the cold start, and the runner no longer PID 1;
# bench/README.md). It carries this stage's C library and dynamic loader
# (bundle/carry-libc.sh), and its launcher (bundle/launch.c) execs that loader: the bundle
# runs whatever the image's libc is, an older glibc, musl (Alpine) or none (scratch).
FROM builder AS bundle
# PyInstaller needs objdump, and a shared libpython, which Debian's python3 keeps in a
# package of its own (python:3.12-slim has one already); the static launcher needs a C
# compiler.
# hadolint ignore=DL3008
RUN libpython="" \
 && if ! python3 -c 'import ctypes.util as u, sys; sys.exit(u.find_library("python%d.%d" % sys.version_info[:2]) is None)'; then \
        libpython=$(python3 -c 'import sys; print("libpython%d.%d" % sys.version_info[:2])'); \
    fi \
 && apt-get update -qq \
 && apt-get install -y -qq --no-install-recommends binutils gcc libc6-dev ${libpython:+"$libpython"} \
        >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY bundle ./bundle
COPY image/bundle-tools.txt ./image/
# PyInstaller goes into a copy of the runner's venv, so that it sees exactly what the image
# carries (with its metadata) and the venv itself stays without it. That venv has no pip any
# more: ensurepip puts back the one Python ships (no download), and PyInstaller comes
# hash-checked from image/bundle-tools.txt. Layout: the launcher as cron-runner, the bundle
# beside it in bundle/.
RUN cp -a /opt/cron-runner /opt/build \
 && /opt/build/bin/python -m ensurepip --default-pip >/dev/null \
 && /opt/build/bin/python -m pip install --quiet --require-hashes --no-deps \
        -r image/bundle-tools.txt \
 && /opt/build/bin/python -m PyInstaller --noconfirm --log-level WARN --onedir --strip \
        --name cron-runner --collect-submodules runner \
        --exclude-module setuptools --exclude-module pkg_resources --exclude-module _distutils_hack \
        --distpath /tmp/dist --workpath /tmp/pyinstaller --specpath /tmp/pyinstaller \
        runner/__main__.py \
 && mkdir /dist \
 && mv /tmp/dist/cron-runner /dist/bundle \
 && sh bundle/carry-libc.sh /dist/bundle \
 && gcc -static -Os -Wall -Werror -o /dist/cron-runner bundle/launch.c \
 && strip /dist/cron-runner \
 && /dist/cron-runner --version

FROM ${BASE_IMAGE}
ARG VERSION=0.1.0
# /opt/cron-runner/share/sbom.cdx.json: CycloneDX SBOM of the venv's Python packages.
LABEL org.opencontainers.image.title="cron-runner" \
      org.opencontainers.image.description="Run a scheduled job once and only once across replicas, clusters and servers, with a Redis lease." \
      org.opencontainers.image.source="https://github.com/cron-runner/cron-runner" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0"

# uid/gid 10001 match the chart's runAsUser/runAsGroup.
RUN groupadd --gid 10001 cron-runner \
 && useradd --uid 10001 --gid 10001 --no-create-home --home-dir /tmp \
        --shell /usr/sbin/nologin cron-runner

# python:3.12-slim ships its standard library without .pyc files, and a read-only root
# would make every cold start compile the modules it imports. Compile them here; where
# the base already has them (Debian's python3), this writes nothing.
RUN python3 -m compileall -q -j 0 -x '/(idlelib|tkinter|turtledemo|lib2to3|ensurepip)/' \
        "$(python3 -c 'import sysconfig; print(sysconfig.get_path("stdlib"))')"

COPY --from=builder /opt/cron-runner /opt/cron-runner
COPY --from=bundle /dist /opt/cron-runner-bin

# Nothing writes outside /tmp (an emptyDir under readOnlyRootFilesystem), and no .pyc is
# written at run time: they were compiled in the builder.
ENV PATH=/opt/cron-runner/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    HOME=/tmp

USER 10001:10001
# No init shim (tini, dumb-init): as PID 1 the runner handles SIGTERM/SIGINT itself, runs a
# command task in its own process group, and reaps its children.
ENTRYPOINT ["cron-runner"]
CMD ["--help"]
