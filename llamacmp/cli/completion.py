"""llamacmp-completion: llama.cpp's `llama-completion` (the old `main`): raw completion, -i/-if interactive and
-cnv conversation modes, reverse prompts, in-prefix/suffix, and the perf block on stderr at the end.

Output layout follows tools/completion/completion.cpp: prompt and generated text on stdout (pieces printed
without special tokens unless -sp), " [end of text]" on EOG, "\\n\\n" at the end, logs and timings on stderr.
"""
from __future__ import annotations

import signal
import sys
from dataclasses import dataclass, field

from ..args import parse_or_exit, process_escapes
from ..chat import ChatTemplate, TemplateError, select_template
from ..engine.client import ContextFull
from ..engine.perf import now_ms
from ..engine.tasks import GenParams
from ..params import Params
from .common import CliError, load, make_grammar, make_sampler, new_client, perf_lines, run_tool
from .lineinput import read_message_simple


@dataclass
class Interrupt:
    """Ctrl-C while generating in interactive mode hands control back; a second one, or any outside
    interactive mode, ends the program (status 130) as llama-completion's handler does."""
    interactive: bool = False
    pending: bool = False

    def handler(self, signum, frame) -> None:
        if self.pending or not self.interactive:
            raise KeyboardInterrupt
        self.pending = True

    def take(self) -> bool:
        was, self.pending = self.pending, False
        return was


@dataclass
class Conversation:
    """Messages so far and the template; formats each new message as the text it adds to the prompt."""
    template: ChatTemplate
    enable_thinking: bool
    messages: list[dict] = field(default_factory=list)

    def add(self, role: str, content: str, add_generation_prompt: bool) -> str:
        msg = {"role": role, "content": content}
        before = self._render(self.messages, False) if self.messages else ""
        after = self._render(self.messages + [msg], add_generation_prompt)
        self.messages.append(msg)
        return after[len(before):] if after.startswith(before) else after

    def _render(self, messages: list[dict], add_generation_prompt: bool) -> str:
        try:
            return self.template.render(messages, add_generation_prompt, enable_thinking=self.enable_thinking)
        except TemplateError:
            # templates such as Qwen3.5's refuse a history with no user turn yet; the diff then starts empty
            if add_generation_prompt or any(m["role"] == "user" for m in messages):
                raise
            return ""


def pick_template(p: Params, lm):
    """--jinja renders the GGUF's template (or --chat-template); without it (llama-completion's default) the
    built-in format named or recognised there, which for a `<|im_start|>` template is plain chatml."""
    try:
        return select_template(lm.metadata, lm.tokenizer.tokens, p.chat_template, p.use_jinja)
    except TemplateError as e:
        raise CliError(f"error: {e}") from None


