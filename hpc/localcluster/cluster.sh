#!/usr/bin/env bash
# A real Slurm cluster on one machine: munged + slurmctld + three slurmd
# (gpu1 with 4 fake GPUs, cpu1, cpu2), each slurmd started with -N and its own port.
#
#   cluster.sh up       start (idempotent), wait until every node is idle
#   cluster.sh down     stop only the daemons that `up` started (by pid file)
#   cluster.sh status   print daemons and sinfo
#   cluster.sh env      print the export line that points Slurm clients here
#
# Everything lives under $AGENTRL_CLUSTER_DIR (default ~/.local/state/agentrl/local-cluster):
# slurm.conf, gres.conf, the munge key and socket, state, spool, logs, pid files.
#
# With AGENTRL_CLUSTER_SHARED (a path) and AGENTRL_CLUSTER_MOUNT (a command that mounts the shared
# volume at the path it is given last; `agentrl cluster up --shared` sets both), each slurmd runs in a
# mount namespace of its own where that path is the node's own mount of the volume.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
D=${AGENTRL_CLUSTER_DIR:-$HOME/.local/state/agentrl/local-cluster}
D=$(mkdir -p "$D" && cd "$D" && pwd)   # slurmctld daemonizes into /: absolute paths only
CTLD_PORT=${AGENTRL_CLUSTER_PORT:-6817}   # slurmd of gpu1, cpu1, cpu2: +11, +12, +13
NODES=(gpu1 cpu1 cpu2)
TIMEOUT=${AGENTRL_CLUSTER_TIMEOUT:-60}
export SLURM_CONF=$D/etc/slurm.conf

