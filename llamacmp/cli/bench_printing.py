"""llamacmp-bench's output formats: llama-bench's markdown table, JSON, JSON lines and CSV, one row per result."""
from __future__ import annotations

import json
from typing import TextIO

from .. import BUILD_NUMBER
from .bench_options import DEFAULTS, SPEC_KEYS
from .bench_rows import Result, build_commit


def _size_text(n: int) -> str:
    return f"{n / 1024**3:.2f} GiB" if n >= 1024**3 else f"{n / 1024**2:.2f} MiB"


def _params_text(n: int) -> str:
    return f"{n / 1e9:.2f} B" if n >= 1e9 else f"{n / 1e6:.2f} M" if n >= 1e6 else f"{n / 1e3:.2f} K"


# column -> (header, width; negative = left-aligned). Optional columns appear only when a value differs from
# llama-bench's default, as llama-bench does.
MD_COLUMNS = {"model": ("model", -30), "size": ("size", 10), "params": ("params", 10), "backend": ("backend", -10),
              "n_gpu_layers": ("ngl", 3), "n_batch": ("n_batch", 7), "n_ubatch": ("n_ubatch", 8),
              "type_k": ("type_k", 6), "type_v": ("type_v", 6), "flash_attn": ("fa", 4), "spec": ("spec", -30),
              "test": ("test", 15), "t/s": ("t/s", 20)}
OPTIONAL = ("n_batch", "n_ubatch", "type_k", "type_v", "flash_attn")


class MarkdownPrinter:
    def __init__(self, out: TextIO, s: dict):
        self.out = out
        self.cols = ["model", "size", "params", "backend", "n_gpu_layers"]
        self.cols += [c for c in OPTIONAL if any(v != DEFAULTS[c][0] for v in s[c])]
        self.cols += ["spec"] if spec_given(s) else []
        self.cols += ["test", "t/s"]

    def _row(self, cells: list[str]) -> str:
        parts = []
        for c, text in zip(self.cols, cells):
            w = MD_COLUMNS[c][1]
            parts.append(text.ljust(-w) if w < 0 else text.rjust(w))
        return "| " + " | ".join(parts) + " |"

    def header(self) -> None:
        print(self._row([MD_COLUMNS[c][0] for c in self.cols]), file=self.out)
        seps = []
        for c in self.cols:
            w = MD_COLUMNS[c][1]
            seps.append("-" * abs(w) if w < 0 else "-" * (w - 1) + ":")
        print("| " + " | ".join(seps) + " |", file=self.out)

    def row(self, r: Result) -> None:
        f = r.fields()
        cell = {"model": r.info.desc, "size": _size_text(r.info.size), "params": _params_text(r.info.n_params),
                "backend": r.backend, "n_gpu_layers": str(r.inst.n_gpu_layers), "n_batch": str(r.inst.n_batch),
                "n_ubatch": str(r.inst.n_ubatch), "type_k": r.inst.type_k, "type_v": r.inst.type_v,
                "flash_attn": r.inst.flash_attn, "spec": r.spec_cell(), "test": r.inst.name,
                "t/s": f"{f['avg_ts']:.2f} ± {f['stddev_ts']:.2f}"}
        print(self._row([cell[c] for c in self.cols]), file=self.out)
        self.out.flush()

    def footer(self) -> None:
        print(f"\nbuild: {build_commit()} ({BUILD_NUMBER})", file=self.out)


def spec_given(s: dict) -> bool:
    return any(k in s.get("given", ()) for k in SPEC_KEYS)


def row_fields(r: Result, s: dict) -> dict:
    """llama-bench's fields, and llamacmp's spec fields when --spec-* was given."""
    return {**r.fields(), **(r.spec_fields() if spec_given(s) else {})}


class JsonPrinter:
    def __init__(self, out: TextIO, s: dict, lines: bool = False):
        self.out, self.lines, self.n, self.s = out, lines, 0, s

    def header(self) -> None:
        if not self.lines:
            print("[", file=self.out)

    def row(self, r: Result) -> None:
        if self.lines:
            print(json.dumps(row_fields(r, self.s)), file=self.out)
        else:
            text = json.dumps(row_fields(r, self.s), indent=2, ensure_ascii=False)
            # objects are separated as "},\n  {": the comma goes after the previous one, which ended unterminated
            self.out.write((",\n" if self.n else "") + "\n".join("  " + ln for ln in text.split("\n")))
        self.n += 1
        self.out.flush()

    def footer(self) -> None:
        if not self.lines:
            print(("\n" if self.n else "") + "]", file=self.out)


class CsvPrinter:
    SKIP = ("samples_ns", "samples_ts", "llamacmp_probe")

    def __init__(self, out: TextIO, s: dict):
        self.out, self.started, self.s = out, False, s

    def header(self) -> None:
        pass                     # the header needs the field names, printed with the first row

    @staticmethod
    def _quote(v) -> str:
        text = f"{v:.6f}" if isinstance(v, float) else str(v)
        return '"' + text.replace('"', '""') + '"'

    def row(self, r: Result) -> None:
        f = {k: v for k, v in row_fields(r, self.s).items() if k not in self.SKIP}
        if not self.started:
            print(",".join(f), file=self.out)
            self.started = True
        print(",".join(self._quote(v) for v in f.values()), file=self.out)
        self.out.flush()

    def footer(self) -> None:
        pass


def make_printer(fmt: str, out: TextIO, s: dict):
    if fmt == "md":
        return MarkdownPrinter(out, s)
    if fmt in ("json", "jsonl"):
        return JsonPrinter(out, s, lines=fmt == "jsonl")
    return CsvPrinter(out, s)
