"""End-to-end: adaptive ``nereus run`` against the best static plan chosen at start.

Both runs use the same config, seed, length drift and node events; the static one keeps the
initial TP/PP of every model-stage and only re-fits DP when the plan no longer fits (what verl or
OpenRLHF would run). Prints generated tokens per second of each (transitions included), their
ratio, the share of time spent in transitions and the per-step rewards side by side.

    python benchmarks/end_to_end.py [CONFIG] [--ranks N] [--steps S] [--json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _run(config: Path, policy: str, tmp: Path, ranks: int | None, steps: int | None
         ) -> dict[str, Any]:
    import yaml

    raw = yaml.safe_load(config.read_text())
    raw.setdefault("runtime", {})["policy"] = policy
    cfg = tmp / f"{policy}.yaml"
    cfg.write_text(yaml.safe_dump(raw))
    argv = [sys.executable, "-m", "nereus", "run", str(cfg), "--log", str(tmp / f"{policy}.h5"),
            "--json"]
    if ranks is not None:
        argv += ["--ranks", str(ranks)]
    if steps is not None:
        argv += ["--steps", str(steps)]
    res = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, check=False)
    if res.returncode != 0:
        sys.exit(f"{policy} run failed: {res.stderr.strip().splitlines()[-1:]}")
    out: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    p.add_argument("config", nargs="?", default=str(ROOT / "examples" / "ppo-tiny-cpu.yaml"))
    p.add_argument("--ranks", type=int)
    p.add_argument("--steps", type=int)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="nereus-e2e-") as tmp:
        static = _run(Path(args.config), "static", Path(tmp), args.ranks, args.steps)
        adaptive = _run(Path(args.config), "adaptive", Path(tmp), args.ranks, args.steps)
    result = {
        "adaptive_tokens_per_s": adaptive["tokens_per_s"],
        "static_tokens_per_s": static["tokens_per_s"],
        "ratio": adaptive["tokens_per_s"] / static["tokens_per_s"],
        "transition_share_pct": adaptive["transition_share_pct"],
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(f"adaptive {result['adaptive_tokens_per_s']:.1f} tok/s ({adaptive['transitions']} "
          f"transitions, {result['transition_share_pct']:.1f}% of its time) vs static "
          f"{result['static_tokens_per_s']:.1f} tok/s ({static['transitions']} transitions): "
          f"ratio {result['ratio']:.3f}")
    print("step  reward(adaptive)  reward(static)  plan(adaptive) | plan(static)")
    for i, (ra, rs) in enumerate(zip(adaptive["rewards"], static["rewards"], strict=True)):
        print(f"{i + 1:>4}  {ra:16.3f}  {rs:14.3f}  {adaptive['plans'][i]} | {static['plans'][i]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
