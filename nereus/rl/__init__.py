"""RL algorithms (PPO, GRPO, ReMax), the embedded task and the global sample order."""
