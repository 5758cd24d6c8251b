"""``python -m agentops_client``: stream a run in a terminal, list sessions and approvals, decide one.

    export AGENTOPS_URL=http://127.0.0.1:8000 AGENTOPS_API_KEY=aok_...
    python -m agentops_client run order-assistant "where is order O202411280001?"   # start it and stream it
    python -m agentops_client stream <run-id> [--after SEQ]                       # follow (or replay) a run
    python -m agentops_client sessions | approvals
    python -m agentops_client approve|reject <approval-id> [--note TEXT]

The model's text is printed as it streams; each committed step on its own line (``seq type``) on stderr.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TextIO

from agentops_client.client import Client, RunStream
from agentops_client.errors import AgentOpsError


def _show(stream: RunStream, out: TextIO, log: TextIO) -> int:
    """The model's text as it streams on ``out``; one line per committed event on ``log``; the output at the end."""
    print(f"run {stream.run_id}", file=log)
    streamed = ""
    with stream:
        for event in stream:
            if event.is_delta:
                out.write(event.text)
                out.flush()
                streamed += event.text
                continue
            payload = event.data.get("payload") or {}
            if event.type == "run.finished":
                output = str(payload.get("output") or "")
                if not streamed:
                    out.write(output)  # no deltas (e.g. the built-in demo planner does not stream)
                out.write("\n")
                out.flush()
                print(f"  [{event.seq}] run.finished {payload.get('terminal_reason', '')}", file=log)
                return 0
            if streamed and not streamed.endswith("\n"):
                out.write("\n")
                streamed = ""
            detail = " ".join(str(payload[k]) for k in ("tool", "status", "to") if isinstance(payload.get(k), str))
            print(f"  [{event.seq}] {event.type} {detail}".rstrip(), file=log)
    return 0  # ended without run.finished after `after`: the run had already finished


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m agentops_client", description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--url", default=os.environ.get("AGENTOPS_URL", "http://127.0.0.1:8000"))
    parser.add_argument("--key", default=os.environ.get("AGENTOPS_API_KEY"), help="API key (default: $AGENTOPS_API_KEY)")
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("run", help="start a run and stream it")
    run.add_argument("agent")
    run.add_argument("input")
    stream = commands.add_parser("stream", help="stream an existing run")
    stream.add_argument("run_id")
    stream.add_argument("--after", type=int, default=0)
    commands.add_parser("sessions", help="list sessions (newest first)")
    commands.add_parser("approvals", help="list pending approval requests")
    for verb in ("approve", "reject"):
        decide = commands.add_parser(verb, help=f"{verb} an approval request")
        decide.add_argument("approval_id")
        decide.add_argument("--note", default="")
    args = parser.parse_args(argv)
    if not args.key:
        parser.error("an API key is needed: --key or AGENTOPS_API_KEY")
    try:
        with Client(args.url, args.key) as client:
            if args.command == "run":
                return _show(client.create_and_stream(args.agent, args.input), sys.stdout, sys.stderr)
            if args.command == "stream":
                return _show(client.stream_run(args.run_id, after=args.after), sys.stdout, sys.stderr)
            if args.command == "sessions":
                for session in client.list_sessions().items:
                    print(f"{session.id}  {session.agent}  turns={session.turn_count}  updated {session.updated_at}")
            elif args.command == "approvals":
                for approval in client.list_approvals().items:
                    print(f"{approval.id}  {approval.tool_name}  run {approval.run}  {approval.preview}")
            else:
                decided = (client.approve if args.command == "approve" else client.reject)(args.approval_id, note=args.note)
                print(f"{decided.id} {decided.status}")
    except AgentOpsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
