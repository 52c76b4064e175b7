# PicoMQ container image: a locked release build of the `pico` binary on slim Debian.
# (Not built in CI: this machine has no Docker engine. The dashboard stage arrives with the
# dashboard issue.)

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Persistent caches keep rebuilds incremental.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p pico-cli && cp target/release/pico /usr/local/bin/pico

FROM debian:bookworm-slim
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates libsqlite3-0 \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /usr/local/bin/pico /usr/local/bin/pico
WORKDIR /var/lib/picomq
EXPOSE 4437 9090
# Inside a container the listeners must bind 0.0.0.0; auth is not implemented yet, so the
# image opts in to remote access explicitly (the flag name records that choice).
ENV PICO_LISTEN=0.0.0.0:4437 \
    PICO_ADMIN_LISTEN=0.0.0.0:9090 \
    PICO_INSECURE_ALLOW_REMOTE=true \
    PICO_META_URL=sqlite:/var/lib/picomq/data/meta.db \
    PICO_STORAGE=-2@file:///var/lib/picomq/objects
ENTRYPOINT ["pico"]
CMD ["serve"]
