"""`edge`: the models a user can get. `edge list` shows edge's catalogue and what of it is downloaded, `edge pull NAME`
downloads one (checked by sha256), `edge rm NAME` removes it; then `edge-chat NAME`, `edge-serve NAME` and
`edge-bench NAME` run it.

    edge list
    edge pull qwen2.5-coder-1.5b        # and its draft, qwen2.5-coder-0.5b (--no-draft: not)
    edge-chat qwen2.5-coder-1.5b
    edge rm qwen2.5-coder-1.5b
"""

from __future__ import annotations

import argparse
import sys

from edge.errors import EdgeError
from edge.sources.catalogue import CATALOGUE_VARIABLE, catalogue_path
from edge.sources.model_source import hub_cache_dir
from edge.sources.pull import human_size, pull, remove, rows


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="edge", description="Get models for edge-chat, edge-serve and edge-bench: list edge's catalogue of GGUF "
                                 "models, pull one, remove one. Files go to the Hugging Face cache ($HF_HUB_CACHE, "
                                 "else $HF_HOME/hub, else ~/.cache/huggingface/hub).",
        epilog=f"then run a pulled model by its name: edge-chat NAME. ${CATALOGUE_VARIABLE} names another catalogue "
               "file (the same JSON shape as edge/models/catalogue/catalogue.json).")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    listing = commands.add_parser("list", help="the catalogue: each model's size, license, draft, and where it is "
                                               "downloaded",
                                  description="List edge's catalogue: each model's name, size, license and draft, and "
                                              "its path where it is downloaded.")
    listing.add_argument("--pulled", action="store_true", help="only the models that are downloaded")
    fetch = commands.add_parser(
        "pull", help="download a catalogue model (and its draft), checked by sha256",
        description="Download a catalogue model into the Hugging Face cache with a progress bar, resuming a download "
                    "that was stopped, and check the file's sha256 (the catalogue's, else the one the Hub reports); "
                    "a file that differs is removed and refused. A model with a draft in the catalogue pulls it too.")
    fetch.add_argument("name", help="a name from `edge list`, or a Hub file: org/repo/file.gguf "
                                    "(org/repo@revision/file.gguf)")
    fetch.add_argument("--no-draft", action="store_true", help="do not pull the model's draft")
    fetch.add_argument("--quiet", action="store_true", help="no progress bar")
    delete = commands.add_parser("rm", help="remove a downloaded catalogue model from the cache",
                                 description="Remove a pulled model's file from the Hugging Face cache.")
    delete.add_argument("names", nargs="+", metavar="name", help="a name from `edge list`")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "list":
            return list_models(only_pulled=args.pulled)
        if args.command == "pull":
            pull(args.name, draft=not args.no_draft, progress=not args.quiet)
            print(f"run it: edge-chat {args.name}")
            return 0
        for name in args.names:
            path, freed = remove(name)
            print(f"removed {name}: {path} ({human_size(freed)} freed)")
        return 0
    except EdgeError as error:
        print(f"edge {args.command}: error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"edge {args.command}: stopped; `edge pull` again resumes the download", file=sys.stderr)
        return 130


def list_models(*, only_pulled: bool = False) -> int:
    shown = [row for row in rows() if row.path is not None or not only_pulled]
    table = [("NAME", "SIZE", "LICENSE", "DRAFT", "DOWNLOADED")]
    table += [(row.entry.name, human_size(row.size), row.entry.license or "?", row.entry.draft or "-",
               str(row.path) if row.path is not None else "no") for row in shown]
    widths = [max(len(line[column]) for line in table) for column in range(4)]
    for line in table:
        print("  ".join(cell.ljust(width) for cell, width in zip(line, widths)) + "  " + line[4])
    print(f"catalogue: {catalogue_path()}; cache: {hub_cache_dir()}; get one: edge pull NAME; run it: edge-chat NAME",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
