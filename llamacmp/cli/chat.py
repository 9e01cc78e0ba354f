"""llamacmp-cli: llama.cpp b8462's `llama-cli` (tools/cli/cli.cpp): a chat REPL over the GGUF's jinja template.

-p is the first user turn, -sys a system message, -st ends after one reply. Slash commands: /exit /regen /clear
/read FILE /image FILE (with -mm). Reasoning streams apart ("[Start thinking]" ... "[End thinking]", dim on a terminal),
and each reply ends with the `[ Prompt: x t/s | Generation: y t/s ]` line.
"""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .. import BUILD_NUMBER, __version__
from ..args import parse_or_exit
from ..chat import (THINK_END, ReasoningSplitter, TemplateError, reply_start, select_template,
                    thinking_switch)
from ..engine.client import ContextFull
from ..engine.tasks import GenParams
from ..params import Params
from .chat_io import make_io
from .common import CliError, load, make_grammar, new_client, run_tool

COMMANDS_HELP = ("available commands:\n"
                 "  /exit or Ctrl+C     stop or exit\n"
                 "  /regen              regenerate the last response\n"
                 "  /clear              clear the chat history\n"
                 "  /read               add a text file\n")


@dataclass
class Interrupt:
    """First Ctrl-C stops the reply in progress; a second one before it is handled exits (as llama-cli)."""
    flag: bool = False

    def handler(self, signum, frame) -> None:
        if self.flag:
            sys.stdout.write("\n")
            sys.stdout.flush()
            raise SystemExit(130)
        self.flag = True

    def take(self) -> bool:
        was, self.flag = self.flag, False
        return was


@dataclass
class Reply:
    content: str = ""
    reasoning: str = ""
    in_thinking: bool = False


