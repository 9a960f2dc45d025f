# One image for every trajlake service (gateway, ingester, scheduler, query API, trainer).
#   docker compose build                  # CPU torch (default)
#   --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128   # CUDA torch, for the trainer
FROM python:3.11-slim

ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    DS_BUILD_OPS=0 \
    TRAJLAKE_HOME=/var/lib/trajlake/home

# torch first, from the PyTorch index (CPU wheel by default: no CUDA libraries in the image);
# `pip install .` then finds the pinned torch already satisfied.
RUN pip install --index-url "${TORCH_INDEX}" torch==2.13.0

WORKDIR /app
COPY . .
RUN pip install . \
 && useradd --create-home --uid 10001 trajlake \
 && mkdir -p /var/lib/trajlake/home /var/lib/trajlake/spool /var/lib/trajlake/checkpoints \
 && chown -R trajlake /var/lib/trajlake

USER trajlake
WORKDIR /var/lib/trajlake
ENTRYPOINT ["trajlake"]
CMD ["--help"]
