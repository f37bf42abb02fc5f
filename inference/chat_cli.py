"""``generate.py --chat``: talk to a chat-tuned run, interactively or one reply at a time.

Interactive: each line typed is a user turn; the reply streams to stdout. ``/reset`` starts the
conversation afresh (the system prompt stays), ``/exit`` (or end of input) leaves. The ``you>``
prompt and notices go to stderr, so stdout holds only the replies, one per line. With
``--prompt`` (or ``--prompt-file``) one reply is printed and the command exits.
"""

from __future__ import annotations

import argparse
import sys

from common.device import select_device
from common.errors import UserError
from inference.chat import ChatSession
from inference.runs import find_latest_run, load_run
from inference.settings import GenerationSettings

HELP = "type a message; /reset starts over, /exit leaves"


def chat_main(args: argparse.Namespace, settings: GenerationSettings, prompt: str | None) -> int:
    """Run a chat from parsed ``generate.py`` flags; ``prompt`` None means interactive."""
    if settings.num_samples != 1 or args.json or settings.stop:
        raise UserError("--chat gives one reply at a time: drop --num-samples, --json and --stop")
    device = select_device(args.device, setting="--device")
    run = load_run(args.run if args.run is not None else find_latest_run(), device)
    session = ChatSession(
        run, settings, system_prompt=args.system, use_cache=not args.no_cache,
        on_notice=lambda message: print(f"notice: {message}", file=sys.stderr, flush=True),
    )
    if prompt is not None:
        _reply(session, prompt)
        return 0
    interactive = sys.stdin.isatty()
    if not args.quiet:
        print(f"chatting with {run.directory} ({HELP})", file=sys.stderr, flush=True)
    while True:
        if interactive:
            print("you> ", end="", file=sys.stderr, flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        text = line.rstrip("\n")
        command = text.strip()
        if command == "/exit":
            break
        if command == "/reset":
            session.reset()
            print("(conversation cleared)", file=sys.stderr, flush=True)
            continue
        if not command:
            continue
        try:
            _reply(session, text)
        except UserError as error:  # a message too long for the window: say so and carry on
            print(f"error: {error}", file=sys.stderr, flush=True)
    return 0


def _reply(session: ChatSession, text: str) -> None:
    reply = session.reply(text, on_text=write_stdout)
    write_stdout("\n")
    if reply.finish_reason != "end":
        print(
            "notice: the reply was cut off before the model ended its turn (--max-new-tokens or the window)",
            file=sys.stderr, flush=True,
        )


def write_stdout(text: str) -> None:
    """Write ``text`` to stdout at once (streamed text must not wait in a buffer)."""
    sys.stdout.write(text)
    sys.stdout.flush()
