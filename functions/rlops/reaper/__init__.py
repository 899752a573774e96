"""The idle-GPU reaper: when an environment's GPU pool is idle long enough, scale it to zero; wake it for a run."""
