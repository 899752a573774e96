"""How the local stack knows a piece it started is ready: an HTTP answer, or a Ray node its head lists alive."""

import urllib.error
import urllib.request

from rlops.cloud import ray_jobs


def answers(url: str, accept_status: tuple[int, ...] = ()) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return response.status == 200
    except urllib.error.HTTPError as error:
        return error.code in accept_status
    except OSError:
        return False


def node_alive(dashboard: str, node_name: str) -> bool:
    """Whether the head lists the node alive; not yet while its state API does not answer, or answers 5xx: with
    the head starting beside other work on two cores, `/api/v0/nodes` answered 500 for a while (wait_until gives up
    in the end, with the node's log)."""
    try:
        alive = ray_jobs.alive_nodes(dashboard)
    except urllib.error.HTTPError as error:
        if error.code < 500:
            raise
        return False
    except OSError:
        return False
    return any(node["labels"].get("rlops-node") == node_name for node in alive)
