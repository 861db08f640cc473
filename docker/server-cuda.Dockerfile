# llm-server, CUDA image: built against CUDA 13 (cuBLAS, NCCL) in the devel
# image, run on the slimmer runtime image; non-root. The GPU runtime
# libraries come from the base image; the driver from the node.
#   docker build -f docker/server-cuda.Dockerfile -t llm-server:latest-cuda .
# Until the CUDA backend lands (issue 8), `make` builds the CPU backend only
# and this image serves on CPU; the build line below does not change.
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential python3 libjansson-dev libyaml-dev libcivetweb-dev libssl-dev libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make build/bin/llm-server

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libjansson4 libyaml-0-2 libcivetweb1 libssl3t64 libnccl2 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin llm
COPY --from=build /src/build/bin/llm-server /usr/local/bin/llm-server
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/llm-server"]
CMD ["--help"]
