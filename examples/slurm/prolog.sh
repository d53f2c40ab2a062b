#!/bin/sh
# Slurm Prolog (slurm.conf: Prolog=/etc/slurm/gpubake/prolog.sh): `gpubake probe` on this
# node before each job. When the probe fails, the node is drained with a reason that names
# the failed checks, and the script exits nonzero, so slurmd does not start the job here:
# Slurm requeues it (held, unless SchedulerParameters has nohold_on_prolog_fail) and it runs
# on another node. The same script is the Epilog through epilog.sh, which probes the node
# the job just left.
#
# Settings come from the environment or from a file of shell assignments, read in that order
# (the file wins): $GPUBAKE_PROBE_CONF, else gpubake-probe.conf beside slurm.conf
# ($SLURM_CONF's directory, /etc/slurm when unset). See gpubake-probe.conf here.
#
# Exit codes of the probe: 0 pass (warnings included) runs the job; 1 a check failed, 2 bad
# input (the settings' flags), 3 no GPU visible, anything else (124: no verdict in time) each
# drain the node. Exit 3 on a GPU node means the driver or the device nodes are gone;
# GPUBAKE_ON_NO_GPU=pass lets a node without GPUs that shares this script run jobs.
set -eu

# slurmd runs prologs with no search path.
PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
export PATH

hook=${GPUBAKE_HOOK:-prolog}
case $hook in
prolog | epilog) ;;
*)
  echo "gpubake: GPUBAKE_HOOK=$hook: expected prolog or epilog" >&2
  exit 2
  ;;
esac

conf=${GPUBAKE_PROBE_CONF:-}
if [ -z "$conf" ]; then
  slurm_conf=${SLURM_CONF:-/etc/slurm/slurm.conf}
  conf=${slurm_conf%/*}/gpubake-probe.conf
fi
if [ -f "$conf" ]; then
  # shellcheck disable=SC1090 # the site's settings, named at run time
  . "$conf"
fi

bin=${GPUBAKE_BIN:-/usr/local/bin/gpubake}
if [ "$hook" = prolog ]; then
  level=${GPUBAKE_PROLOG_LEVEL:-1}
else
  level=${GPUBAKE_EPILOG_LEVEL:-1}
fi
flags=${GPUBAKE_PROBE_FLAGS:-}
dir=${GPUBAKE_REPORT_DIR:-/var/lib/gpubake}
on_no_gpu=${GPUBAKE_ON_NO_GPU:-drain}
gpus=${GPUBAKE_GPUS:-all}
node=${SLURMD_NODENAME:-$(hostname -s)}
job=${SLURM_JOB_ID:-none}

# A line in hooks.log (and syslog, where logger is).
log() {
  printf '%s %s job %s node %s: %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$hook" "$job" "$node" "$1" \
    >>"$dir/hooks.log" 2>/dev/null || true
  if command -v logger >/dev/null 2>&1; then
    logger -t "gpubake-$hook" -- "job $job: $1" || true
  fi
}

# Drains the node with `gpubake HOOK level L (job J): $1` as the reason, and exits: 1 from
# a prolog, so that the job does not run here; 0 from an epilog once the node is drained (the
# job is over and the node takes no other), 1 where it could not be, so that slurmd drains it.
# Slurm's own drain on a failed prolog or epilog says only "Prolog error" or "Epilog error".
drain() {
  # Quotes and line breaks have no place in a reason.
  reason=$(printf 'gpubake %s level %s (job %s): %s' "$hook" "$level" "$job" "$1" |
    tr -d '"\r' | tr '\n\t' '  ' | cut -c1-250)
  log "$reason"
  # A node drained already keeps the reason it has: the first cause (the prolog's, before the
  # epilog of the same job fails the same way; an administrator's) is the one to read.
  state=$(scontrol -o show node "$node" 2>/dev/null |
    awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^State=/) print substr($i, 7) }') || state=
  drained=0
  case $state in
  *DRAIN*) log "node already drained (State=$state): its reason is kept" ;;
  *) scontrol update nodename="$node" state=drain reason="$reason" || drained=$? ;;
  esac
  if [ "$hook" = epilog ] && [ "$drained" -eq 0 ]; then
    exit 0
  fi
  exit 1
}

mkdir -p "$dir" || drain "settings: cannot make GPUBAKE_REPORT_DIR=$dir"

case $level in
off) exit 0 ;;
1) limit=30 ;;
2) limit=180 ;;
3)
  # Level 3's budget grows with its burn (120 s + the burn + 60 s), here with 60 s to spare.
  burn=$(printf '%s\n' "$flags" | sed -n 's/.*--burn-seconds[= ]*\([0-9][0-9]*\).*/\1/p')
  limit=$((120 + ${burn:-600} + 60 + 60))
  ;;
*) drain "settings: level $level: expected 1, 2, 3 or off" ;;
esac
limit=${GPUBAKE_TIMEOUT:-$limit}

