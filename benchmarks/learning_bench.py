"""Does the loop learn? A warm start, GRPO through the whole loop, and a control, scored on held-out tasks.

    python -m benchmarks.learning_bench [--seed 0] [--split heldout] [--work .cache/learn]
                                        [--rollouts 16] [--json]          (make learn)

Every stage is the command a user would run, in order, each skipped when its output is there
(delete a stage's directory under --work to redo it):
 1. model     tools/make_tiny_model.py: the offline tokenizer, a Qwen2 of width 128 and 4 layers (1.1M)
 2. tasks     agentrl tasks generate pyfix-hint: --train-tasks train tasks and --eval-tasks of --split
 3. teacher   agentrl eval MODEL with eval.engine: teacher, eval.save_samples: the scripted teacher
              (right half of the time) solves each train task once through the real adapter,
              sandboxes and grader; its token-exact samples are the demonstrations
 4. warm      agentrl sft on every demonstration, right or wrong
 5. grpo      agentrl launch WORK/grpo.yaml --executor local: the CPU inference server, the pool
              (bwrap sandboxes, the builtin agent, the adapter), the ledger and the torch trainer;
              then agentrl eval --watch scores every --eval-every-th checkpoint on the eval split
 6. control   the same run, config and seeds with train.control: shuffle_rewards, scored at its
              last checkpoint only
 7. ahead     with --max-staleness K: the GRPO run with train.max_staleness K (rollouts run ahead of
              training), scored as GRPO is; both curves are printed, and its last checkpoint should
              lie within GRPO's 95% interval
The warm start is scored once, as iter_0 of both runs. One table then shows eval pass@1 of the warm
start, after GRPO and after the control, each with its attempts and a 95% interval resampled by
task, the paired differences, and the wall time of each stage; WORK/runs/grpo/report.md has both
curves and the control (agentrl report --control).

    figure:   held-out pass@1 after GRPO
    baseline: held-out pass@1 of the warm start, and of the control (the same compute, rewards
              shuffled within each group: what the policy gains without the verifier's signal)
Targets on 2 cores: GRPO - warm start >= 25 points within 20 minutes of GRPO; |control - warm| <= 5.
With --harness mini_swe_agent_text (issue 30): >= 20 points within 45 minutes, the control as above, and the
sample path's fidelity in the GRPO run (agentrl/report/fidelity.py): every trained token the sampled one,
one sample per attempt that never forked; forks (format errors) and the adapter's time per turn reported.
Its defaults differ (HARNESS_DEFAULTS): 24 rollouts at --lr 1.6667e-5, and 40 eval tasks x 8 attempts at the
warm start and the last checkpoint.
--moe EXPERTS (issue 48): the model a mixture of experts (Qwen3-MoE, EXPERTS a layer, 2 a token), the runs with
train.routing_replay (--no-replay: without); --serve-dtype bfloat16 serves it in bfloat16 against the float32
trainer, a real mismatch source. Each such run has a work directory of its own.
"""

from __future__ import annotations

import sys
from pathlib import Path

if not __package__:     # run as `python benchmarks/NAME.py`: the checkout's root, for `benchmarks.*` imports
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import argparse
import json
import shutil
import signal
import subprocess
import time

import yaml

from agentrl.eval.stats import Estimate, paired_difference, pass_at_1, read_results
from agentrl.report.fidelity import check_run
from benchmarks.common import stop

ROOT = Path(__file__).resolve().parents[1]

BIN = Path(sys.executable).parent
PROGRESS_S = 30.0

# tests/test_learning.py: make learn in miniature (docs/learning.md, "The CI test"). Its stages before GRPO
# (model, tasks, teacher, warm start, probe) are made by tools/learning_fixture.py into tests/data/learning.
# make learn's model (128 wide, 4 layers): the 64-wide tiny model, warm-started as briefly, earns no reward
# at all, and a policy that never passes has nothing to learn from.
MINIATURE = ["--seed", "3", "--train-tasks", "64", "--eval-tasks", "12", "--sft-epochs", "10",
             "--teacher-accuracy", "0.7", "--rollouts", "4", "--groups", "8", "--attempts", "8",
             "--step-attempts", "16", "--lr", "2e-4", "--eval-every", "4"]
