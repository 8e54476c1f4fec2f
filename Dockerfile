# CPU image by default; for GPUs:
#   docker build --build-arg BASE=nvidia/cuda:12.4.1-runtime-ubuntu22.04 --build-arg TORCH=cuda -t workbench:cuda .
ARG BASE=python:3.11-slim
FROM ${BASE}
ARG TORCH=auto
ENV DEBIAN_FRONTEND=noninteractive PIP_NO_CACHE_DIR=1 OMP_NUM_THREADS=1
RUN apt-get update && apt-get install -y --no-install-recommends make git \
        $(command -v python3 >/dev/null || echo python3 python3-venv python3-pip) \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /workbench
COPY . .
# The same setup as on a laptop: `make setup` creates .venv (torch kept if present, else CPU 2.13.0).
RUN WORKBENCH_TORCH=${TORCH} make setup
ENV PATH=/workbench/.venv/bin:$PATH
EXPOSE 8888
CMD ["jupyter", "lab", "--ip=0.0.0.0", "--port=8888", "--no-browser", "--allow-root", "notebooks"]
