"""The watcher's decisions, from what Ray reports. Pure.

A failed attempt is resubmitted only when its nodes went away under it (a Spot preemption, a lost
node): Ray says the job's supervisor died with its node, or a non-head node died while the job ran
(NeMo RL's driver on the head then exits non-zero because its GPU actors are gone). A failure of
the training code itself is final.
"""

TERMINAL = ("SUCCEEDED", "FAILED", "STOPPED")
NODE_DEATH_SLACK_MS = 60_000  # the driver notices a lost actor a little after the node is gone


def failure_kind(job: dict, nodes: list[dict]) -> str:
    """'node-lost', 'code' or 'stopped' for a terminal, unsuccessful job."""
    if job["status"] == "STOPPED":
        return "stopped"
    if job.get("error_type") == "JOB_SUPERVISOR_ACTOR_DIED":
        return "node-lost"
    started = job.get("start_time") or 0
    ended = (job.get("end_time") or 0) + NODE_DEATH_SLACK_MS
    for node in nodes:
        if node["state"] != "DEAD" or node.get("is_head_node"):
            continue
        died = node.get("end_time_ms") or 0
        if node["node_id"] == job.get("driver_node_id") or started <= died <= ended:
            return "node-lost"
    return "code"


def resubmittable(record: dict, kind: str, resume_budget: int) -> bool:
    return kind == "node-lost" and len(record["attempts"]) <= resume_budget
