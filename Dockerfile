# One image for the API and the workers. The GPU workers' image adds vLLM, which pins torch, transformers and
# fastapi of its own, so it installs from constraints-gpu.txt instead (compose's worker-gpu builds it so):
#   docker build --build-arg TORCH=torch==2.14.0 --build-arg CONSTRAINTS=constraints-gpu.txt \
#                --build-arg EXTRAS=postgres,monitoring,vllm -t rlvr-gpu .
FROM python:3.11-slim
# g++: the sampler's C++ kernel is built on first use for the CPU it runs on (trainer/engines/native.py), kept on the
# data volume (TORCH_EXTENSIONS_DIR below) so a restarted container loads it instead of building it again
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap g++ && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt constraints-gpu.txt README.md ./
COPY service service
COPY verifiers verifiers
COPY trainer trainer
COPY sandbox sandbox
# torch first, so the project's `torch` requirement is already met. PyPI's Linux torch==2.13.0 is a CUDA build
# (several GB; it runs on CPU too); a CPU-only image takes TORCH=torch==2.13.0+cpu from PyTorch's CPU index
# (pip's PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu in the build's environment). The rest at
# CONSTRAINTS' versions (constraints.txt: what CI tests); `monitoring` brings Flower, which compose's
# monitoring profile starts.
ARG TORCH=torch==2.13.0
ARG CONSTRAINTS=constraints.txt
ARG EXTRAS=postgres,monitoring
RUN pip install --no-cache-dir "$TORCH" && pip install --no-cache-dir -c "$CONSTRAINTS" -e ".[$EXTRAS]"
ENV RLVR_HOME=/data TORCH_EXTENSIONS_DIR=/data/torch_extensions
VOLUME /data
EXPOSE 8000
CMD ["rlvr", "serve", "--host", "0.0.0.0"]
