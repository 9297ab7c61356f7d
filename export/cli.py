"""edge-export command line. The exporter is planned (issue "Step 6 of 7") and not built yet."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="edge-export",
        description="Package a Hugging Face checkpoint into an edge bundle (quantized ONNX/TorchScript targets, "
        "trimmed-vocabulary drafter, manifest). Not yet available in this version.",
    )
    parser.add_argument("checkpoint", nargs="?", help="checkpoint folder to export")
    parser.add_argument("-o", "--output", help="bundle folder to write")
    parser.parse_args(argv)
    print("edge-export: not yet available in this version of edge; nothing was written. "
          "Run checkpoints directly with edge-chat/edge-bench meanwhile.", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