# tests/test_learning_mini.py: the sample path through mini-swe-agent, checked token by token (its fixture by
# tools/learning_fixture.py --harness mini_swe_agent_text). A warm start trained on 48 demonstrations of a
# teacher right 90% of the time: it still makes format errors (forks) on most attempts, and passes often
# enough that forked attempts pass too (at 70%: 2 of 25 forked attempts passed, too few to rely on).
MINI_MINIATURE = ["--harness", "mini_swe_agent_text", "--seed", "3", "--train-tasks", "48", "--eval-tasks", "8",
                  "--sft-epochs", "12", "--teacher-accuracy", "0.9", "--rollouts", "2", "--groups", "4",
                  "--attempts", "4", "--step-attempts", "8", "--lr", "2e-4", "--eval-every", "2"]
MINIATURES = {"builtin": MINIATURE, "mini_swe_agent_text": MINI_MINIATURE}
PROBE_N, PROBE_SEED = 8, 11


HARNESSES = ("builtin", "mini_swe_agent_text")
# What each harness's run takes when not given (docs/learning.md). Through mini, shuffled rewards at 5e-5 cost
# seed 1's held-out pass@1 25 points, at 2.5e-5 seeds 0, 2, 3's moved +6, -2, -6; a control's drift grows with
# the step, so mini takes more, smaller ones: 24 rollouts of 1.67e-5, the step x steps of 16 of 2.5e-5 (seed 3's
# control: -0.9). Its 40 x 2 evals put about 15 points of noise on a control's drift, so its evals score 40 tasks
# 8 times each (6 minutes an eval): the warm start, GRPO's last checkpoint and the control's.
HARNESS_DEFAULTS = {"builtin": {"eval_tasks": 80, "eval_n": 2, "eval_every": 4, "rollouts": 16, "lr": 5e-5},
                    "mini_swe_agent_text": {"eval_tasks": 40, "eval_n": 8, "eval_every": 24, "rollouts": 24,
                                            "lr": 1.6667e-5}}


class BenchParser(argparse.ArgumentParser):
    """The bench's arguments, with the harness's defaults where they were not given."""

    def parse_known_args(self, args=None, namespace=None):    # type: ignore[override]
        ns, rest = super().parse_known_args(args, namespace)
        for name, value in HARNESS_DEFAULTS[ns.harness].items():
            if getattr(ns, name) is None:
                setattr(ns, name, value)
        return ns, rest


TARGETS = {"builtin": (0.25, 20), "mini_swe_agent_text": (0.20, 45)}    # (gain over the warm start, GRPO minutes)
# docs/learning.md's targets, for every harness: the gain's 95% interval clear of 10 points; the control's
# drift within 5 points and its interval inside +-10
GAIN_LOW = 0.10
DRIFT, DRIFT_INTERVAL = 0.05, 0.10
# mini-swe-agent's text format as a user would set it up for a small model (docs/learning.md): its own
# config layer (`-c key=value`, after mini_textbased.yaml's) replaces the templates. Its instance template
# (a workflow, rules and examples) made the first prompt 1028 tokens of the tiny tokenizer against the
# builtin agent's 357; these keep what the protocol needs: one fenced action a reply, the submit command.
MINI_TEXT_CONFIG = {
    "agent.system_template": "Solve the task with bash. Each reply: a THOUGHT line, then one command in a "
                             "block:\n```mswea_bash_command\ncommand\n```\nWhen done, run "
                             "`echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT` alone.",
    "agent.instance_template": "{{task}}",
    "agent.step_limit": 12,
    "model.observation_template": "<returncode>{{output.returncode}}</returncode>\n<output>\n"
                                  "{{output.output[-2000:]}}</output>",
    "model.format_error_template": "Format error: {{error}}\nReply with one ```mswea_bash_command block.",
}


def harness_args(harness: str) -> list[str]:
    """The pool's extra_args for the harness: mini-swe-agent's config layer, key=value each."""
    if harness != "mini_swe_agent_text":
        return []
    return [arg for key, value in MINI_TEXT_CONFIG.items()
            for arg in ("-c", f"{key}={value if isinstance(value, str) else json.dumps(value)}")]


def replaying(args: argparse.Namespace) -> bool:
    """Whether the runs replay the MoE's routes (--moe without --no-replay)."""
    return bool(args.moe) and not args.no_replay


