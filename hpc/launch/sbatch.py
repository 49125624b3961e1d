"""Render a plan as a self-contained heterogeneous sbatch script that people read, edit and submit.

One het component per partition of the plan; each unit is an `srun --het-group=K`
step in a restart loop that follows its role's policy. Nothing user- or
site-specific is baked in: the run directory and the Python come from the
environment and are printed before anything starts.
"""

from __future__ import annotations

import shlex

from .plan import CONFIG_ERROR_EXIT, Plan, RestartPolicy
from .steps import ALLOCATION_VARS, Unit, srun_args, task_command, units

RESTARTS = "@RESTARTS@"

_HELPERS = r'''
# run_unit NAME POLICY MAX_RESTARTS BACKOFF_S COMMAND...
#   Runs COMMAND until its role's policy says stop; "$restarts" in COMMAND counts restarts.
#   A fail-run unit that ends (or any unit out of restarts) ends the whole job.
run_unit() {
  local name=$1 policy=$2 max=$3 backoff=$4; shift 4
  local restarts=0 rc
  while true; do
    "${@//@RESTARTS@/$restarts}"
    rc=$?
    # srun reports the highest code of its tasks: a rank stopped for another's failure hides it.
    if ((rc != 0)); then
      rc=$("$PYTHON" -m hpc.launch.state "$RUN_DIR" exit-code "$name" "$restarts" "$rc" || echo "$rc")
    fi
    echo "agentrl: $name exited with $rc (restarts so far: $restarts)"
    [[ -e $END_FILE || -e $REQUEUE_FILE ]] && return   # the run is ending or requeueing: no restarts
    case $policy in
      fail-run) end_run "$rc" "$name exited with $rc"; return ;;
      ignore) return ;;
    esac
    if ((rc == @CONFIG_ERROR@)); then       # a bad config: starting it again cannot help
      end_run "$rc" "$name exited with $rc, a configuration error: not restarted"; return
    fi
    if ((restarts >= max)); then
      end_run $((rc ? rc : 1)) "$name exited with $rc after $restarts restarts"; return
    fi
    restarts=$((restarts + 1))
    sleep "$backoff"
  done
}

# The first unit to end the run writes its exit code; the main loop sees it and stops the others.
end_run() {
  [[ -e $END_FILE ]] || printf '%s %s\n' "$1" "$2" > "$END_FILE"
}
'''

_MAIN_LOOP = r'''
trap 'end_run 143 "stopped by a signal"' TERM INT
# SIGUSR2 comes before a time limit or preemption (#SBATCH --signal): the fail-run roles
# checkpoint; once they exit (or the grace runs out) the job requeues itself and the run
# resumes from $RUN_DIR. (Slurm holds a requeued job about 120 s before it starts again.)
# shellcheck disable=SC2317  # called by the USR2 trap
request_requeue() {
  echo "agentrl: SIGUSR2: checkpoint, then requeue within ${CHECKPOINT_GRACE_S}s"
  touch "$REQUEUE_FILE"
  requeue_deadline=$((SECONDS + CHECKPOINT_GRACE_S))
  for step in $(squeue -h -s -j "$SLURM_JOB_ID" -o '%i %j' | awk -v roles=" $FAIL_RUN_ROLES " \
                'index(roles, " " $2 " ") {print $1}'); do
    scancel --signal=USR2 "$step"
  done
}
trap request_requeue USR2
# shellcheck disable=SC2317
fail_run_units_running() {
  local pid
  for pid in "${FAIL_RUN_PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && return 0; done
  return 1
}
"$PYTHON" -m hpc.launch.state "$RUN_DIR" running
requeue_deadline=
while [[ ! -e $END_FILE ]] && [[ -n $(jobs -rp) ]]; do
  if [[ -n $requeue_deadline ]] && { ((SECONDS >= requeue_deadline)) || ! fail_run_units_running; }; then
    end_run 0 "requeued after SIGUSR2"
    break
  fi
  sleep 1 & wait $!
done
read -r code message < "$END_FILE" 2>/dev/null || { code=0; message="every role ended"; }
echo "agentrl: ending the run: $message"
# SIGTERM to every step's tasks first (their wrappers stop their process groups), then wait.
scancel --signal=TERM "$SLURM_JOB_ID"
for _ in $(seq 30); do [[ -z $(jobs -rp) ]] && break; sleep 1; done
for pid in $(jobs -rp); do pkill -KILL -P "$pid"; kill -KILL "$pid"; done 2>/dev/null
wait
if [[ -e $REQUEUE_FILE ]]; then
  "$PYTHON" -m hpc.launch.state "$RUN_DIR" requeued "$message"
  scontrol requeue "$SLURM_JOB_ID"   # ends this job; it starts again with the same id
  exit 0
fi
case $code in
  0) state=finished ;;
  143) state=stopped ;;
  *) state=failed ;;
esac
"$PYTHON" -m hpc.launch.state "$RUN_DIR" "$state" "$message"
exit "$code"
'''


def _quote(cmd: list[str]) -> str:
    return " ".join('"@RESTARTS@"' if c == RESTARTS else shlex.quote(c) for c in cmd)