class Completion:
    def __init__(self, p: Params):
        self.p = p
        self.loaded = load(p)
        self.lm = self.loaded.lm
        self.tok = self.lm.tokenizer
        self.client = new_client(self.loaded)           # the one sequence: a slot of the scheduler
        self.sampler = make_sampler(p, self.lm)           # one chain for the whole session, as llama-completion's
        self.grammar = make_grammar(p, self.client)
        self.out = sys.stdout
        self.interrupt = Interrupt()
        self.conv: Conversation | None = None
        self.n_remain = p.n_predict
        # llama.cpp's non-simple console echoes input itself; a terminal already shows what was typed
        self.echo_input = not p.simple_io and not sys.stdin.isatty()

    # -- set-up ------------------------------------------------------------------------------------------------

    def decide_mode(self) -> None:
        p = self.p
        has_template = bool(p.chat_template or self.lm.metadata.get("tokenizer.chat_template"))
        if p.conversation is None:
            p.conversation = has_template
            if has_template:
                self.log("main: chat template is available, enabling conversation mode (disable it with -no-cnv)")
        if p.conversation:
            if not (p.input_prefix or p.input_suffix):
                self.conv = Conversation(pick_template(p, self.lm), p.enable_thinking)
            if p.single_turn and p.prompt:
                p.interactive = p.interactive_first = False
            else:
                p.interactive_first = True
        if p.interactive_first:
            p.interactive = True

    def first_prompt(self) -> str:
        p = self.p
        if self.conv is None:
            return p.prompt
        text = ""
        if p.system_prompt:
            text += self.conv.add("system", p.system_prompt, False)
        if p.prompt:
            text += self.conv.add("user", p.prompt, True)
        return text

    def log(self, line: str) -> None:
        if not self.p.log_disable and self.p.verbosity >= 3:
            sys.stderr.write(line + "\n")

    def show(self, text: str) -> None:
        self.out.write(text)
        self.out.flush()

    def show_tokens(self, ids: list[int]) -> None:
        """Raw piece bytes, as llama-completion prints them: a character split across tokens arrives in parts
        and the terminal joins it; bytes that never form valid UTF-8 pass through unchanged (llama.cpp buffers
        nothing). It prints each piece with LOG("%s", piece.c_str()), so a piece ends at its first NUL byte."""
        self.out.flush()
        self.out.buffer.write(b"".join(self.tok.token_to_piece(t, self.p.special).split(b"\0", 1)[0] for t in ids))
        self.out.buffer.flush()

    # -- the loop ------------------------------------------------------------------------------------------------

    def run(self) -> int:
        self.decide_mode()
        prompt = self.first_prompt()
        ids = self.tok.encode(prompt, parse_special=True, add_special=True)
        if not ids and not self.p.interactive_first:
            raise CliError("input is empty")
        if len(ids) > self.client.n_ctx - 4:
            raise CliError(f"main: prompt is too long ({len(ids)} tokens, max {self.client.n_ctx - 4})")
        self.log(f"sampler seed: {self.sampler.seed}")
        self.log(f"generate: n_ctx = {self.client.n_ctx}, n_batch = {self.p.n_batch}, "
                 f"n_predict = {self.p.n_predict}, n_keep = {self.p.n_keep}")
        if self.p.interactive:
            self.log("== Running in interactive mode. ==\n - Press Ctrl+C to interject at any time.\n"
                     " - Press Return to return control to the AI.\n - To return control without starting a new line,"
                     " end your input with '/'.\n - If you want to submit another line, end your input with '\\'.")
        self.interrupt.interactive = self.p.interactive
        previous = signal.signal(signal.SIGINT, self.interrupt.handler)
        try:
            self.loop(ids)
        except KeyboardInterrupt:
            # llama-completion's SIGINT exit: a newline, the perf block, status 130
            self.show("\n")
            sys.stderr.write(perf_lines(self.client.perf, self.sampler, now_ms()))
            return 130
        finally:
            signal.signal(signal.SIGINT, previous)
        self.show("\n\n")
        sys.stderr.write(perf_lines(self.client.perf, self.sampler, now_ms()))
        return 0

    def loop(self, ids: list[int]) -> None:
        p = self.p
        # -if (and conversation mode without -p) waits for the user before sampling anything
        interact_first = p.interactive_first and not (self.conv is not None and p.prompt)
        if not ids and not interact_first:       # e.g. a chat template that renders nothing: llama.cpp's error
            raise CliError("error: input is empty")
        if p.n_predict == 0 and not p.interactive:
            return                           # llama-completion's main loop never starts: no echo, no prompt eval
        if ids:
            if p.display_prompt:
                self.show_tokens(ids)
            self.feed(ids)
        stop = ""
        while True:
            if not interact_first:
                stop = self.generate()
                if not p.interactive:
                    if stop == "eog":
                        self.show(" [end of text]\n")
                    return
                if stop == "context":
                    return
            interact_first = False
            if not self.interact(stop):
                return

    def feed(self, ids: list[int]) -> None:
        for t in ids:
            self.sampler.accept(t)           # llama.cpp's penalty window sees the prompt too
        self.client.feed(ids)

    def generate(self) -> str:
        p = self.p
        # n_remain as llama-completion keeps it: generated and typed tokens both spend it; in interactive mode
        # it refills to -n when spent (and the user gets the turn)
        budget = max(self.n_remain, 0) if p.n_predict >= 0 else -1
        params = GenParams(n_predict=budget, stop=list(p.antiprompt), special=p.special, grammar=self.grammar,
                           stop_window=0 if p.interactive else 2, forced_spend_n_predict=False, sampler=self.sampler)
        gen = self.client.generate(params, on_token=lambda t: self.show_tokens([t]),
                                   should_stop=lambda: p.interactive and self.interrupt.take())
        if self.conv is not None:
            self.conv.messages.append({"role": "assistant", "content": self.tok.decode(
                [t for t in gen.tokens if t not in self.tok.eog_ids], special=False)})
        self.n_remain -= len(gen.tokens)
        if p.interactive and self.n_remain <= 0 and p.n_predict >= 0:
            self.n_remain = p.n_predict
        if gen.stop == "eog" and p.interactive:
            self.client.history.append(gen.tokens[-1])   # llama.cpp decodes the EOG before the next input
        if gen.stop == "context":
            sys.stderr.write("\n\nmain: context full and context shift is disabled => stopping\n")
        return gen.stop

    def interact(self, stop: str) -> bool:
        """Read the user's next input and feed it; False when the session ends (EOF)."""
        p = self.p
        if stop == "eog" and p.antiprompt and self.conv is None:
            first = self.tok.encode(p.antiprompt[0], parse_special=True)
            self.show(p.antiprompt[0])
            self.client.history.extend(first)
        if stop == "eog":
            self.show("\n")
        if self.conv is not None:
            self.show("\n> ")
        elif p.input_prefix:
            self.show(p.input_prefix)
        text = read_message_simple(sys.stdin, p.multiline_input)
        if text is None:
            self.show("EOF by user\n")
            return False
        if self.echo_input:
            self.show(text + "\n")            # llama.cpp's console echoes what it reads, even from a pipe
        if not text:
            return True                      # an empty line hands control back to the model
        if p.input_suffix and self.conv is None:
            self.show(p.input_suffix)
        if p.escape:
            text = process_escapes(text)
        self.feed_user(text)
        self.sampler.reset()
        if p.single_turn:
            p.interactive = False            # -st without -p: answer this first input, then finish
        return True

    def feed_user(self, text: str) -> None:
        p = self.p
        if self.conv is not None:
            ids = user_ids = self.tok.encode(self.conv.add("user", text, True), parse_special=True)
        else:
            user_ids = self.tok.encode(text)
            ids = (self.tok.encode(p.input_prefix, parse_special=True) + user_ids
                   + self.tok.encode(p.input_suffix, parse_special=True))
        self.n_remain -= len(user_ids)
        try:
            self.feed(ids)
        except ContextFull as e:
            raise CliError(f"main: {e}") from None


def main(argv: list[str] | None = None) -> int:
    p = parse_or_exit("completion", argv)
    return run_tool(lambda: Completion(p).run())


if __name__ == "__main__":
    sys.exit(main())