def pool(args: argparse.Namespace, *, routes: bool = False) -> dict:
    """The pool's settings, for training and eval alike (the task in PROBLEM_STATEMENT.md); with `routes`, the
    adapter keeps each token's experts (the training runs' pool with routing replay; eval needs none)."""
    return {"harness": args.harness, "prompt_style": "instruction", "max_agents": 2, "max_booting": 2,
            "adapter": {"max_context": 4096, "max_new_tokens": 96,
                        **({"return_routed_experts": True} if routes else {})},
            "lease_s": 60,
            **({"extra_args": harness_args(args.harness)} if harness_args(args.harness) else {}),
            **({"tools_dir": str(args.tools_dir)} if args.tools_dir else {})}


def last_line(log: Path) -> str:
    with log.open("rb") as f:
        f.seek(max(0, log.stat().st_size - 4096))
        lines = [line.strip() for line in f.read().decode(errors="replace").splitlines() if line.strip()]
    return lines[-1][:160] if lines else ""


def agentrl(*args: str | Path, log: Path, progress: Path | None = None) -> None:
    """One agentrl command, its output in `log`, and every PROGRESS_S the last line of `progress` (default:
    that log); a failure stops the bench, naming the log."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        proc = subprocess.Popen([str(BIN / "agentrl"), *map(str, args)], stdout=out, stderr=subprocess.STDOUT,
                                cwd=ROOT)
        try:
            while True:
                try:
                    code = proc.wait(PROGRESS_S)
                    break
                except subprocess.TimeoutExpired:
                    shown = progress if progress is not None and progress.exists() else log
                    print(f"    {last_line(shown)}", flush=True)
        finally:   # interrupted (^C, a test's timeout): the command goes too, and stops what it started
            stop(proc)
    if code:
        tail = log.read_text(errors="replace").splitlines()[-15:]
        raise SystemExit(f"learning_bench: `agentrl {' '.join(map(str, args))}` exited {code}; "
                         f"the end of {log}:\n" + "\n".join(tail))


def run_config(args: argparse.Namespace, work: Path, control: bool, max_staleness: int = 0) -> dict:
    """The GRPO run (or its control, or the run with rollouts ahead): everything but train.control and
    train.max_staleness is the same."""
    name = "agentrl-learn" + ("-control" if control else "") + (f"-ahead{max_staleness}" if max_staleness else "")
    return {
        "launch": {"name": name, "time_limit_min": 90,
                   "partitions": {"cpu": {"nodes": ["cpu1"], "cpus_per_node": 8, "mem_mb": 8000}},
                   "roles": {
                       "inference": {"command": ["agentrl", "serve"], "partition": "cpu", "mem_per_task_mb": 2000,
                                     "restart": {"policy": "restart", "max_restarts": 3, "backoff_s": 2}},
                       "pool": {"command": ["agentrl", "pool"], "partition": "cpu", "cpus_per_task": 2,
                                "mem_per_task_mb": 3000,
                                "restart": {"policy": "restart", "max_restarts": 3, "backoff_s": 2}},
                       "trainer": {"command": ["agentrl", "train"], "partition": "cpu", "cpus_per_task": 2,
                                   "mem_per_task_mb": 3000, "restart": {"policy": "fail-run"}}}},
        "inference": {"engine": "cpu", "model": str(work / "warm"), "port": 31000 + args.seed % 1000,
                      **({"dtype": args.serve_dtype} if args.serve_dtype != "float32" else {}),
                      **({"enable_return_routed_experts": True} if replaying(args) else {})},
        "train": {"model": str(work / "warm"), "prompt_data": str(work / "train.jsonl"),
                  "num_rollouts": args.rollouts, "rollout_batch_size": args.groups,
                  "n_samples_per_prompt": args.attempts, "global_batch_size": args.step_attempts,
                  "lr": args.lr, "max_tokens_per_gpu": 16384, "rollout_timeout_s": 900, "seed": args.seed,
                  "evals_after_last": False, **({"control": "shuffle_rewards"} if control else {}),
                  **({"max_staleness": max_staleness} if max_staleness else {}),
                  **({"kl_coef": args.kl_coef} if args.kl_coef else {}),
                  **({"routing_replay": True} if replaying(args) else {})},
        "pool": pool(args, routes=replaying(args)),
        # The control is scored at its last checkpoint only: its curve is flat by design, and on 2 cores
        # each eval costs minutes.
        "eval": {"tasks": str(work / args.split), "n_samples": args.eval_n, "seed": args.seed,
                 "every": args.rollouts if control else args.eval_every, "pool": pool(args)},
    }


class Stages:
    """The bench's stages over one work directory, each skipped when its output is there."""

    def __init__(self, args: argparse.Namespace, work: Path):
        self.args, self.work, self.logs, self.times = args, work, work / "logs", {}

    def stage(self, name: str, done: Path, *commands, progress: Path | None = None) -> None:
        if done.exists():
            print(f"[{name}] done already ({done})", flush=True)
            return
        print(f"[{name}] ...", flush=True)
        t0 = time.monotonic()
        for command in commands:
            if callable(command):
                command()
            else:
                agentrl(*command, log=self.logs / f"{name}.log", progress=progress)
        self.times[name] = round(time.monotonic() - t0, 1)
        print(f"[{name}] {self.times[name]:.0f} s", flush=True)

    def prepare(self) -> None:
        """Model, tasks, the teacher's demonstrations and the warm start."""
        self.inputs()
        self.warm_start()

    def inputs(self) -> None:
        """The model (its tokenizer and random weights), the tasks and the runs' configs."""
        args, work = self.args, self.work

        def tiny_model() -> None:
            subprocess.check_call([sys.executable, str(ROOT / "tools" / "make_tiny_model.py"), str(work / "base"),
                                   "--hidden-size", str(args.hidden_size), "--layers", str(args.layers),
                                   *(["--experts", str(args.moe)] if args.moe else [])],
                                  stdout=subprocess.DEVNULL)

        self.stage("model", work / "base" / "agentrl_tiny.json", tiny_model)
        self.stage("tasks", work / "train.jsonl",
                   ("tasks", "generate", "pyfix-hint", "--n", args.train_tasks, "--seed", args.seed, "--split",
                    "train", "--out", work / "train", "--force"),
                   ("tasks", "generate", "pyfix-hint", "--n", args.eval_tasks, "--seed", args.seed, "--split",
                    args.split, "--out", work / args.split, "--force"),
                   ("convert", "harbor", work / "train", "--out", work / "train.jsonl"))
        for name in ("grpo", "control"):
            write_yaml(work / f"{name}.yaml", run_config(args, work, control=name == "control"))
        if args.max_staleness:
            write_yaml(work / f"{ahead_name(args)}.yaml", run_config(args, work, False, args.max_staleness))

    def warm_start(self) -> None:
        """The teacher's demonstrations and the warm start trained on them."""
        args, work = self.args, self.work
        write_yaml(work / "teacher.yaml", {"eval": {
            "tasks": str(work / "train"), "n_samples": 1, "seed": args.seed, "engine": "teacher",
            "teacher_accuracy": args.teacher_accuracy, "save_samples": True, "pool": pool(args)}})
        self.stage("teacher", work / "teacher" / "summary.json",
                   ("eval", work / "base", "--config", work / "teacher.yaml", "--out", work / "teacher"))
        self.stage("warm start", work / "warm" / "sft.json",
                   ("sft", work / "teacher" / "samples", "--model", work / "base", "--out", work / "warm",
                    "--epochs", args.sft_epochs, "--lr", args.sft_lr, "--max-tokens-per-step", args.sft_step_tokens,
                    "--seed", args.seed))

    def probe(self) -> Path:
        """The warm start's own attempts at the held-out tasks, PROBE_N per task, their samples kept
        (tests/test_learning.py scores the policy where a passing and a failing one part); their directory."""
        args, work = self.args, self.work
        config = run_config(args, work, control=False)
        config["eval"] = {"tasks": str(work / args.split), "n_samples": PROBE_N, "seed": PROBE_SEED,
                          "save_samples": True, "pool": pool(args)}
        write_yaml(work / "probe.yaml", config)
        self.stage("probe", work / "probe-policy" / "summary.json",
                   ("eval", work / "warm", "--config", work / "probe.yaml", "--out", work / "probe-policy"))
        return work / "probe-policy" / "samples"

    def warm_eval(self) -> None:
        work = self.work
        self.stage("warm start eval", work / "eval-warm" / "summary.json",
                   ("eval", work / "warm", "--config", work / "grpo.yaml", "--out", work / "eval-warm"))

    def run(self, name: str, *, evals: bool = True) -> Path:
        """The GRPO run (or the control) and, with evals, its checkpoints scored; the run directory."""
        work, run = self.work, self.work / "runs" / name

        def seed_eval() -> None:   # the warm start is every run's iter_0
            shutil.copytree(work / "eval-warm", run / "eval" / "iter_0", dirs_exist_ok=True)

        made = run / "run.yaml"
        if made.exists():
            wanted = yaml.safe_load((work / f"{name}.yaml").read_text())["train"]
            had = yaml.safe_load(made.read_text())["config"].get("train")
            if had != wanted:
                changed = sorted(k for k in {*wanted, *(had or {})} if (had or {}).get(k) != wanted.get(k))
                raise SystemExit(f"learning_bench: {run} was made with another train config (differs in "
                                 f"{', '.join(changed)}): move it aside, or give another --work")
        self.stage(name, run / "checkpoints" / f"iter_{self.args.rollouts}" / "trainer.json",
                   ("launch", work / f"{name}.yaml", "--executor", "local", "--run-dir", run),
                   progress=run / "logs" / "trainer-0.log")     # the trainer says how far the rollout is
        if evals:
            self.stage(f"{name} eval", run / "eval" / f"iter_{self.args.rollouts}" / "summary.json",
                       seed_eval, ("eval", "--watch", run, "--until-done"))
        return run


