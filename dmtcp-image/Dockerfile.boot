# fogdeploy's boot image: the entrypoint of the DMTCP container and no
# checkpoint engine. It runs an app chrooted into its environment clone
# (`entrypoint boot -- APP ARGS...`) on nodes without DMTCP and for deploys
# that boot instead of restoring.
#
# Do not build this file directly: `dmtcp-image/build.sh -b` stages the
# build context (rootfs/ with /etc/passwd, /etc/group and /tmp, and the
# static entrypoint) and runs `docker build --network none`.
FROM scratch
ARG VERSION=dev
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="fogdeploy-boot" \
      org.opencontainers.image.description="Runs an app chrooted into a mounted environment clone, without a checkpoint engine" \
      org.opencontainers.image.source="https://github.com/fogdeploy/fogdeploy" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      io.fogdeploy.role="boot"
COPY rootfs/ /
COPY entrypoint /fog/entrypoint
ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
STOPSIGNAL SIGTERM
ENTRYPOINT ["/fog/entrypoint"]
