# tunehub's image: the API (`tunehub serve`), Ray nodes (`ray start`) and workers
# (`tunehub worker`) all run from it, so the driver and every Ray node have the same Ray and
# Python (Ray refuses to mix versions).
#
#   docker build -t tunehub .                                  # CPU: API, Ray head, CPU worker
#   docker build -t tunehub-gpu --build-arg EXTRAS=cluster,gpu .   # + torch/triton for GPUs
#
# The GPU variant needs no CUDA base image: torch's wheels bring the CUDA runtime, and the
# NVIDIA container runtime mounts the host's driver into the container.
FROM python:3.12-slim

# cc builds the blis.gemm candidates; libgomp for the threaded kernels; curl for healthchecks.
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev libgomp1 curl \
    && rm -rf /var/lib/apt/lists/*

ARG EXTRAS=cluster
WORKDIR /opt/tunehub
COPY pyproject.toml README.md ./
COPY tunehub ./tunehub
RUN pip install --no-cache-dir ".[${EXTRAS}]"

# Unprivileged; its home holds the build cache (TUNEHUB_HOME) and Ray's session files.
RUN useradd --create-home --uid 10001 tunehub
USER tunehub
ENV TUNEHUB_HOME=/home/tunehub/.tunehub \
    PYTHONUNBUFFERED=1
WORKDIR /home/tunehub
EXPOSE 8000
CMD ["tunehub", "serve", "--host", "0.0.0.0"]