def ahead_name(args: argparse.Namespace) -> str:
    """The run with rollouts ahead of training (train.max_staleness), beside the synchronous GRPO run."""
    return f"grpo-ahead{args.max_staleness}"


def write_yaml(path: Path, data: dict) -> None:
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def stages(args: argparse.Namespace, work: Path) -> dict[str, float]:
    s = Stages(args, work)
    s.prepare()
    s.warm_eval()
    s.run("grpo")
    if not args.no_control:
        s.run("control")
    if args.max_staleness:
        s.run(ahead_name(args))
    control = () if args.no_control else ("--control", work / "runs" / "control")
    agentrl("report", work / "runs" / "grpo", *control, log=s.logs / "report.log")
    return s.times


def summary(args: argparse.Namespace, work: Path, times: dict[str, float]) -> dict:
    warm = read_results(work / "eval-warm")
    grpo = read_results(work / "runs" / "grpo" / "eval" / f"iter_{args.rollouts}")
    est = {name: pass_at_1(r, seed=args.seed) for name, r in (("warm start", warm), ("GRPO", grpo))}
    diff = {"GRPO - warm start": paired_difference(grpo, warm, seed=args.seed)}
    if not args.no_control:
        control = read_results(work / "runs" / "control" / "eval" / f"iter_{args.rollouts}")
        est["control"] = pass_at_1(control, seed=args.seed)
        diff["control - warm start"] = paired_difference(control, warm, seed=args.seed)
        diff["GRPO - control"] = paired_difference(grpo, control, seed=args.seed)
    # The run's own account (rollouts, training, checkpoints, publishing), which a skipped stage still has
    grpo_metrics = [json.loads(line) for line in (work / "runs" / "grpo" / "metrics.jsonl").read_text().splitlines()
                    if line.strip()]
    grpo_s = sum(m.get("wait_s", m.get("rollout_s", 0)) + m.get("train_s", 0) + m.get("checkpoint_s", 0)
                 + m.get("publish_s", 0) for m in grpo_metrics if "rollout" in m)
    targets = verdicts(args.harness, diff, grpo_s)
    rollouts = check_run(work / "runs" / "grpo", work / "warm")
    checked = sum(r.checked_tokens for r in rollouts)
    targets["trained tokens equal to the sampled ids: 100%"] = bool(checked) and all(
        r.matching_tokens == r.checked_tokens for r in rollouts)
    targets["samples per clean attempt: 1"] = all(r.samples_per_clean_attempt in (None, 1) for r in rollouts)
    targets["no turn trained twice, reward off its grade or mask off its trace"] = not any(
        r.twice_trained or r.reward_mismatches or r.mask_mismatches for r in rollouts)
    curves = {"GRPO": curve(work / "runs" / "grpo", args)}
    if args.max_staleness:
        label = f"GRPO, {args.max_staleness} ahead"
        ahead = read_results(work / "runs" / ahead_name(args) / "eval" / f"iter_{args.rollouts}")
        est[label] = pass_at_1(ahead, seed=args.seed)
        diff[f"{label} - GRPO"] = paired_difference(ahead, grpo, seed=args.seed)
        curves[label] = curve(work / "runs" / ahead_name(args), args)
        sync = est["GRPO"]
        targets[f"{label} within GRPO's 95% interval"] = sync.low <= est[label].value <= sync.high
    return {"estimates": est, "differences": diff, "curves": curves, "grpo_training_s": round(grpo_s, 1),
            "stage_s": times, "targets": targets, "fidelity": [r.to_json() for r in rollouts]}


