# Builds envlens; the image runs it against the PostgreSQL named by DATABASE_URL
# (docker-compose.yml provides one). For the embedded default, install `postgresql` too.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src src
COPY migrations migrations
RUN cargo build --release --locked --bin envlens

FROM debian:bookworm-slim
RUN useradd --system --home-dir /data --create-home envlens
COPY --from=build /src/target/release/envlens /usr/local/bin/envlens
USER envlens
ENV ENVLENS_LISTEN=0.0.0.0:8080 ENVLENS_DATA_DIR=/data
EXPOSE 8080
ENTRYPOINT ["envlens"]
CMD ["serve"]
