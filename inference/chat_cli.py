"""``generate.py --chat``: talk to a chat-tuned run, interactively or one reply at a time.

Each line typed is a user turn (``/help`` lists the commands, which are not sent); the reply streams
to stdout, one per line, while the ``you>`` prompt, notices and, with ``--tools``, each call and its
result go to stderr, between replies, never inside one. A line that is not UTF-8 is refused. Ctrl-C
during a reply stops it, keeping the conversation and the reply so far. Quitting is deliberate:
Ctrl-D, ``/exit``, or a second Ctrl-C in a row at the prompt; a first one there only says how to
leave (it often comes a moment too late for a short reply), and drops a half-typed line as a shell
does. With ``--prompt`` (or ``--prompt-file``) one reply is printed and the command exits."""

import argparse
import sys

import contextlib

from common.errors import UserError
from inference.chat import ChatSession
from inference.settings import DEFAULT_MAX_CALLS, GenerationSettings
from inference.terminal import decode_argument, decode_utf8, write_stdout
from inference.tool_use import ToolStep
from rundir.loading import LoadedRun
from tools import ToolError, Toolbox, load_tools

COMMANDS = {
    "/help": "list these commands",
    "/reset": "start the conversation afresh (the system prompt stays)",
    "/exit": "leave (so do /quit, Ctrl-D, two Ctrl-C in a row at the prompt, and the end of the input)",
}


QUIT_HINT = "(to leave: Ctrl-C again, Ctrl-D or /exit)"



class LineReader:
    """Lines from stdin, one turn each; ``read`` returns None at end of input (Ctrl-D). At a terminal
    they go through ``input`` (``readline`` editing and history); otherwise the prompt goes to
    stderr, so stdout holds only replies, and lines are read as bytes and checked to be UTF-8."""

    def __init__(self, prompt: str) -> None:
        self.prompt = prompt
        self.interactive = sys.stdin.isatty()
        self.terminal = self.interactive and sys.stdout.isatty()
        if self.terminal:
            try:
                import readline  # noqa: F401  (importing it is what makes input() edit lines)
            except ImportError:  # Windows, or a Python built without it: input() still works
                pass

    def half_typed(self) -> bool:
        """Whether a line was being typed at the terminal (read after ``read`` was interrupted)."""
        if not self.terminal:
            return False
        try:
            import readline
        except ImportError:
            return False
        return bool(readline.get_line_buffer())

    def read(self) -> str | None:
        """The next line without its line ending; a UserError for a line that is not UTF-8 (the
        line is consumed, so the next ``read`` goes on after it)."""
        if self.terminal:
            try:
                text = input(self.prompt)
            except EOFError:
                return None
            except UnicodeDecodeError:
                raise UserError("that line is not valid UTF-8; type it again") from None
            # Under a C locale Python reads undecodable bytes as surrogate escapes: refuse those too.
            return decode_argument(text, "that line")
        if self.interactive:
            print(self.prompt, end="", file=sys.stderr, flush=True)
        data = sys.stdin.buffer.readline()
        if not data:
            return None
        return decode_utf8(data.removesuffix(b"\n").removesuffix(b"\r"), "that line")

def chat_main(args: argparse.Namespace, run: LoadedRun, settings: GenerationSettings, prompt: str | None) -> int:
    """Chat with ``run`` as the parsed ``generate.py`` flags say; ``prompt`` None means interactive."""
    with contextlib.ExitStack() as stack:
        toolbox = stack.enter_context(_toolbox(args.tools)) if args.tools else None
        session = ChatSession(
            run, settings, system_prompt=args.system, use_cache=not args.no_cache,
            on_notice=lambda message: _tell(f"notice: {message}"), toolbox=toolbox, max_calls=args.max_tool_calls,
        )
        return _converse(args, run, session, prompt)


def _toolbox(specs: list[str]) -> Toolbox:
    try:
        return Toolbox(load_tools(specs))
    except ToolError as error:
        raise UserError(f"--tools: {error}") from None


def _converse(args: argparse.Namespace, run: LoadedRun, session: ChatSession, prompt: str | None) -> int:
    if prompt is not None:
        if _reply(session, prompt) == "interrupted":
            raise KeyboardInterrupt  # one reply was all there was to do: exit as interrupted
        return 0
    if not args.quiet:
        _tell(f"chatting with {run.directory} (type a message; /help lists the commands)")
    reader = LineReader("you> ")
    interrupted = False  # the last thing at the prompt was a Ctrl-C: another one now quits
    while True:
        try:
            text = reader.read()
        except UserError as error:  # a line that is not UTF-8: nothing was sent, carry on
            _tell(f"error: {error}")
            interrupted = False
            continue
        except KeyboardInterrupt:
            if reader.half_typed():  # Ctrl-C over a half-typed line drops the line, as a shell does
                _tell("")
                interrupted = False
                continue
            if not interrupted:
                _tell(f"\n{QUIT_HINT}")
                interrupted = True
                continue
            text = None
        interrupted = False
        if text is None:
            if reader.interactive:
                _tell("")  # Ctrl-D or Ctrl-C: put the shell prompt back on a line of its own
            break
        command = text.strip()
        if command in ("/exit", "/quit"):
            break
        if command == "/reset":
            session.reset()
            _tell("(conversation cleared)")
        elif command == "/help":
            _tell("\n".join(f"  {name:<7} {what}" for name, what in COMMANDS.items()))
        elif command.startswith("/") and command[1:].isalnum():  # a mistyped command is not a message
            _tell(f"error: there is no command {command}; /help lists the commands")
        elif command:
            try:
                _reply(session, text)
            except UserError as error:  # a message too long for the window: say so and carry on
                _tell(f"error: {error}")
    return 0


def check_chat_flags(settings: GenerationSettings, args: argparse.Namespace) -> None:
    if settings.num_samples != 1 or args.json or settings.stop:
        raise UserError("--chat gives one reply at a time: drop --num-samples, --json and --stop")
    if args.tools is None and args.max_tool_calls != DEFAULT_MAX_CALLS:
        raise UserError("--max-tool-calls needs --tools")
    if args.max_tool_calls < 0:
        raise UserError(f"--max-tool-calls must be 0 or more, got {args.max_tool_calls}")


def _reply(session: ChatSession, text: str) -> str:
    """Stream one reply, its calls shown as they run; its finish reason."""
    line = _Line()

    def on_text(piece: str) -> None:
        line.open, line.shown = not piece.endswith("\n"), line.shown + piece
        write_stdout(piece)

    def on_step(step: ToolStep) -> None:
        # On a line of its own, between the pieces of the reply on stdout.
        _tell(f"{chr(10) if line.open else ''}[{step.call.name} {step.call.arguments} -> {step.result.text}]")
        line.open, line.shown = False, ""

    reply = session.reply(text, on_text=on_text, on_step=on_step)
    if reply.finish_reason == "malformed call":
        write_stdout(reply.text[len(line.shown):])  # the call as written, which was held back
    write_stdout("\n")
    if reply.finish_reason == "interrupted":
        _tell("notice: reply stopped (Ctrl-C); the conversation goes on")
    elif reply.finish_reason == "malformed call":
        _tell(f"notice: the model wrote a call that could not be run ({reply.error}); it is shown as written")
    elif reply.finish_reason != "end":
        _tell("notice: the reply was cut off before the model ended its turn (--max-new-tokens or the window)")
    return reply.finish_reason


class _Line:
    open = False  # stdout's last line has text and no newline yet
    shown = ""  # the reply's text printed since its last call


def _tell(message: str) -> None:
    print(message, file=sys.stderr, flush=True)