def verdicts(harness: str, diff: dict[str, Estimate], grpo_s: float) -> dict[str, bool]:
    """The targets the figures meet, each named with its thresholds: the gain's point and its interval's low
    end, GRPO's minutes, and (where a control ran) the control's drift, point and interval."""
    gain, minutes = TARGETS[harness]
    g = diff["GRPO - warm start"]
    out = {f"gain >= {pct(gain)} points": g.value >= gain,
           f"gain's 95% interval low end >= {pct(GAIN_LOW)} points": g.low >= GAIN_LOW,
           f"GRPO within {minutes} minutes": grpo_s <= minutes * 60}
    if (c := diff.get("control - warm start")) is not None:
        out[f"|control drift| <= {pct(DRIFT)} points"] = abs(c.value) <= DRIFT
        out[f"control's 95% interval inside +-{pct(DRIFT_INTERVAL)} points"] = \
            -DRIFT_INTERVAL <= c.low and c.high <= DRIFT_INTERVAL
    return out


def pct(share: float) -> str:
    return f"{100 * share:g}"


def curve(run: Path, args: argparse.Namespace) -> dict[int, Estimate]:
    """Held-out pass@1 at each scored checkpoint (iter_0: the warm start): rollouts of the same size each,
    so the same number of trained samples at the same iteration in every run."""
    out = {}
    for n in range(0, args.rollouts + 1, args.eval_every):
        if (run / "eval" / f"iter_{n}" / "summary.json").exists():
            out[n] = pass_at_1(read_results(run / "eval" / f"iter_{n}"), seed=args.seed)
    return out


