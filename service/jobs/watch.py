"""Warnings a person running a job wants to hear about, computed from the per-step metrics."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Warning_:
    reason: str
    message: str
    pause: bool = False


@dataclass
class Watch:
    zero_std_threshold: float = 0.9
    zero_std_patience: int = 5
    verifier_error_threshold: float = 0.5
    infra_fail_threshold: float = 0.1
    _zero_std_run: int = 0
    _last_eval: tuple[int, float] | None = None
    _rewards: list[tuple[int, float]] = field(default_factory=list)
    _warned: set[str] = field(default_factory=set)

    def observe(self, step: int, m: dict[str, Any]) -> list[Warning_]:
        out: list[Warning_] = []
        if "reward/mean" in m:
            self._rewards.append((step, m["reward/mean"]))
        # 1. no learning signal: almost every group scored the same for several steps
        if m.get("zero_std_group_frac", 0.0) >= self.zero_std_threshold:
            self._zero_std_run += 1
            if self._zero_std_run == self.zero_std_patience:
                out.append(Warning_("zero_variance_groups", f"{m['zero_std_group_frac']:.0%} of groups had identical "
                                    f"rewards for {self.zero_std_patience} steps: no learning signal (task too hard "
                                    "or too easy, or a broken verifier)"))
        else:
            self._zero_std_run = 0
        # 2. verifier infrastructure failing: pause rather than train on garbage. The rate is the step's
        #    one health record (every scoring call, retries and resampled rounds included): the number
        #    the dashboard and Prometheus show is the number the job is paused on.
        for k, v in m.items():
            if k.startswith("verifier/") and k.endswith("/error_rate") and v > self.verifier_error_threshold:
                name = k.split("/")[1]
                out.append(Warning_("verifier_errors", f"verifier {name!r} errored on {v:.0%} of its calls "
                                    f"(threshold {self.verifier_error_threshold:.0%}); pausing the job", pause=True))
        # 3. completions left out of the update because their verdict was an infrastructure failure
        frac = m.get("reward/infra_fail_frac", 0.0)
        if frac > self.infra_fail_threshold and "infra_failures" not in self._warned:
            self._warned.add("infra_failures")
            out.append(Warning_("infra_failures", f"{frac:.0%} of completions had an infrastructure failure in "
                                f"every verifier attempt at step {step} and were left out of the update "
                                f"(threshold {self.infra_fail_threshold:.0%}); see the rollouts' `excluded` flag"))
        # 3b. an episode's environment (the sandbox, an HTTP environment server) failing: those episodes were
        #     left out; a server that keeps failing is worth a look
        bad = m.get("episodes/outcome/infra_error", 0.0)
        if bad > 0 and "environment_errors" not in self._warned:
            self._warned.add("environment_errors")
            out.append(Warning_("environment_errors", f"{bad:.0%} of episode calls failed in the environment at step "
                                f"{step} (timeouts, crashes, malformed replies: see the rollouts' turns); those "
                                "episodes were left out of the update"))
        # 4. reward up while held-out accuracy down: the classic sign of reward hacking
        if "eval/accuracy" in m:
            acc = m["eval/accuracy"]
            if self._last_eval is not None:
                prev_step, prev_acc = self._last_eval
                before = [r for s, r in self._rewards if s <= prev_step][-5:]
                recent = [r for s, r in self._rewards if s > prev_step][-5:]
                if before and recent:
                    dr = sum(recent) / len(recent) - sum(before) / len(before)
                    if dr > 0.05 and acc < prev_acc - 0.05:
                        out.append(Warning_("reward_up_eval_down", f"train reward rose by {dr:.3f} while held-out "
                                            f"accuracy fell {prev_acc:.3f} → {acc:.3f} (reward hacking?)"))
            self._last_eval = (step, acc)
        return out