# Which GPUs: every GPU of the node (level 1 only reads NVML, so it disturbs no other job's
# GPUs), or only those Slurm gave the job (its CUDA_VISIBLE_DEVICES, set in the prolog's
# environment where GPUs are GRES), for level 2 and 3 on nodes that jobs share.
case $gpus in
all) unset CUDA_VISIBLE_DEVICES ;;
job) [ -n "${CUDA_VISIBLE_DEVICES:-}" ] || unset CUDA_VISIBLE_DEVICES ;;
*) drain "settings: GPUBAKE_GPUS=$gpus: expected all or job" ;;
esac
case $on_no_gpu in
drain | pass) ;;
*) drain "settings: GPUBAKE_ON_NO_GPU=$on_no_gpu: expected drain or pass" ;;
esac

report=$dir/$hook.txt
junit=$dir/$hook.xml
errors=$dir/$hook.err
# Prologs of jobs that start together on a shared node run at once: each writes its own
# files and moves them into place.
tmp=$dir/.$hook.$job.$$
set -- --level "$level" --junit "$tmp.xml"
if [ -n "${GPUBAKE_PROMETHEUS_FILE:-}" ]; then
  set -- "$@" --emit "prometheus:$GPUBAKE_PROMETHEUS_FILE"
fi
if [ -n "${GPUBAKE_NFD_FILE:-}" ]; then
  set -- "$@" --emit "nfd:$GPUBAKE_NFD_FILE"
fi
# GPUBAKE_PROBE_FLAGS is a list of words (`--policy /etc/gpubake/policy.yaml`).
# shellcheck disable=SC2086
set -- "$@" $flags

rc=0
if command -v timeout >/dev/null 2>&1; then
  timeout -k 5 "$limit" "$bin" probe "$@" >"$tmp.txt" 2>"$tmp.err" || rc=$?
else
  "$bin" probe "$@" >"$tmp.txt" 2>"$tmp.err" || rc=$?
fi
mv -f "$tmp.txt" "$report"
mv -f "$tmp.err" "$errors"
if [ -f "$tmp.xml" ]; then mv -f "$tmp.xml" "$junit"; fi

# The failed checks of the report as `phase: name`, comma-separated, at most three named,
# then ` -- ` and the first one's detail. The report's lines are `  FAIL  NAME  DETAIL`
# under `# PHASE`; a name never holds two spaces in a row.
failed() {
  awk '
    /^# [0-9]+ passed, / { next }
    /^# / { phase = substr($0, 3); next }
    /^  FAIL  / {
      rest = substr($0, 9)
      cut = index(rest, "  ")
      name = cut ? substr(rest, 1, cut - 1) : rest
      detail = cut ? substr(rest, cut) : ""
      sub(/^ +/, "", detail)
      n++
      if (n == 1) first = detail
      if (n <= 3) names = names (n > 1 ? ", " : "") phase ": " name
    }
    END {
      if (n == 0) exit
      if (n > 3) names = names " (+" (n - 3) " more)"
      printf "%s -- %s", names, first
    }
  ' "$report"
}

# The probe's last line on standard error: its own words for what stopped it.
last_words() {
  awk 'NF { line = $0 } END { print line }' "$errors"
}

case $rc in
0) verdict= ;;
1) verdict="FAIL $(failed)" ;;
2) verdict="bad input (exit 2): $(last_words)" ;;
3)
  if [ "$on_no_gpu" = pass ]; then
    verdict=
  else
    verdict="no GPU visible (exit 3): FAIL $(failed)"
  fi
  ;;
124 | 137) verdict="no verdict within $limit s (exit $rc)" ;;
126 | 127) verdict="cannot run $bin (exit $rc): $(last_words)" ;;
*) verdict="exit $rc: $(last_words)" ;;
esac

if [ -z "$verdict" ]; then
  log "probe level $level exit $rc: pass"
  exit 0
fi
log "probe level $level exit $rc"
drain "$verdict"
