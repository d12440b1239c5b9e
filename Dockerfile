# One image for the API and the workers (CPU torch; swap the torch line for a CUDA build on GPU hosts).
FROM python:3.11-slim
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml constraints.txt README.md ./
COPY service service
COPY verifiers verifiers
COPY trainer trainer
COPY sandbox sandbox
# Pick the torch build for the host (e.g. set PIP_INDEX_URL/PIP_EXTRA_INDEX_URL for a CPU-only wheel); it is
# installed first, so the project's `torch` requirement is already met. The rest at constraints.txt's
# versions (what CI tests); `monitoring` brings Flower, which compose's monitoring profile starts.
ARG TORCH=torch==2.13.0
ARG EXTRAS=postgres,monitoring
RUN pip install --no-cache-dir "$TORCH" && pip install --no-cache-dir -c constraints.txt -e ".[$EXTRAS]"
ENV RLVR_HOME=/data
VOLUME /data
EXPOSE 8000
CMD ["rlvr", "serve", "--host", "0.0.0.0"]
