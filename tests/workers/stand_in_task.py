"""A stand-in for a task of a TensorFlow cluster, as ``tfsyncmodes.launch`` sees one
(tests/test_launch.py). It listens at its TF_CONFIG address, says so, and behaves as
tfsyncmodes' tasks do (strategies/parameter_server.py): a server leaves once the chief has come
and gone; the chief stops with status 1 a second after a parameter server it reached stops
answering (a real chief's step has to fail first).

    stand_in_task.py CHIEF_SECONDS CHIEF_STATUS WORKER1_DIES_AFTER PS_DIES_AFTER

worker:1 exits with status 7 and every ps with 9 after that many seconds (-1: never).
"""
import json
import os
import socket
import sys
import threading
import time


def reachable(address):
    host, port = address.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=1).close()
        return True
    except OSError:
        return False


def watch(addresses, seconds):
    """The first of `addresses` that answered and then stopped answering within `seconds`."""
    seen, end = set(), time.monotonic() + seconds
    while time.monotonic() < end:
        for address in addresses:
            if reachable(address):
                seen.add(address)
            elif address in seen:
                return address
        time.sleep(0.1)
    return None


def main(chief_seconds, chief_status, worker_dies_after, ps_dies_after):
    config = json.loads(os.environ["TF_CONFIG"])
    cluster, role, index = config["cluster"], config["task"]["type"], config["task"]["index"]
    host, port = cluster[role][index].rsplit(":", 1)
    server = socket.create_server((host, int(port)))

    def accept():
        while True:
            server.accept()[0].close()

    threading.Thread(target=accept, daemon=True).start()
    print("task", role, index, json.dumps(cluster, sort_keys=True), flush=True)
    if role == "chief":
        if watch(cluster.get("ps", []), chief_seconds):
            time.sleep(1)
            sys.exit(1)
        sys.exit(chief_status)
    if role == "worker" and index == 1 and worker_dies_after >= 0:
        time.sleep(worker_dies_after)
        sys.exit(7)
    if role == "ps" and ps_dies_after >= 0:
        time.sleep(ps_dies_after)
        sys.exit(9)
    watch(cluster["chief"], 600)


if __name__ == "__main__":
    main(float(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]))
