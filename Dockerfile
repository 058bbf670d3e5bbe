# syntax=docker/dockerfile:1
# The gateway image: `prefixgate serve` as its entrypoint, running as an unprivileged user.
#
#   docker build -t prefixgate:0.1.0 .
#   docker run --rm -p 8000:8000 prefixgate:0.1.0 --host 0.0.0.0 --replica http://VLLM_HOST:8000
# (arguments replace the default CMD, so give --host 0.0.0.0 again, or host: in --config)
#
# Two stages: the build stage has gcc for policies/_blocktable.c (the compiled block
# table) and gateway/_relay.c (a relayed stream's per-chunk work; setup.py falls back
# to their pure-Python twins if the compiler is missing) and leaves a self-contained
# venv; the runtime stage copies only that venv.
#
# BASE is any Debian-based image with Python 3.11 as `python` (and its venv module);
# CI builds one from Debian's packages with mmdebstrap, where no registry can be
# pulled from, and builds this file with buildah (scripts/test-image.sh).
ARG BASE=python:3.11-slim

FROM ${BASE} AS build
# Python's headers too where the base lacks them (Debian's python3 without python3-dev).
RUN headers=$(python -c "import os, sysconfig; print('' if os.path.exists(os.path.join(\
sysconfig.get_paths()['include'], 'Python.h')) else 'python3-dev')") \
    && apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev $headers \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/prefixgate
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY gateway ./gateway
COPY engine ./engine
COPY policies ./policies
COPY loadtest ./loadtest
# WHEELS: a folder of the build context holding every wheel the install needs (setuptools
# included), for a build that cannot reach PyPI (scripts/test-image.sh); empty: PyPI.
ARG WHEELS=""
# EXTRAS: prefixgate's extras to add to the core, comma-separated (names: the prompt
# linter's person names without a cue, ~120 MB); empty: the core alone.
ARG EXTRAS=""
RUN --mount=type=bind,target=/context \
    /opt/prefixgate/bin/pip install --no-cache-dir \
        ${WHEELS:+--no-index --find-links /context/$WHEELS} ".${EXTRAS:+[$EXTRAS]}"
# (from /, not /src: there the source tree, without the built module, would be imported)
RUN cd / && /opt/prefixgate/bin/python -c "import policies._blocktable, gateway._relay" \
    || echo "prefixgate: no compiled modules, the pure-Python ones serve"

FROM ${BASE}
RUN groupadd --gid 10001 prefixgate \
    && useradd --uid 10001 --gid 10001 --home-dir /home/prefixgate --create-home prefixgate
COPY --from=build /opt/prefixgate /opt/prefixgate
ENV PATH=/opt/prefixgate/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    HF_HUB_OFFLINE=1 \
    HOME=/home/prefixgate
USER 10001:10001
WORKDIR /home/prefixgate
EXPOSE 8000
ENTRYPOINT ["prefixgate", "serve"]
CMD ["--host", "0.0.0.0"]
