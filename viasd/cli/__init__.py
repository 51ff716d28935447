"""`viasd` command line: one thin subcommand per stage. Library errors a user can cause
(`ViasdError`) are printed as one line, `viasd: error: ...`, with exit status 2."""

from __future__ import annotations

import argparse
import logging
import sys
import time

from ..errors import ViasdError
from .bench import add_bench
from .generate import add_generate
from .stages import (
    add_batch_table,
    add_decode,
    add_dimr_search,
    add_evaluate,
    add_prepare_data,
    add_report,
    add_resolve_params,
    add_tracking_init,
    add_train_drafter,
    add_train_model,
    add_train_router,
    add_tune_thresholds,
)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("viasd")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="viasd", description="VIA-SD: three-tier speculative decoding")
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_generate(sub)
    add_prepare_data(sub)
    add_train_model(sub)
    add_train_drafter(sub)
    add_decode(sub)
    add_dimr_search(sub)
    add_train_router(sub)
    add_tune_thresholds(sub)
    add_batch_table(sub)
    add_evaluate(sub)
    add_report(sub)
    add_bench(sub)
    add_resolve_params(sub)
    add_tracking_init(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    from .common import close_stage_run, open_stage_run, record_dvc_benchmarks
    from .threads import limit_threads

    limit_threads()
    open_stage_run(args)
    start = time.monotonic()
    try:
        status = args.func(args)
        if status == 0:
            record_dvc_benchmarks(args, time.monotonic() - start)
    except ViasdError as err:
        close_stage_run(args, err)
        print(f"viasd: error: {err}", file=sys.stderr)
        return 2
    except BaseException as err:
        close_stage_run(args, err)
        raise
    close_stage_run(args, None)
    return status
