"""llamacmp: a llama.cpp-compatible engine for Qwen3.5/3.6 hybrid models on old and cheap NVIDIA GPUs."""
__version__ = "0.1.0"
BUILD_NUMBER = 8462          # the llama.cpp build whose interface we follow


def _quiet_interrupt() -> None:
    """In a console script (llamacmp-cli, ...), Ctrl-C while its modules are still importing exits 130 without a
    traceback; args.parse_or_exit, the first thing every tool's main() does, puts Python's own handler back."""
    import os
    import signal
    import sys
    if os.path.basename(sys.argv[0] if sys.argv else "").startswith("llamacmp-"):
        def leave(signum, frame):
            os.write(2, b"\n")
            os._exit(130)
        try:
            signal.signal(signal.SIGINT, leave)
        except ValueError:               # not the main thread
            pass


_quiet_interrupt()
