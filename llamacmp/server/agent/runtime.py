"""--tools-runtime: the isolate every tool call runs in when its request names none (server-tools.cpp's
server_tools_runtime). "<engine>-container:<id>" and "ssh:<target>" name one that exists (checked once, at start);
"<engine>:<image>" spawns a container that this server owns: `<engine> run --rm -i <image> sh`, kept alive by its
open stdin, started again if it dies, and gone when the server stops (stdin closed, --rm removes it)."""
from __future__ import annotations

import logging
import os
import subprocess
import tempfile
import threading
import time

from .toolio import make_io, parse_container_spec

log = logging.getLogger("llamacmp.server")


def check_spec(spec: str) -> str:
    """Parse-time check of --tools-runtime (ValueError names the problem)."""
    container = parse_container_spec(spec)
    if container is not None and not container[2]:
        if not container[1]:
            raise ValueError(f"--tools-runtime {container[0]}:<image> requires an image name")
        return spec
    try:
        make_io({"runtime": spec})
    except RuntimeError as e:
        raise ValueError(str(e)) from None
    return spec


class StaticRuntime:
    def __init__(self, spec: str):
        self._spec = spec

    def spec(self) -> str:
        return self._spec

    def close(self) -> None:
        pass


class ContainerRuntime:
    def __init__(self, engine: str, image: str):
        self.engine, self.image = engine, image
        self.proc: subprocess.Popen | None = None
        self.container_id = ""
        self._lock = threading.Lock()
        self._spawn()

    def spec(self) -> str:
        with self._lock:
            if self.proc is None or self.proc.poll() is not None:
                log.warning("%s tools runtime container \"%s\" died, respawning", self.engine, self.container_id)
                self._spawn()
            return f"{self.engine}-container:{self.container_id}"

    def _spawn(self) -> None:
        fd, cidfile = tempfile.mkstemp(prefix="llamacmp-tools-runtime-cid-", suffix=".tmp")
        os.close(fd)
        os.unlink(cidfile)                # the engine refuses to overwrite an existing --cidfile
        try:
            self.proc = subprocess.Popen([self.engine, "run", "--rm", "-i", "--cidfile", cidfile, self.image, "sh"],
                                         stdin=subprocess.PIPE, stdout=subprocess.DEVNULL)
        except OSError as e:
            raise RuntimeError(f"failed to spawn {self.engine} container for tools runtime (image: {self.image}): "
                               f"{e}") from None
        cid = ""
        for _ in range(100):              # 10 s, as llama-server
            try:
                cid = open(cidfile).readline().strip()
            except OSError:
                pass
            if cid or self.proc.poll() is not None:
                break
            time.sleep(0.1)
        try:
            os.unlink(cidfile)
        except OSError:
            pass
        if not cid:
            self.proc.kill()
            raise RuntimeError(f"timed out waiting for {self.engine} container to start (image: {self.image})")
        self.container_id = cid

    def close(self) -> None:
        # closing stdin ends the container's shell (its pid 1); --rm then removes the container
        if self.proc is not None:
            try:
                self.proc.stdin.close()
                self.proc.wait(timeout=30)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()


def make_runtime(spec: str):
    """None without --tools-runtime; RuntimeError when a container cannot be started."""
    if not spec:
        return None
    container = parse_container_spec(spec)
    if container is not None and not container[2]:
        return ContainerRuntime(container[0], container[1])
    return StaticRuntime(check_spec(spec))
