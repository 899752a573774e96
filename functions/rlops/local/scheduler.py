"""The local stand-in for Cloud Scheduler: a tick to each scheduled function every few seconds, until stopped."""

import argparse
import json
import time

from rlops.local.stack import post_cloud_event


def main() -> None:
    parser = argparse.ArgumentParser(prog="rlops.local.scheduler")
    parser.add_argument("ports", type=int, nargs="+", help="the functions' ports")
    parser.add_argument("--environment", required=True)
    parser.add_argument("--every", type=float, required=True)
    args = parser.parse_args()
    tick = json.dumps({"environment": args.environment}).encode()
    while True:
        time.sleep(args.every)
        for port in args.ports:
            try:
                post_cloud_event(port, "rlops-ticks", tick)
            except OSError as error:  # the function answered 500 or is restarting: the next tick tries again
                print(f"tick to port {port} failed: {error}", flush=True)


if __name__ == "__main__":
    main()
