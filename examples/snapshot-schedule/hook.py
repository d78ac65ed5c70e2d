#!/usr/bin/env python3
"""SnapshotSchedule: the hooks of the MapController example.

For every PersistentVolumeClaim a SnapshotSchedule selects, metabus calls
/map with that one claim and the PVCSnapshots the schedule already made of
it. The answer is the complete set of snapshots wanted for the claim:

  * one per spec.interval, named after the interval it belongs to, so that
    asking twice in one interval names the same snapshot (hooks may be
    called any number of times; the answer must only depend on what they
    are shown);
  * the earlier ones, until they are older than spec.retention (leaving one
    out of the answer deletes it).

When a claim is gone (deleted, or no longer selected), metabus calls
/tombstone with its snapshots instead, on every resync of the schedule
(resyncPeriodSeconds): the answer lists the ones to keep. This hook keeps
them until they are older than spec.retention, so a deleted volume can
still be restored for a while, and then lets them go.

Standard library only: python3 hook.py [--host HOST] [--port PORT].
"""

import argparse
import calendar
import json
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

SNAPSHOT_API_VERSION = "ctl.example.com/v1"
SNAPSHOT_KIND = "PVCSnapshot"
# How a request's outputs name the snapshots: Kind.apiVersion.
SNAPSHOT_TYPE = SNAPSHOT_KIND + "." + SNAPSHOT_API_VERSION

DEFAULT_INTERVAL = 24 * 3600
DEFAULT_RETENTION = 7 * 24 * 3600

_DURATION = re.compile(r"^\s*(\d+)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


def parse_duration(value, default):
    """Seconds in "90s", "15m", "6h" or "7d" (or a plain number of seconds).

    Anything else is the default: a typo in a schedule must not delete its
    snapshots (a retention of 0 would).
    """
    if isinstance(value, bool):
        return default
    if isinstance(value, (int, float)):
        return int(value) if value > 0 else default
    if isinstance(value, str):
        m = _DURATION.match(value)
        if m and int(m.group(1)) > 0:
            return int(m.group(1)) * _UNITS[m.group(2)]
    return default


def created_at(obj, now):
    """When an object was created (now for one without a timestamp yet)."""
    stamp = obj.get("metadata", {}).get("creationTimestamp")
    if not stamp:
        return now
    try:
        return calendar.timegm(time.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ"))
    except ValueError:
        return now


def schedule_of(req):
    spec = req.get("parent", {}).get("spec") or {}
    interval = parse_duration(spec.get("interval"), DEFAULT_INTERVAL)
    retention = parse_duration(spec.get("retention"), DEFAULT_RETENTION)
    return interval, retention


def observed_snapshots(req):
    return (req.get("outputs") or {}).get(SNAPSHOT_TYPE) or {}


def snapshot(name, claim, schedule):
    """A PVCSnapshot as the hook wants it: only the fields it cares about."""
    return {
        "apiVersion": SNAPSHOT_API_VERSION,
        "kind": SNAPSHOT_KIND,
        "metadata": {
            "name": name,
            "labels": {"ctl.example.com/snapshot-schedule": schedule},
        },
        "spec": {"source": {"persistentVolumeClaimName": claim}},
    }


def map_hook(req, now):
    """The snapshots wanted for one claim (see the module docstring)."""
    interval, retention = schedule_of(req)
    claim = req["input"]["metadata"]["name"]
    schedule = req["parent"]["metadata"]["name"]
    wanted = {}
    # When to be called again: the next interval, or the next expiry.
    due = []
    for name, snap in observed_snapshots(req).items():
        expires = created_at(snap, now) + retention
        if expires > now:
            source = (snap.get("spec") or {}).get("source") or {}
            wanted[name] = snapshot(name, source.get("persistentVolumeClaimName", claim), schedule)
            due.append(expires - now)
    start = now - now % interval
    current = "%s-%s" % (claim, time.strftime("%Y%m%d-%H%M%S", time.gmtime(start)))
    wanted.setdefault(current, snapshot(current, claim, schedule))
    due.append(start + interval - now)
    return {
        "outputs": [wanted[n] for n in sorted(wanted)],
        "resyncAfterSeconds": max(1, int(min(due))),
    }


def tombstone_hook(req, now):
    """The snapshots of a gone claim to keep: those within the retention."""
    _, retention = schedule_of(req)
    keep = []
    for name, snap in sorted(observed_snapshots(req).items()):
        if created_at(snap, now) + retention > now:
            # Only the identity of a kept output counts.
            keep.append({"apiVersion": SNAPSHOT_API_VERSION, "kind": SNAPSHOT_KIND,
                         "metadata": {"name": name}})
    return {"outputs": keep}


HOOKS = {"/map": map_hook, "/tombstone": tombstone_hook}


class Handler(BaseHTTPRequestHandler):
    def do_POST(self):
        hook = HOOKS.get(self.path)
        if hook is None:
            self.answer(404, {"error": "no hook at " + self.path})
            return
        try:
            length = int(self.headers.get("Content-Length", "0"))
            req = json.loads(self.rfile.read(length))
            resp = hook(req, int(time.time()))
        except (ValueError, KeyError, TypeError, AttributeError) as err:
            self.answer(400, {"error": "bad request: %r" % (err,)})
            return
        self.answer(200, resp)

    def answer(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, fmt, *args):
        sys.stderr.write("%s %s\n" % (self.address_string(), fmt % args))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port")
    args = parser.parse_args()
    server = ThreadingHTTPServer((args.host, args.port), Handler)
    host, port = server.server_address[:2]
    # The first line of output says where it listens (tests start it on
    # port 0 and read it).
    print("listening on http://%s:%d" % (host, port), flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
