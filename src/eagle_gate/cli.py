"""``eagle-gate`` command line: read the gate's status from outside a server."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from eagle_gate.runtime import default_status_dir
from eagle_gate.status import read_status


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="eagle-gate")
    sub = parser.add_subparsers(dest="command", required=True)
    status = sub.add_parser(
        "status", help="print the gate status of every scheduler process as JSON"
    )
    where = status.add_mutually_exclusive_group(required=True)
    where.add_argument("--pid", type=int, help="the SGLang server's (launcher's) pid")
    where.add_argument("--status-dir", help="the status directory the server uses")
    sub.add_parser("policies", help="list the installed policies and their settings")
    args = parser.parse_args(argv)

    if args.command == "policies":
        from eagle_gate.plugins import available_policies
        from eagle_gate.settings import describe_setting

        for name, factory in sorted(available_policies().items()):
            print(f"{name}: {factory.description}")
            for key, setting in factory.settings.items():
                print(f"    {describe_setting(key, setting)}")
        return 0

    directory = args.status_dir or default_status_dir(args.pid)
    records = read_status(directory)
    print(json.dumps({"status_dir": str(directory), "schedulers": records}, indent=1))
    if not records:
        print(f"eagle-gate: no scheduler status in {directory}", file=sys.stderr)
        return 1
    return 0 if all(r["alive"] for r in records) else 1


if __name__ == "__main__":
    sys.exit(main())
