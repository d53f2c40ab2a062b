#!/bin/sh
# Slurm Epilog (slurm.conf: Epilog=/etc/slurm/gpubake/epilog.sh): `gpubake probe` on the
# node a job just left, at GPUBAKE_EPILOG_LEVEL (1 unless set; `off` probes nothing), with
# the prolog's settings (prolog.sh, gpubake-probe.conf). When the probe fails the node is
# drained with a reason naming the failed checks and the script exits 0: the job is over
# and the node takes no other. It exits nonzero only where it could not drain the node
# itself, so that slurmd drains it ("Epilog error").
set -eu
GPUBAKE_HOOK=epilog
export GPUBAKE_HOOK
case $0 in
*/*) exec "${0%/*}/prolog.sh" ;;
*) exec ./prolog.sh ;;
esac
