"""Cloud Function entry points (deployed from `functions/`, sharing the `rlops` package with the CLI).

None yet: `train`, `watch`, `snapshot` and `reap` arrive with the training-run, checkpoint and
reaper work. Each handler will import only the rlops modules it needs, so a cold start stays small.
"""
