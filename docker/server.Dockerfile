# llm-server (and llm-router), CPU image: a build stage with the toolchain, a slim runtime
# stage with only the shared libraries, running as a non-root user.
#   make images (docker build -f docker/server.Dockerfile -t llm-server:0.1.0 .)
FROM debian:bookworm AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential python3 libjansson-dev libyaml-dev libcivetweb-dev libssl-dev libcurl4-openssl-dev libhiredis-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# The binary picks its CPU kernels (AVX512-VNNI, AVX2, scalar) at run time.
RUN make image IMAGE=server

FROM debian:bookworm-slim
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libjansson4 libyaml-0-2 libcivetweb1 libssl3 libcurl4 libhiredis0.14 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin llm
COPY --from=build /src/build/image/ /usr/local/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/llm-server"]
CMD ["--help"]