die() { echo "cluster: $*" >&2; exit 1; }
alive() { [[ -f $1 ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

need_tools() {
  local missing=()
  for t in munged mungekey slurmctld slurmd sinfo scontrol; do
    command -v "$t" >/dev/null || missing+=("$t")
  done
  ((${#missing[@]} == 0)) && return 0
  die "missing ${missing[*]}. On Debian/Ubuntu as root: apt-get install slurm-wlm munge
  (\`make sysdeps\` does it). On a cluster you already have Slurm: use it instead of this local one."
}

render_config() {
  mkdir -p "$D"/{etc,munge,state,log,run,dev} "$D"/spool/{gpu1,cpu1,cpu2}
  chmod 700 "$D/munge"
  local user host
  user=$(id -un); host=$(hostname -s)
  # Fake GPUs: gres.conf drops a GPU without a File= and rejects regular files;
  # a symlink to /dev/null is a character device that slurmd accepts.
  for i in 0 1 2 3; do ln -sfn /dev/null "$D/dev/nvidia$i"; done
  sed -e "s|@DIR@|$D|g" -e "s|@USER@|$user|g" -e "s|@HOST@|$host|g" \
      -e "s|@CTLD_PORT@|$CTLD_PORT|g" -e "s|@PORT_GPU1@|$((CTLD_PORT + 11))|g" \
      -e "s|@PORT_CPU1@|$((CTLD_PORT + 12))|g" -e "s|@PORT_CPU2@|$((CTLD_PORT + 13))|g" \
      "$here/slurm.conf.in" > "$D/etc/slurm.conf.new"
  sed -e "s|@DIR@|$D|g" "$here/gres.conf.in" > "$D/etc/gres.conf"
  if [[ -f $D/etc/slurm.conf ]] && ! cmp -s "$D/etc/slurm.conf.new" "$D/etc/slurm.conf"; then
    # Running daemons would keep the old ports and nodes: restart them on the new config.
    stop_slurm
  fi
  mv "$D/etc/slurm.conf.new" "$D/etc/slurm.conf"
}

start_munge() {
  alive "$D/run/munged.pid" && return 0
  [[ -f $D/munge/munge.key ]] || mungekey --create --keyfile="$D/munge/munge.key" \
    || die "could not create the munge key in $D/munge"
  chmod 600 "$D/munge/munge.key"
  munged --force --key-file="$D/munge/munge.key" --socket="$D/munge/munge.socket" \
    --pid-file="$D/run/munged.pid" --log-file="$D/log/munged.log" \
    --seed-file="$D/munge/munged.seed" \
    || die "munged did not start; see $D/log/munged.log"
}

start_slurm() {
  if ! alive "$D/run/slurmctld.pid"; then
    slurmctld -i -L "$D/log/slurmctld.log" \
      || die "slurmctld did not start; see $D/log/slurmctld.log"
  fi
  for n in "${NODES[@]}"; do
    if alive "$D/run/slurmd-$n.pid"; then
      # a node up without its own client of the shared volume is started again with one
      [[ -z ${AGENTRL_CLUSTER_SHARED:-} ]] || alive "$D/run/glusterfs-$n.pid" && continue
      stop_pid "$D/run/slurmd-$n.pid"
    fi
    start_slurmd "$n"
  done
}

start_slurmd() {
  local n=$1
  if [[ -z ${AGENTRL_CLUSTER_SHARED:-} ]]; then
    slurmd -N "$n" -L "$D/log/slurmd-$n.log" || die "slurmd $n did not start; see $D/log/slurmd-$n.log"
    return
  fi
  # The namespace lives as long as a process in it: slurmd, its job steps, and the node's FUSE client
  # (both daemonize). Private propagation: the host's mount, lazily unmounted here, stays the host's.
  stop_pid "$D/run/glusterfs-$n.pid"
  unshare --mount --propagation private -- bash -c '
    umount -l "$1" && $2 --pid-file="$3" --log-file="$4" "$1" && mountpoint -q "$1" \
      || { echo "mounting the shared volume at $1 failed; see $4" >&2; exit 1; }
    exec slurmd -N "$5" -L "$6"' _ "$AGENTRL_CLUSTER_SHARED" "$AGENTRL_CLUSTER_MOUNT" \
    "$D/run/glusterfs-$n.pid" "$D/log/glusterfs-$n.log" "$n" "$D/log/slurmd-$n.log" \
    || die "slurmd $n did not start on its own client of $AGENTRL_CLUSTER_SHARED; see $D/log/slurmd-$n.log"
}

wait_idle() {
  local deadline=$((SECONDS + TIMEOUT)) states
  while ((SECONDS < deadline)); do
    states=$(sinfo -h -N -p all -o '%N %T' 2>/dev/null | sort -u || true)
    if [[ $(grep -c ' idle$' <<<"$states") -eq ${#NODES[@]} ]]; then
      echo "cluster: up (${NODES[*]} idle); export SLURM_CONF=$SLURM_CONF"
      return 0
    fi
    # A node left down by an earlier run comes back once its slurmd registers.
    grep -qE ' (down|drain)' <<<"$states" && scontrol update nodename=ALL state=resume 2>/dev/null || true
    sleep 1
  done
  echo "cluster: nodes not idle after ${TIMEOUT}s:" >&2
  echo "${states:-  (slurmctld does not answer)}" >&2
  for f in "$D"/log/*.log; do echo "--- tail $f" >&2; tail -n 5 "$f" >&2; done
  die "see the logs in $D/log"
}

stop_pid() {
  local f=$1
  alive "$f" || { rm -f "$f"; return 0; }
  local pid; pid=$(cat "$f")
  kill "$pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$pid" 2>/dev/null || true
  rm -f "$f"
}

stop_slurm() {
  for n in "${NODES[@]}"; do stop_pid "$D/run/slurmd-$n.pid"; stop_pid "$D/run/glusterfs-$n.pid"; done
  stop_pid "$D/run/slurmctld.pid"
}

case ${1:-} in
  up)
    need_tools
    render_config
    start_munge
    start_slurm
    wait_idle
    ;;
  down)
    stop_slurm
    stop_pid "$D/run/munged.pid"
    echo "cluster: down"
    ;;
  status)
    for p in munged slurmctld "${NODES[@]/#/slurmd-}" "${NODES[@]/#/glusterfs-}"; do
      [[ $p != glusterfs-* || -f $D/run/$p.pid ]] || continue
      if alive "$D/run/$p.pid"; then echo "$p: running (pid $(cat "$D/run/$p.pid"))"; else echo "$p: stopped"; fi
    done
    # A stopped cluster is an answer, not a failure: exit 0 unless sinfo itself fails.
    if alive "$D/run/slurmctld.pid"; then sinfo; fi
    ;;
  env)
    echo "export SLURM_CONF=$SLURM_CONF"
    ;;
  *)
    echo "usage: $0 up|down|status|env" >&2; exit 2 ;;
esac
