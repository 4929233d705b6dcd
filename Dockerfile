# syntax=docker/dockerfile:1
# Multi-stage build: compile and fetch the pinned model files in a full
# toolchain image, run as a non-root user in a slim one.

FROM rust:1.95-bookworm AS build
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
RUN cargo build --release --locked --bin moderato
# The OCR models as published (ppocr/source/) are only the input of their
# rewrite (scripts/fuse-ocr.py): the image needs the rewritten ones. The e5
# encoder (72 MB) stays: MODERATO_TEXT_MODEL__SECOND_STAGE=true reads it.
RUN MODERATO_MODELS_DIR=/models scripts/setup.sh && rm -rf /models/ppocr/source

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates tini \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /var/lib/moderato --create-home moderato
COPY --from=build /src/target/release/moderato /usr/local/bin/moderato
COPY --from=build /models /opt/moderato/models
USER moderato
WORKDIR /var/lib/moderato
ENV MODERATO_ADDR=0.0.0.0:8080 \
    MODERATO_MODELS_DIR=/opt/moderato/models \
    MODERATO_LOG_FORMAT=json
EXPOSE 8080
VOLUME ["/var/lib/moderato/data"]
ENTRYPOINT ["/usr/bin/tini", "--", "moderato"]
CMD ["serve"]
