#!/usr/bin/env bash
# Make sure a Docker engine answers, and that the tools the project needs exist.
# On a fresh Debian/Ubuntu machine: installs docker.io, mmdebstrap, git, python3-venv,
# runsc (gVisor) and podman (with catatonit and uidmap) with apt (only those missing) and
# starts dockerd. Packages come from the host's own apt configuration.
#   --gvisor PYTHON   then `PYTHON -m orchestrator engine setup --gvisor` as root (idempotent):
#                     checks that runsc runs everyday tools (`runsc do ls -l`, `stat`) and,
#                     if not (Debian 12's own runsc), installs runsc alone from the release's
#                     backports suite through the host's apt, adding that suite for the
#                     host's own archives when missing; fails in one line if no working
#                     runsc can be had. Then declares the gVisor runtimes untrusted workers
#                     run under (four: with and without a network, each also with
#                     --host-uds=open for parents; reloads dockerd with SIGHUP, never
#                     restarts it). Then (--firewall) the host firewall rule that keeps
#                     allowlisted workers away from the host's services (docs/network.md,
#                     Limits), with the exceptions engines need ahead of it (Podman's DNS
#                     on its outside bridge's address): each added only when `iptables -C`
#                     does not find it, so running this again adds nothing; the same code
#                     as `orchestrator doctor --fix` (orchestrator/doctor/firewall.py).
set -euo pipefail

gvisor_python=""
if [ "${1:-}" = "--gvisor" ]; then
  gvisor_python="${2:?--gvisor needs the python that has the orchestrator installed}"
fi

as_root() { if [ "$(id -u)" -eq 0 ]; then "$@"; else sudo "$@"; fi; }

need=()
command -v docker >/dev/null 2>&1 || need+=(docker.io)
command -v mmdebstrap >/dev/null 2>&1 || need+=(mmdebstrap)
command -v git >/dev/null 2>&1 || need+=(git)           # clearance and its tests
command -v runsc >/dev/null 2>&1 || need+=(runsc)       # gVisor, for untrusted workers
# Podman, for the core tests against its Docker-compatible API (docs/engines.md): its init
# (catatonit) for `init: true`, and newuidmap for the rootless test's user.
command -v podman >/dev/null 2>&1 || need+=(podman)
command -v catatonit >/dev/null 2>&1 || need+=(catatonit)
command -v newuidmap >/dev/null 2>&1 || need+=(uidmap)
command -v iptables >/dev/null 2>&1 || [ -x /usr/sbin/iptables ] || need+=(iptables)  # --firewall
python3 -c 'import venv, ensurepip' >/dev/null 2>&1 || need+=(python3-venv)
if [ ${#need[@]} -gt 0 ]; then
  if ! command -v apt-get >/dev/null 2>&1; then
    echo "ensure-engine: missing ${need[*]} and no apt-get to install them" >&2
    exit 1
  fi
  echo "ensure-engine: installing ${need[*]}" >&2
  as_root apt-get update -qq
  as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

gvisor() {
  if [ -n "$gvisor_python" ]; then
    as_root "$gvisor_python" -m orchestrator engine setup --gvisor --firewall
  fi
}

if docker info >/dev/null 2>&1; then
  gvisor
  exit 0
fi

echo "ensure-engine: no engine answers; starting dockerd" >&2
if command -v systemctl >/dev/null 2>&1 && as_root systemctl start docker 2>/dev/null; then
  :
else
  as_root sh -c 'nohup dockerd >/var/log/dockerd.log 2>&1 &'
fi
for _ in $(seq 1 60); do
  if docker info >/dev/null 2>&1; then
    echo "ensure-engine: engine is up" >&2
    gvisor
    exit 0
  fi
  sleep 1
done
echo "ensure-engine: dockerd did not answer within 60 s; see /var/log/dockerd.log" >&2
exit 1
