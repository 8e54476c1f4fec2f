#!/usr/bin/env bash
# make test-slurm: Debian's Slurm (slurmctld, slurmd, the clients) and munge, installed where they are missing and
# we are root with apt-get. Elsewhere it says why not and leaves it to the tests, which skip with the reason.
set -euo pipefail
need=(munged slurmctld slurmd sbatch nsenter)
missing=()
for p in "${need[@]}"; do command -v "$p" >/dev/null || missing+=("$p"); done
if [ ${#missing[@]} -eq 0 ]; then
    exit 0
fi
if [ "$(id -u)" != 0 ] || ! command -v apt-get >/dev/null; then
    echo "slurm_setup: ${missing[*]} missing, and installing needs root and apt-get: the Slurm cases will skip" >&2
    exit 0
fi
export DEBIAN_FRONTEND=noninteractive
# a machine that cannot install them (no mirror, no network) is told so, and the Slurm cases skip with the reason
if ! timeout 600 apt-get update -qq ||
    ! timeout 900 apt-get install -y -qq --no-install-recommends slurmctld slurmd slurm-client munge util-linux \
        >/dev/null; then
    echo "slurm_setup: installing Slurm and munge with apt-get failed: the Slurm cases will skip" >&2
fi
