# reprocube image: the three trainers behind one entrypoint (run.sh), for MLCube, Docker and Singularity.
#   GPU (default): docker build -t reprocube/reprocube:0.1.0-gpu .
#   CPU:           docker build --build-arg VARIANT=cpu -t reprocube/reprocube:0.1.0-cpu .
# Offline build: scripts/wheelhouse.sh cpu|gpu first fills wheelhouse/VARIANT on a host with an index;
# the build then installs from it with --no-index. Either way every file is checked against the lock's hashes.
# The CUDA libraries come from the lock's nvidia-* wheels; the host needs only the NVIDIA driver (--gpus / --nv).
# torch, torchvision and JAX use the CUDA 13 wheels, TensorFlow 2.21 its own CUDA 12 ones: 12.6 GB in all
# (benchmarks/gpu-image.md; tests/test_gpu_image.py checks the image wherever it is built).

# Pinned by digest (a tag can move); tests and offline sites pass their own, e.g. a debootstrapped bookworm.
ARG BASE_IMAGE=debian:bookworm-slim@sha256:96e378d7e6531ac9a15ad505478fcc2e69f371b10f5cdf87857c4b8188404716

FROM ${BASE_IMAGE} AS python
# Debian bookworm's Python 3.11, the version the locks are resolved for; qemu-user so that reproduce --match
# emulates an AVX2 receipt's CPU in the image as it does natively (reprocube.runtime.cpu_emulation; ~100 MB).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends python3 python3-venv ca-certificates tini qemu-user \
 && rm -rf /var/lib/apt/lists/*

FROM python AS build
ARG VARIANT=gpu
ARG BASE_IMAGE
COPY requirements.txt requirements-cpu.txt /src/
# This variant's wheelhouse; one holding nothing but .keep means "install from the index".
COPY wheelhouse/${VARIANT}/ /wheelhouse/
COPY docker/install-requirements.sh /src/docker/
RUN /src/docker/install-requirements.sh "$VARIANT"
COPY pyproject.toml README.md /src/
COPY src/ /src/src/
RUN /opt/venv/bin/pip install --quiet --no-cache-dir --no-deps --no-build-isolation /src \
 && mkdir -p /opt/reprocube \
 && /opt/venv/bin/pip freeze --all > /opt/reprocube/pip-freeze.txt \
 && dpkg-query -W -f '${Package}=${Version}\n' > /opt/reprocube/dpkg.txt \
 && printf '{"variant": "%s", "base_image": "%s", "lock": "%s", "lock_sha256": "%s", "pip_freeze_sha256": "%s", "dpkg_sha256": "%s"}\n' \
      "$VARIANT" "$BASE_IMAGE" "$(cat /opt/venv/lock-name)" "$(sha256sum /src/$(cat /opt/venv/lock-name) | cut -d' ' -f1)" \
      "$(sha256sum /opt/reprocube/pip-freeze.txt | cut -d' ' -f1)" "$(sha256sum /opt/reprocube/dpkg.txt | cut -d' ' -f1)" \
      > /opt/reprocube/image.json

FROM python
ARG VARIANT=gpu
COPY --from=build /opt/venv /opt/venv
COPY --from=build /opt/reprocube /opt/reprocube
COPY run.sh /opt/reprocube/run.sh
# A non-root user. MLCube runs the container as the invoking user (--user=$(id -u):$(id -g)), whose uid
# has no home here: HOME is a directory anyone may write (matplotlib, Keras and JAX keep caches there).
RUN useradd --uid 1000 --create-home --shell /usr/sbin/nologin reprocube \
 && chmod 1777 /home/reprocube
ENV PATH=/opt/venv/bin:$PATH \
    HOME=/home/reprocube \
    PYTHONHASHSEED=0 \
    PYTHONNOUSERSITE=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    CUBLAS_WORKSPACE_CONFIG=:4096:8 \
    TF_CPP_MIN_LOG_LEVEL=2 \
    REPROCUBE_IMAGE=reprocube/reprocube:0.1.0-${VARIANT} \
    REPROCUBE_IMAGE_INFO=/opt/reprocube/image.json
# Determinism switches that depend on the config (torch.use_deterministic_algorithms, TF op determinism,
# XLA_FLAGS=--xla_gpu_deterministic_ops) are set by reprocube itself, so deterministic=false still works.
USER reprocube
WORKDIR /home/reprocube
# tini as PID 1 forwards SIGTERM/SIGUSR1 from `docker stop` or a scheduler to reprocube, which then
# checkpoints and exits 75; exec form, so no shell sits in between.
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/reprocube/run.sh"]