@dataclass
class Chat:
    p: Params
    messages: list[dict] = field(default_factory=list)
    pending_text: str = ""               # /read files waiting for the next user message
    images: list = field(default_factory=list)   # encoded images, in the order of their markers in the chat

    def __post_init__(self) -> None:
        self.loaded = load(self.p)
        self.lm = self.loaded.lm
        self.vision = None
        if self.p.mmproj_path:
            from ..vision.config import MmprojError
            from ..vision.projector import VisionProjector
            try:
                self.vision = VisionProjector(self.p.mmproj_path, self.lm, min_tokens=self.p.image_min_tokens,
                                              max_tokens=self.p.image_max_tokens)
            except MmprojError as e:
                raise CliError(f"error: failed to load multimodal projector: {e}") from None
        self.tok = self.lm.tokenizer
        self.client = new_client(self.loaded)      # the conversation: a slot of the scheduler
        try:
            self.template = select_template(self.lm.metadata, self.tok.tokens, self.p.chat_template, self.p.use_jinja)
        except TemplateError as e:
            raise CliError(f"error: {e}") from None
        self.thinking_supported = self.template.supports_thinking
        self.io = make_io(self.p.simple_io, self.p.multiline_input)
        self.interrupt = Interrupt()
        self.add_system_prompt()

    def add_system_prompt(self) -> None:
        if self.p.system_prompt:
            self.messages.append({"role": "system", "content": self.p.system_prompt})

    # -- the REPL ----------------------------------------------------------------------------------------------

    def banner(self) -> None:
        name = Path(self.lm.path).name         # llama-cli shows the file name
        modalities = "text, vision" if self.vision else "text"
        self.io.write(f"\nbuild      : b{BUILD_NUMBER}-llamacmp-{__version__}\nmodel      : {name}\n"
                      f"modalities : {modalities}\n", "info")
        if self.p.system_prompt:
            self.io.write("using custom system prompt\n", "info")
        extra = "  /image <file>       add an image file\n" if self.vision else ""
        self.io.write("\n" + COMMANDS_HELP + extra + "\n", "info")

    def run(self) -> int:
        self.banner()
        previous = signal.signal(signal.SIGINT, self.interrupt.handler)
        try:
            self.loop()
        except KeyboardInterrupt:
            pass                               # Ctrl-C at the prompt: leave, as llama-cli does
        finally:
            signal.signal(signal.SIGINT, previous)
        self.io.write("\nExiting...\n")
        return 0

    def next_input(self) -> str | None:
        if self.p.prompt:
            for fname in self.p.image:            # --image goes with the -p turn, as llama-cli does
                if not self.load_image(fname):    # not an answer without it: the command line asked for it
                    raise CliError(f"error: cannot use --image '{fname}' (see above)")
            text, self.p.prompt = self.p.prompt, ""
            shown = text[:500] + " ... (truncated)" if len(text) > 500 else text
            shown = shown.encode("utf-8", "surrogateescape").decode("utf-8", "replace")   # a -p "\xHH" raw byte
            self.io.write(f"\n> {shown}\n", "prompt")
            return text
        # prompt_toolkit reads keys itself; our SIGINT handler must not eat its Ctrl-C
        signal.signal(signal.SIGINT, signal.default_int_handler)
        try:
            return self.io.read_message()
        finally:
            signal.signal(signal.SIGINT, self.interrupt.handler)

    def loop(self) -> None:
        while True:
            text = self.next_input()
            self.io.write("\n")
            if text is None:
                return
            text = text.rstrip("\n")
            if not text:
                continue
            action = self.command(text)
            if action == "exit":
                return
            if action == "skip":
                continue
            if action == "message":
                self.messages.append({"role": "user", "content": self.pending_text + text})
                self.pending_text = ""
            self.respond()
            if self.p.single_turn:
                return

    def command(self, text: str) -> str:
        """'exit', 'skip' (handled, nothing to generate), 'regen', or 'message'."""
        if text.startswith("/exit"):
            return "exit"
        if text.startswith("/regen"):
            if len(self.messages) >= 2 and self.messages[-1]["role"] == "assistant":
                self.messages.pop()
                return "regen"
            self.io.error("No message to regenerate.\n")
            return "skip"
        if text.startswith("/clear"):
            self.messages.clear()
            self.add_system_prompt()
            self.pending_text = ""
            self.images.clear()
            self.io.write("Chat history cleared.\n")
            return "skip"
        if text.startswith("/image ") and self.vision:
            self.load_image(text[7:].strip())
            return "skip"
        if text.startswith(("/image ", "/audio ")):
            self.io.error("error: image input needs a multimodal projector (-mm FILE); audio is not supported\n")
            return "skip"
        if text.startswith("/read "):
            return self.read_file(text[6:].strip())
        return "message"

    def load_image(self, fname: str) -> bool:
        """Encode an image file and put its marker into the next user message (llama-cli's /image)."""
        from ..vision.preprocess import ImageError
        from ..vision.prompt import MEDIA_MARKER
        try:
            data = Path(fname).read_bytes()
        except OSError:
            self.io.error(f"file does not exist or cannot be opened: '{fname}'\n")
            return False
        if self.vision is None:
            self.io.error("error: image input needs a multimodal projector (-mm FILE)\n")
            return False
        try:
            self.images.append(self.vision.encode_bytes(data))
        except ImageError as e:
            self.io.error(f"failed to load image '{fname}': {e}\n")
            return False
        self.pending_text += MEDIA_MARKER
        self.io.write(f"Loaded media from '{fname}'\n")
        return True

    def read_file(self, fname: str) -> str:
        try:
            content = Path(fname).read_text(encoding="utf-8", errors="replace")
        except OSError:
            self.io.error(f"file does not exist or cannot be opened: '{fname}'\n")
            return "skip"
        # llama-cli marks a file with the FIM separator token when the vocabulary has one (Qwen does)
        if "<|file_sep|>" in self.tok.tokens:
            self.pending_text += f"<|file_sep|>{fname}\n{content}"
        else:
            self.pending_text += f"--- File: {fname} ---\n{content}"
        self.io.write(f"Loaded text from '{fname}'\n")
        return "skip"

    # -- one reply ---------------------------------------------------------------------------------------------

    def enable_thinking(self) -> bool:
        last_user = next((m["content"] for m in reversed(self.messages) if m["role"] == "user"), "")
        switch = thinking_switch(last_user)
        wanted = self.p.enable_thinking if switch is None else switch
        return wanted and self.thinking_supported

    def respond(self) -> None:
        thinking = self.enable_thinking()
        extra = {k: v for k, v in self.p.chat_template_kwargs.items() if k != "enable_thinking"}
        prompt = self.template.render(self.messages, True, enable_thinking=thinking, extra=extra)
        if self.p.verbose_prompt:
            self.io.write(prompt + "\n\n", "info")
        before = self.client.perf.snapshot()
        images, hints = {}, ()
        if self.images:
            from ..vision.prompt import prompt_images, split_prompt
            chunks = split_prompt(prompt, self.images, lambda s: self.tok.encode(s, parse_special=True))
            ids, images = prompt_images(chunks)
        else:
            ids = self.tok.encode(prompt, parse_special=True)
            if not ids:
                raise CliError("error: input is empty (the chat template rendered nothing)")
            # a checkpoint where this reply starts: the next turn re-renders it without its reasoning
            start = reply_start(self.template, lambda s: self.tok.encode(s, parse_special=True), self.messages,
                                len(ids), enable_thinking=thinking, extra=extra)
            hints = (start,) if start else ()
        self.client.history = ids        # the slot resumes from what it holds of these
        try:
            reply = self.stream_reply(prompt.rstrip().endswith("<think>"), hints, images)
        except ContextFull as e:
            self.io.error(f"Error: {e}\n")
            return
        self.messages.append({"role": "assistant", "content": reply.content})
        self.io.write("\n")
        if self.p.show_timings:
            t = self.client.perf.since(before)
            self.io.write(f"\n[ Prompt: {t.prompt_per_second:.1f} t/s | Generation: "
                          f"{t.predicted_per_second:.1f} t/s ]\n", "info")

    def stream_reply(self, thinking_open: bool, hints: tuple[int, ...] = (), images: dict | None = None) -> Reply:
        """One reply, streamed. --reasoning-budget (when the prompt opens <think>): after that many tokens of
        thought the message and </think> are forced in as if sampled (engine/turn.py, as the server does).
        hints, images: the prompt's checkpoint hints and images (engine/client.py)."""
        p, reply = self.p, Reply()
        # a built-in format (no jinja) has no reasoning: the reply is content as written, as in llama-cli
        splitter = ReasoningSplitter(thinking_open, "none" if self.template.builtin else p.reasoning_format)
        grammar = make_grammar(p, self.client, after_think=thinking_open)  # the answer, not the thoughts
        budget = p.reasoning_budget if splitter.in_reasoning else -1       # thinking open and shown apart
        end = tuple(self.tok.encode(p.reasoning_budget_message + THINK_END, parse_special=True))
        # a fresh chain over the prompt each reply (the engine feeds it the prompt's tokens, not image rows)
        params = GenParams(p.sampling, p.n_predict, stop=list(p.antiprompt), special=p.special, grammar=grammar,
                           stop_window=0, forced_spend_n_predict=False, reasoning_budget=budget,
                           reasoning_end=end)
        self.client.generate(params, on_text=lambda piece: self.show(reply, splitter.push(piece)),
                             should_stop=lambda: self.interrupt.flag, checkpoint_hints=hints, images=images)
        self.interrupt.take()
        self.show(reply, splitter.flush())
        return reply

    def show(self, reply: Reply, pieces) -> None:
        for kind, text in pieces:
            if kind == "content":
                if reply.in_thinking:
                    self.io.write("\n[End thinking]\n\n", "reasoning")
                    reply.in_thinking = False
                reply.content += text
                self.io.write(text)
            else:
                if not reply.in_thinking and not reply.reasoning:
                    # llama-cli 0c1e570 writes the blank line itself (tools/cli/cli-ui.h); b8462 printed the
                    # reasoning's leading "\n" there, which the parser now strips (chat.split_reasoning)
                    self.io.write("[Start thinking]\n\n", "reasoning")
                reply.in_thinking = True
                reply.reasoning += text
                self.io.write(text, "reasoning")


def main(argv: list[str] | None = None) -> int:
    p = parse_or_exit("cli", argv)
    if p.conversation is False:
        # llama-cli b8462's words, on stdout as it writes them; it then carries on in chat mode, which its own
        # message says it does not support, and llama.cpp 0c1e570 refuses -no-cnv in llama-cli: so do we
        sys.stdout.write("--no-conversation is not supported by llama-cli\nplease use llama-completion instead\n")
        return 1
    return run_tool(lambda: Chat(p).run())


if __name__ == "__main__":
    sys.exit(main())
