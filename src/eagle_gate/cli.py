"""``eagle-gate`` command line: read the gate's status from outside a server,
and change its policy at runtime.

``eagle-gate status --url http://HOST:PORT`` reads ``GET /eagle_gate/status``
from the server; ``--pid`` / ``--status-dir`` read the scheduler status files
directly (same machine; only a private directory of this user is read, and
only the records of its current launch). The exit status is 0 when every
scheduler is alive and its record fresh, all ranks agree on policy, settings
and configuration version, and the gate is not degraded; 1 otherwise.

``eagle-gate set-policy --url URL [--policy NAME] [--set KEY=VALUE ...]`` posts
a runtime change (``POST /eagle_gate/policy``). ``--api-key`` (or the
environment variable ``EAGLE_GATE_API_KEY``) is sent as a bearer token.

``eagle-gate doctor [--json] [--gate-* flags] [-- SGLANG ARGS]`` checks this
installation and a launch configuration without starting anything
(:mod:`eagle_gate.doctor`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Sequence

from eagle_gate.status import aggregate, read_status

STATUS_PATH = "/eagle_gate/status"
POLICY_PATH = "/eagle_gate/policy"


def _request(url: str, api_key: str | None, body: dict | None = None):
    headers = {"Accept": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    data = None
    if body is not None:
        data = json.dumps(body).encode()
        headers["Content-Type"] = "application/json"
    req = urllib.request.Request(url, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read().decode() or "null")
    except urllib.error.HTTPError as exc:
        text = exc.read().decode(errors="replace")
        try:
            return exc.code, json.loads(text)
        except ValueError:
            return exc.code, {"error": text}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["doctor"]:
        # doctor takes the launcher's --gate-* flags and an SGLang command line
        # after "--": it parses its own arguments.
        from eagle_gate.doctor import main as doctor_main

        return doctor_main(argv[1:])
    parser = argparse.ArgumentParser(prog="eagle-gate")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser(
        "status", help="print the gate status of every scheduler process as JSON"
    )
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--pid", type=int, help="the SGLang server's (launcher's) pid")
    where.add_argument("--status-dir", help="the status directory the server uses")
    where.add_argument(
        "--url", help="the server's base URL (reads GET /eagle_gate/status)"
    )
    status.add_argument(
        "--api-key", help="bearer token for --url (env EAGLE_GATE_API_KEY)"
    )
    change = sub.add_parser(
        "set-policy", help="change the policy or its settings on a running server"
    )
    change.add_argument("--url", required=True, help="the server's base URL")
    change.add_argument("--policy", help="the new policy (default: keep)")
    change.add_argument(
        "--set",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        help="a setting, repeatable (values are parsed as JSON if they can be)",
    )
    change.add_argument(
        "--shadow",
        choices=("on", "off"),
        help="shadow mode on (the policy only watches) or off (default: keep)",
    )
    change.add_argument("--api-key", help="bearer token (env EAGLE_GATE_API_KEY)")
    sub.add_parser("policies", help="list the installed policies and their settings")
    sub.add_parser(
        "doctor",
        help="check SGLang, patch targets, plugins, settings, the status directory "
        "and an SGLang command line (after --) as the launcher would",
    )
    args = parser.parse_args(argv)

    if args.command == "policies":
        from eagle_gate.plugins import available_policies
        from eagle_gate.settings import describe_setting

        for name, factory in sorted(available_policies().items()):
            print(f"{name}: {factory.description}")
            for key, setting in factory.settings.items():
                print(f"    {describe_setting(key, setting)}")
        return 0

    api_key = getattr(args, "api_key", None) or os.environ.get("EAGLE_GATE_API_KEY")
    if args.command == "set-policy":
        settings = {}
        for item in args.set:
            key, sep, value = item.partition("=")
            if not sep or not key.strip():
                parser.error(f"--set {item!r} is not KEY=VALUE")
            try:
                settings[key.strip()] = json.loads(value)
            except ValueError:
                settings[key.strip()] = value
        body: dict = {"settings": settings}
        if args.policy:
            body["policy"] = args.policy
        if args.shadow:
            body["shadow"] = args.shadow == "on"
        code, reply = _request(args.url.rstrip("/") + POLICY_PATH, api_key, body)
        print(json.dumps(reply, indent=1))
        return 0 if code == 202 else 1

    if args.url:
        try:
            code, view = _request(args.url.rstrip("/") + STATUS_PATH, api_key)
        except (urllib.error.URLError, OSError) as exc:
            print(f"eagle-gate: cannot read {args.url}: {exc}", file=sys.stderr)
            return 1
        print(json.dumps(view, indent=1))
        if code != 200:
            print(f"eagle-gate: HTTP {code} from {args.url}", file=sys.stderr)
            return 1
        return 0 if view.get("ok") else 1
    return _status_from_directory(args.status_dir, args.pid)


def _status_from_directory(path: str | None, pid: int | None) -> int:
    """``status --status-dir`` / ``--pid``: read the files of the directory's
    current launch (``launch.json``), as strictly as the server does."""
    from eagle_gate.control import read_request
    from eagle_gate.statusdir import StatusDir, find_status_dir, read_launch_file

    if path is None:
        found = find_status_dir(int(pid or 0))
        if found is None:
            print(
                f"eagle-gate: no status directory of server pid {pid} of yours in "
                f"{tempfile.gettempdir()} (a server started with --gate-status-dir "
                "DIR: use --status-dir DIR)",
                file=sys.stderr,
            )
            return 1
        path = str(found)
    directory = StatusDir(path)
    try:
        launch = read_launch_file(directory)
        launch_id = launch["launch_id"] if launch else None
        records = read_status(directory, launch_id)
        view = aggregate(path, records, read_request(directory, launch_id))
    except (OSError, ValueError) as exc:
        print(f"eagle-gate: cannot read {path}: {exc}", file=sys.stderr)
        return 1
    finally:
        directory.close()
    view["launch"] = launch
    print(json.dumps(view, indent=1))
    if not records:
        print(f"eagle-gate: no scheduler status in {path}", file=sys.stderr)
        return 1
    return 0 if view["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
