# syntax=docker/dockerfile:1
# Multi-stage build: compile and fetch the pinned model files in a full
# toolchain image, run as a non-root user in a slim one.
#
#   docker build -t moderato .                      # compiles (the default)
#   docker build --build-arg ARTIFACTS=prebuilt -t moderato .
#
# ARTIFACTS=prebuilt takes `target/release/moderato` and `models/` from the
# build context instead (after `cargo build --release --locked --bin
# moderato` and `scripts/setup.sh` on a glibc-2.36-or-older host, e.g.
# Debian bookworm): CI builds the image that way, as no Rust toolchain image
# is reachable there. Both paths end in the same runtime stage.
# The base images are arguments so that a mirror or a locally made image
# (CI: `debootstrap` + `podman import`) can stand in for Docker Hub's.
ARG BUILD_IMAGE=rust:1.95-bookworm
ARG RUNTIME_IMAGE=debian:bookworm-slim
ARG ARTIFACTS=compile

FROM ${BUILD_IMAGE} AS compile
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-pip python3-venv nodejs npm \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY crates ./crates
COPY benches ./benches
COPY migrations ./migrations
COPY config ./config
COPY assets ./assets
COPY scripts ./scripts
# scripts/fetch-e5.sh rebuilds the fine-tuned e5 with it.
COPY train/e5_delta.py ./train/e5_delta.py
RUN cargo build --release --locked --bin moderato \
 && mkdir -p /out && cp target/release/moderato /out/moderato
# The OCR models as published (ppocr/source/) are only the input of their
# rewrite (scripts/fuse-ocr.py): the image needs the rewritten ones. The e5
# encoder stays, as published and fine-tuned (72 MB each): the default
# accurate path reads the fine-tuned one, heads fitted on the other may name it.
RUN MODERATO_MODELS_DIR=/out/models scripts/setup.sh && rm -rf /out/models/ppocr/source

# The binary and models built on the host (.dockerignore lets only the two
# binaries out of target/ and models/ into the context, ppocr/source/ left out).
FROM ${RUNTIME_IMAGE} AS prebuilt
# CI passes target/debug/moderato, the binary its test build already made
# (scripts/ci-image.sh, MODERATO_IMAGE_BINARY=debug): the image's checks are
# of the container, and a second, release build of every dependency cost CI
# ten minutes of its fifty.
ARG PREBUILT_BINARY=target/release/moderato
COPY ${PREBUILT_BINARY} /out/moderato
COPY models /out/models

FROM ${ARTIFACTS} AS artifacts

FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && apt-get clean && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin \
 && useradd --system --uid 10001 --home-dir /var/lib/moderato --create-home moderato \
 && install -d -o moderato -g moderato /var/lib/moderato/data
COPY --from=artifacts /out/moderato /usr/local/bin/moderato
COPY --from=artifacts /out/models /opt/moderato/models
USER moderato
# Everything the service writes (the usage journal, the SQLite database, the
# pepper and signing key files when not given by environment) is under
# data/, the volume: the root file system can be mounted read-only.
WORKDIR /var/lib/moderato
ENV MODERATO_ADDR=0.0.0.0:8080 \
    MODERATO_MODELS_DIR=/opt/moderato/models \
    MODERATO_LOG_FORMAT=json
EXPOSE 8080
VOLUME ["/var/lib/moderato/data"]
# Ready = serving and the database answers (GET /ready on MODERATO_ADDR).
# The start period covers loading both encoders and the migrations.
HEALTHCHECK --interval=5s --timeout=4s --start-period=60s --retries=3 \
  CMD ["moderato", "health"]
# tini forwards SIGTERM to the service, which then stops accepting, finishes
# the requests in flight (MODERATO_SHUTDOWN_GRACE_MS, 30 s) and writes every
# queued usage event before exiting: give `docker stop -t` more than that.
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/bin/tini", "--", "moderato"]
CMD ["serve"]
