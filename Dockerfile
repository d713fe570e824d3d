# syntax=docker/dockerfile:1
# The image deploy/kubernetes/daemonset.yaml runs: /usr/local/bin/dlfs,
# built with HDF5 as `make dlfs` builds it, on Debian with fuse3 and the
# HDF5 library (docs/install.md, "Container"). Build and push it with
#
#   make image IMAGE=registry.example.com/dlfs:0.16.0
#   docker push registry.example.com/dlfs:0.16.0
#
# DEBIAN and HDF5_LIBS go together: the HDF5 library packages of that
# Debian release (bookworm: libhdf5-103-1 libhdf5-hl-100; trixie:
# libhdf5-310 libhdf5-hl-310).

ARG GO_VERSION=1.26
ARG DEBIAN=bookworm

FROM golang:${GO_VERSION}-${DEBIAN} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends libhdf5-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
RUN make dlfs

FROM debian:${DEBIAN}-slim
ARG HDF5_LIBS="libhdf5-103-1 libhdf5-hl-100"
RUN apt-get update \
    && apt-get install -y --no-install-recommends fuse3 ${HDF5_LIBS} \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/bin/dlfs /usr/local/bin/dlfs
ENTRYPOINT ["/usr/local/bin/dlfs"]
CMD ["--help"]