def render_sbatch(plan: Plan, *, source: str = "") -> str:
    comps = plan.components()
    fail_run = [n for n, r in plan.roles.items() if r.restart.policy is RestartPolicy.FAIL_RUN]
    lines = ["#!/bin/bash",
             f"# agentrl-hpc: heterogeneous job for plan {plan.name!r}{f' ({source})' if source else ''}.",
             "# Rendered by `agentrl launch CONFIG --executor sbatch --dry-run`; edit freely.",
             "# Needs: AGENTRL_RUN_DIR (the run directory, on the shared filesystem);",
             "#        AGENTRL_PYTHON (default python3: the interpreter with agentrl-hpc installed).",
             f"#SBATCH --job-name={plan.name}",
             f"#SBATCH --time={plan.time_limit_min}",
             "#SBATCH --signal=B:USR2@120",
             "#SBATCH --requeue"]
    for c in comps:
        if c.index:
            lines.append("#SBATCH hetjob")
        gres = f" --gres=gpu:{c.gpus_per_node}" if c.gpus_per_node else ""
        lines.append(f"#SBATCH --partition={c.partition} --nodes={c.nodes} --ntasks-per-node=1 "
                     f"--cpus-per-task={c.cpus_per_node} --mem={c.mem_mb_per_node}M{gres}")
    lines += ["set -uo pipefail", "",
              'RUN_DIR=${AGENTRL_RUN_DIR:?set AGENTRL_RUN_DIR to the run directory on the shared filesystem}',
              "PYTHON=${AGENTRL_PYTHON:-python3}",
              'END_FILE="$RUN_DIR/launch/end-$SLURM_JOB_ID"',
              'REQUEUE_FILE="$RUN_DIR/launch/requeue-$SLURM_JOB_ID"',
              f"CHECKPOINT_GRACE_S={plan.checkpoint_grace_s:g}",
              f'FAIL_RUN_ROLES="{" ".join(fail_run)}"',
              "FAIL_RUN_PIDS=()",
              '# A requeued job keeps its id: forget how its last run ended.',
              'rm -f "$END_FILE" "$REQUEUE_FILE"',
              "# Set for the whole allocation; a step that inherits them gets the allocation's",
              "# task counts and GPUs instead of its own.",
              f"unset {' '.join(ALLOCATION_VARS)}",
              "for v in $(compgen -v | grep -E '^SLURM_(NTASKS_PER_NODE|GPUS_PER_NODE)_(HET|PACK)_GROUP_'); do",
              '  unset "$v"',
              "done",
              'mkdir -p "$RUN_DIR/logs" "$RUN_DIR/launch"',
              'echo "agentrl: job $SLURM_JOB_ID, run directory $RUN_DIR, python $PYTHON"']
    het = len(comps) > 1
    for c in comps:
        var = f"SLURM_JOB_NODELIST_HET_GROUP_{c.index}" if het else "SLURM_JOB_NODELIST"
        lines += [f'mapfile -t NODES_{c.index} < <(scontrol show hostnames "${var}")',
                  f'echo "agentrl: component {c.index} (partition {c.partition}, roles {", ".join(c.roles)}):'
                  f' nodes ${{NODES_{c.index}[*]}}, {c.gpus_per_node} GPUs per node"']
    lines.append(_HELPERS.replace("@CONFIG_ERROR@", str(CONFIG_ERROR_EXIT)))
    for unit in units(plan):
        lines.append(_unit_line(plan, unit, het))
        if plan.roles[unit.role].restart.policy is RestartPolicy.FAIL_RUN:
            lines.append("FAIL_RUN_PIDS+=($!)")
    lines.append(_MAIN_LOOP)
    return "\n".join(lines)


def _unit_line(plan: Plan, unit: Unit, het: bool) -> str:
    role = plan.roles[unit.role]
    comp = plan.component_of(unit.role)
    nodes = f"NODES_{comp.index}"
    first = comp.offsets[unit.role]
    if unit.index is None:
        nodelist = f"$(IFS=,; echo \"${{{nodes}[*]:{first}:{role.nodes}}}\")"
    else:
        nodelist = f"${{{nodes}[{first + unit.index % role.nodes}]}}"
    srun = srun_args(unit, role, log_dir="@LOGS@", het_group=comp.index if het else None, nodelist="@NODES@")
    cmd = [*srun, *task_command("@PYTHON@", "@RUN@", unit, role, RESTARTS)]
    text = _quote(cmd)
    for k, v in {"@LOGS@": '"$RUN_DIR"/logs', "@NODES@": f'"{nodelist}"', "@PYTHON@": '"$PYTHON"',
                 "@RUN@": '"$RUN_DIR"'}.items():
        text = text.replace(shlex.quote(k), v).replace(k, v.replace('"', ""))
    env = " ".join(f"{k}={shlex.quote(v)}" for k, v in role.env.items())
    prefix = f"env {env} " if env else ""
    return (f"run_unit {unit.key} {role.restart.policy.value} {role.restart.max_restarts} "
            f"{role.restart.backoff_s:g} {prefix}{text} &")
