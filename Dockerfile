# The image the manifests in deploy/kubernetes/ run: tfsyncmodes with TensorFlow (CPU) and
# Horovod built with Gloo by scripts/install.sh, plus OpenSSH for horovodrun across pods.
#   docker build -t tfsyncmodes:0.1.0 .
FROM python:3.11-slim-bookworm

RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ make openssh-server openssh-client iproute2 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /run/sshd

WORKDIR /opt/tfsyncmodes
COPY . .
ENV TFSYNC_VENV=/opt/venv TFSYNC_CACHE=/tmp/tfsyncmodes-cache
RUN bash scripts/install.sh && rm -rf /tmp/tfsyncmodes-cache /root/.cache

ENV PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=2
CMD ["python", "scripts/train.py"]
