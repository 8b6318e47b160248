"""``python -m specstudy.backends.llamacpp.serve``: llama.cpp's HTTP server as a child process.

The prebuilt ``xllamacpp`` wheel runs llama.cpp's ``llama-server`` inside a Python process.  The
kit starts it through this entry point so that :class:`~specstudy.backends.lifecycle.ManagedServer`
treats it like any other server: its own process (own RSS, own log), a loopback port, llama.cpp's
``/health``, and a process-group SIGTERM to stop it.  Flags mirror ``llama-server``'s meaning
(:func:`specstudy.backends.llamacpp.llamacpp_spec.launch_args` renders both); the ``ready`` line on stdout names
the build so the log says what ran.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

# llama.cpp's --spec-type names -> xllamacpp's common_speculative_type members
SPEC_TYPE_ENUM = {
    "draft-simple": "COMMON_SPECULATIVE_TYPE_DRAFT_SIMPLE",
    "draft-eagle3": "COMMON_SPECULATIVE_TYPE_DRAFT_EAGLE3",
    "draft-mtp": "COMMON_SPECULATIVE_TYPE_DRAFT_MTP",
    "draft-dflash": "COMMON_SPECULATIVE_TYPE_DRAFT_DFLASH",
    "draft-dspark": "COMMON_SPECULATIVE_TYPE_DRAFT_DSPARK",
    "ngram-simple": "COMMON_SPECULATIVE_TYPE_NGRAM_SIMPLE",
    "ngram-map-k": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K",
    "ngram-map-k4v": "COMMON_SPECULATIVE_TYPE_NGRAM_MAP_K4V",
    "ngram-mod": "COMMON_SPECULATIVE_TYPE_NGRAM_MOD",
    "ngram-cache": "COMMON_SPECULATIVE_TYPE_NGRAM_CACHE",
}
# n-gram types whose key/draft sizes live in a sub-struct of the same three fields
_NGRAM_SIZED = {"ngram-simple": "ngram_simple", "ngram-map-k": "ngram_map_k", "ngram-map-k4v": "ngram_map_k4v"}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m specstudy.backends.llamacpp.serve", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="target GGUF")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--threads", type=int, required=True, help="decode and batch threads (target and draft)")
    p.add_argument("--ctx-size", type=int, default=4096)
    p.add_argument("--parallel", type=int, default=1, help="server slots (concurrent requests)")
    p.add_argument("--spec-type", choices=sorted(SPEC_TYPE_ENUM), default=None)
    p.add_argument("--draft", default=None, help="draft GGUF (draft-simple)")
    p.add_argument("--draft-max", type=int, default=None, help="n_max: most tokens drafted per step (gamma)")
    p.add_argument("--draft-min", type=int, default=None, help="n_min")
    p.add_argument("--draft-p-min", type=float, default=None, help="p_min: stop drafting below this draft probability")
    p.add_argument("--ngram-size-n", type=int, default=None, help="n-gram key length (ngram-simple/map-k/map-k4v)")
    p.add_argument("--ngram-size-m", type=int, default=None, help="draft m-gram length (ngram-simple/map-k/map-k4v)")
    p.add_argument("--ngram-min-hits", type=int, default=None)
    p.add_argument("--ngram-mod-n-match", type=int, default=None)
    p.add_argument("--ngram-mod-n-min", type=int, default=None)
    p.add_argument("--ngram-mod-n-max", type=int, default=None)
    p.add_argument(
        "--synth-rates", default=None, help="benchmark only: unconditional acceptance rate per draft position"
    )
    p.add_argument("--synth-len", type=float, default=None, help="benchmark only: mean acceptance length (AL)")
    return p


def build_params(a: argparse.Namespace) -> Any:
    """``xllamacpp.CommonParams`` for the parsed flags (metrics and slots endpoints on)."""
    import xllamacpp as xl

    p = xl.CommonParams()
    p.model.path = a.model
    p.hostnames = [a.host]
    p.port = a.port
    p.n_ctx = a.ctx_size
    p.n_parallel = a.parallel
    for cpu in (p.cpuparams, p.cpuparams_batch, p.speculative.draft.cpuparams, p.speculative.draft.cpuparams_batch):
        cpu.n_threads = a.threads
    p.warmup = True  # llama.cpp's own warm-up decode at load: the study sends this server no warm-up requests
    p.endpoint_metrics = True
    p.endpoint_slots = True
    p.ui = False
    spec = p.speculative
    if a.spec_type:
        spec.types = [getattr(xl.common_speculative_type, SPEC_TYPE_ENUM[a.spec_type])]
    if a.draft:
        spec.draft.mparams.path = a.draft
    for name, value in (("n_max", a.draft_max), ("n_min", a.draft_min), ("p_min", a.draft_p_min)):
        if value is not None:
            setattr(spec.draft, name, value)
    sized = _NGRAM_SIZED.get(a.spec_type or "")
    if sized:
        sub = getattr(spec, sized)
        for name, value in (("size_n", a.ngram_size_n), ("size_m", a.ngram_size_m), ("min_hits", a.ngram_min_hits)):
            if value is not None:
                setattr(sub, name, value)
    for name, value in (("n_match", a.ngram_mod_n_match), ("n_min", a.ngram_mod_n_min), ("n_max", a.ngram_mod_n_max)):
        if value is not None:
            setattr(spec.ngram_mod, name, value)
    if a.synth_rates is not None:  # llama.cpp's --spec-synth-rates P0,P1,...
        spec.synth_rates = [float(x) for x in a.synth_rates.split(",")]
    if a.synth_len is not None:  # llama.cpp's --spec-synth-len L
        spec.synth_len = a.synth_len
    return p


def build_info() -> dict[str, Any]:
    """What this process runs: the xllamacpp wheel's version and revision, llama.cpp's BUILD_INFO."""
    from importlib import metadata

    import xllamacpp as xl

    try:
        from xllamacpp import _version

        rev = _version.get_versions().get("full-revisionid")
    except (ImportError, AttributeError):
        rev = None
    return {
        "xllamacpp": metadata.version("xllamacpp"),
        "xllamacpp_revision": rev,
        "llama_build_info": dict(getattr(xl, "BUILD_INFO", {}) or {}),
        "system_info": xl.get_system_info().strip(),
    }


def _watch_parent(stop: threading.Event, period_s: float = 0.5) -> None:
    """Stop when the process that started us is gone: a killed kit must not leave a server behind."""
    parent = os.getppid()
    while not stop.wait(period_s):
        if os.getppid() != parent:
            print("parent process exited: stopping", file=sys.stderr, flush=True)
            stop.set()


def main(argv: Sequence[str] | None = None) -> int:
    a = parser().parse_args(argv)
    if not os.path.isfile(a.model):
        print(f"--model {a.model}: no such file", file=sys.stderr)
        return 2
    import xllamacpp as xl

    stop = threading.Event()
    threading.Thread(target=_watch_parent, args=(stop,), daemon=True).start()
    server = xl.Server(build_params(a))  # returns once the model is loaded and the port listens
    # xllamacpp installed llama.cpp's own SIGTERM handler; take it back so the main thread stops cleanly
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    print(json.dumps({"ready": server.listening_address, **build_info()}), flush=True)
    stop.wait()
    del server  # stops llama.cpp's loop and joins its threads
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)  # skip interpreter teardown of the extension's threads


if __name__ == "__main__":
    sys.exit(main())