def parser() -> argparse.ArgumentParser:
    p = BenchParser(prog="learning_bench.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--seed", type=int, default=0, help="tasks, teacher, warm start, runs and eval (default 0)")
    p.add_argument("--harness", choices=HARNESSES, default="builtin",
                   help="the agent of every attempt, the teacher's included (default builtin; "
                        "mini_swe_agent_text: the real mini-swe-agent CLI, docs/learning.md)")
    p.add_argument("--split", choices=("heldout", "train"), default="heldout",
                   help="what to score on (default heldout; train scores fresh train-split tasks)")
    p.add_argument("--work", type=Path, default=ROOT / ".cache" / "learn", help="where everything goes")
    p.add_argument("--train-tasks", type=int, default=300)
    p.add_argument("--eval-tasks", type=int, help="held-out tasks scored (default 80; mini_swe_agent_text 40)")
    p.add_argument("--eval-n", type=int, help="attempts per eval task (default 2; mini_swe_agent_text 8)")
    p.add_argument("--teacher-accuracy", type=float, default=0.5)
    p.add_argument("--sft-epochs", type=int, default=4)
    p.add_argument("--sft-lr", type=float, default=2e-3)
    p.add_argument("--sft-step-tokens", type=int, default=8192, help="tokens per warm-start step")
    p.add_argument("--rollouts", type=int, help="GRPO's rollouts (default 16; mini_swe_agent_text 24)")
    p.add_argument("--groups", type=int, default=8, help="prompt groups per rollout")
    p.add_argument("--attempts", type=int, default=8, help="attempts per group")
    p.add_argument("--step-attempts", type=int, default=16, help="attempts per optimizer step")
    p.add_argument("--lr", type=float,
                   help="GRPO's learning rate (default 5e-5, mini_swe_agent_text 1.6667e-5: at larger rates the "
                        "control drifts, docs/learning.md)")
    p.add_argument("--kl-coef", type=float, default=0.0,
                   help="train.kl_coef: a KL penalty to the warm start in GRPO and the control (default 0, none)")
    p.add_argument("--eval-every", type=int,
                   help="score every n-th checkpoint (default 4; mini_swe_agent_text 24, the last only)")
    p.add_argument("--hidden-size", type=int, default=128, help="the model's width")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--moe", type=int, default=0, metavar="EXPERTS",
                   help="a mixture of experts (Qwen3-MoE, EXPERTS per layer, 2 a token), trained with routing "
                        "replay (train.routing_replay; default 0: the dense model)")
    p.add_argument("--no-replay", action="store_true", help="with --moe: train without routing replay")
    p.add_argument("--serve-dtype", choices=("float32", "bfloat16"), default="float32",
                   help="inference.dtype of the runs' servers: bfloat16 is a real sampler/trainer mismatch")
    p.add_argument("--tools-dir", type=Path, help="where the agent's tools are installed (default: the pool's)")
    p.add_argument("--no-control", action="store_true",
                   help="skip the control run (e.g. to compare GRPO with --max-staleness alone)")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="also run GRPO with train.max_staleness N (rollouts ahead of training), scored as GRPO is")
    p.add_argument("--json", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    # `kill` stops the bench as ^C does: the running command, and what it started, go too (agentrl's finally)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    p = parser()
    args = p.parse_args(argv)
    if args.max_staleness < 0:
        p.error(f"--max-staleness must be 0 or more, got {args.max_staleness}")
    if args.kl_coef < 0:
        p.error(f"--kl-coef must be 0 or more, got {args.kl_coef}")
    if args.moe and args.moe < 3:
        p.error(f"--moe must be 3 experts or more (2 a token), got {args.moe}")
    if args.no_replay and not args.moe:
        p.error("--no-replay goes with --moe: a dense model has no routes to replay")
    if args.rollouts % args.eval_every:
        p.error(f"--rollouts {args.rollouts} must be a multiple of --eval-every {args.eval_every}")
    # Its own directory for each model and serving: a stage whose output is there is not redone.
    work = args.work.resolve() / (f"seed{args.seed}-{args.split}" + ("" if args.harness == "builtin"
                                                                      else f"-{args.harness}")
                                  + (f"-moe{args.moe}" + ("-noreplay" if args.no_replay else "") if args.moe else "")
                                  + ("" if args.serve_dtype == "float32" else f"-serve-{args.serve_dtype}"))
    work.mkdir(parents=True, exist_ok=True)
    out = summary(args, work, stages(args, work))
    if args.json:
        def plain(k: str, v):
            if k in ("estimates", "differences"):
                return {n: vars(e) for n, e in v.items()}
            if k == "curves":
                return {name: {n: vars(e) for n, e in points.items()} for name, points in v.items()}
            return v
        print(json.dumps({k: plain(k, v) for k, v in out.items()}))
        return 0
    print(f"\nheld-out ({args.split}) pass@1, %, with 95% intervals resampled by task:")
    for name, e in out["estimates"].items():
        print(f"  {name:22s} {e}   {e.attempts} attempts, {e.tasks} tasks")
    for name, e in out["differences"].items():
        print(f"  {name:22s} {e}   (paired by task)")
    print("curves: held-out pass@1 by checkpoint (rollouts trained)")
    for name, points in out["curves"].items():
        print(f"  {name:22s} " + "   ".join(f"iter_{n}: {e}" for n, e in points.items()))
    print(f"GRPO: {out['grpo_training_s'] / 60:.1f} min of rollouts, training, checkpoints and publishing "
          f"({args.rollouts} rollouts of {args.groups} x {args.attempts} attempts)")
    print("stages (s, this invocation): " + ", ".join(f"{k} {v:.0f}" for k, v in out["stage_s"].items()))
    print("the GRPO run's sample path, by rollout (agentrl/report/fidelity.py):\n"
          "  rollout  samples/attempt  forks/attempt  samples/clean attempt  trained = sampled (checked)  "
          "adapter ms/turn  twice/reward/mask off")
    for r in out["fidelity"]:
        share = "-" if r["match_share"] is None else f"{100 * r['match_share']:.1f}%"
        clean = "-" if r["samples_per_clean_attempt"] is None else f"{r['samples_per_clean_attempt']:.2f}"
        ms = "-" if r["adapter_ms_per_turn"] is None else f"{r['adapter_ms_per_turn']:.2f}"
        print(f"  {r['rollout']:7d}  {r['samples'] / r['attempts']:15.2f}  {r['forks_per_attempt']:13.2f}  "
              f"{clean:>21s}  {share:>9s} ({r['checked_tokens']:6d})      {ms:>6s}  "
              f"{r['twice_trained']}/{r['reward_mismatches']}/{r['mask_mismatches']}")
    for target, met in out["targets"].items():
        print(f"  target {target}: {'met' if met else 'NOT met'}")
    print(f"report: {work / 'runs' / 'grpo' / 'report.md'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
