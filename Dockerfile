# Builds envlens; the image runs it against the PostgreSQL named by DATABASE_URL
# (docker-compose.yml provides one; so does the Helm chart in charts/envlens, from a Secret).
# For the embedded default, install `postgresql` too.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
# Cargo.toml names the benches, so the manifest is not complete without them.
COPY benches benches
COPY src src
COPY migrations migrations
COPY deploy/split-debug deploy/split-debug
# Shipped stripped (about 32 MB rather than 188): the line tables go to envlens.debug, which
# `docker build --target debug --output type=local,dest=. .` writes out for crash reports.
RUN cargo build --release --locked --bin envlens \
    && deploy/split-debug target/release/envlens

FROM scratch AS debug
COPY --from=build /src/target/release/envlens.debug /envlens.debug

FROM debian:bookworm-slim
# A fixed numeric uid and gid (10001, the chart's runAsUser and runAsGroup), so that
# Kubernetes' runAsNonRoot can check the image's user without a name lookup.
RUN groupadd --system --gid 10001 envlens \
    && useradd --system --uid 10001 --gid 10001 --home-dir /data --create-home envlens
COPY --from=build /src/target/release/envlens /usr/local/bin/envlens
USER 10001:10001
ENV ENVLENS_LISTEN=0.0.0.0:8080 ENVLENS_DATA_DIR=/data
EXPOSE 8080
ENTRYPOINT ["envlens"]
CMD ["serve"]
