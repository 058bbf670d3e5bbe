# syntax=docker/dockerfile:1
# The gateway image: `prefixgate serve` as its entrypoint, running as an unprivileged user.
#
#   docker build -t prefixgate:0.1.0 .
#   docker run --rm -p 8000:8000 prefixgate:0.1.0 --host 0.0.0.0 --replica http://VLLM_HOST:8000
# (arguments replace the default CMD, so give --host 0.0.0.0 again, or host: in --config)
#
# Two stages: the build stage has gcc for policies/_blocktable.c (the compiled block
# table; setup.py falls back to the pure-Python one if the compiler is missing) and
# leaves a self-contained venv; the runtime stage copies only that venv.

FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
RUN python -m venv /opt/prefixgate
WORKDIR /src
COPY pyproject.toml setup.py README.md LICENSE ./
COPY gateway ./gateway
COPY engine ./engine
COPY policies ./policies
COPY loadtest ./loadtest
RUN /opt/prefixgate/bin/pip install --no-cache-dir .
RUN /opt/prefixgate/bin/python -c "import policies._blocktable" \
    || echo "prefixgate: no compiled block table, the pure-Python one serves"

FROM python:3.11-slim
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
