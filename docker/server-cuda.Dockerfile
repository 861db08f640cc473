# llm-server (and llm-router), CUDA image: built against CUDA 13 (cuBLAS,
# NCCL) in the devel image, run on the slimmer runtime image; non-root. The
# CUDA backend is the plugin /usr/local/lib/libllm_cuda.so (llm-server loads
# it from ../lib beside its binary for backend cuda); `make image` fails here
# rather than ship an image without it. cuBLAS comes from the runtime base
# image, NCCL from libnccl2, the driver from the node.
#   docker build -f docker/server-cuda.Dockerfile -t llm-server:0.1.0-cuda .
FROM nvidia/cuda:13.0.0-devel-ubuntu24.04 AS build
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        build-essential python3 libjansson-dev libyaml-dev libcivetweb-dev libssl-dev libcurl4-openssl-dev libhiredis-dev libnccl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN make image IMAGE=server-cuda

FROM nvidia/cuda:13.0.0-runtime-ubuntu24.04
RUN apt-get update && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        libjansson4 libyaml-0-2 libcivetweb1 libssl3t64 libcurl4t64 libhiredis1.1.0 libnccl2 ca-certificates \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin llm
COPY --from=build /src/build/image/ /usr/local/
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/llm-server"]
CMD ["--help"]
