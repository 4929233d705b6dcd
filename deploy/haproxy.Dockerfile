# The load balancer of deploy/compose.yaml: HAProxy as Debian ships it
# (2.6), with deploy/haproxy.cfg. Build context: deploy/.
ARG RUNTIME_IMAGE=debian:bookworm-slim
FROM ${RUNTIME_IMAGE}
RUN apt-get update \
 && apt-get install -y --no-install-recommends haproxy \
 && rm -rf /var/lib/apt/lists/* \
 && install -d -o haproxy -g haproxy /var/run/haproxy
COPY haproxy.cfg /etc/haproxy/haproxy.cfg
USER haproxy
EXPOSE 8080
# -W: master-worker (a reload with SIGUSR2 keeps serving); -db: in the foreground.
CMD ["haproxy", "-W", "-db", "-f", "/etc/haproxy/haproxy.cfg"]
