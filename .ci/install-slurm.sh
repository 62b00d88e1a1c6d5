#!/usr/bin/env bash
# Install a single-node SLURM (slurm-wlm) and munge from Debian's archive, for the tests in
# tests/test_slurm_harness.py. Idempotent: does nothing when slurmctld is already installed.
# Needs root (CI runs as root); the daemons are started by the tests themselves, never here.
set -euo pipefail

if command -v slurmctld >/dev/null 2>&1 && command -v munged >/dev/null 2>&1; then
    echo "install-slurm: slurm-wlm and munge already installed"
    exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
    echo "install-slurm: must run as root to apt-get install slurm-wlm munge" >&2
    exit 1
fi

export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends slurm-wlm munge >/dev/null
# Debian's packages may try to start services through invoke-rc.d; without systemd that is
# a no-op, and the tests start their own daemons with their own configuration.
command -v slurmctld >/dev/null
command -v munged >/dev/null
echo "install-slurm: installed $(slurmctld -V 2>/dev/null || echo slurm) and munge"
