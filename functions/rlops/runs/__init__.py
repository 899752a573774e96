"""Training runs: the train message, the Ray job it becomes, run records, and the watcher's policy."""
