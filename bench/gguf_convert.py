"""Run llama.cpp's own converter (convert_hf_to_gguf.py) on a checkpoint, in its own process.

    python -m bench.gguf_convert LLAMA_CPP_SOURCE CHECKPOINT OUTFILE OUTTYPE
    run_child("bench.gguf_convert:convert", {"source": ..., "checkpoint": ..., "outfile": ..., "outtype": ...}, ...)

LLAMA_CPP_SOURCE is a llama.cpp source tree (convert_hf_to_gguf.py with its conversion/ and gguf-py/ folders; the
llama-cpp-python sdist carries one in vendor/llama.cpp). One thing is changed around it: a byte-level BPE tokenizer
the converter does not recognise (edge's built-in model and the random benchmark checkpoints train their own) is
written with llama.cpp's "gpt-2" pre-tokenizer instead of stopping the conversion. That name only steers llama.cpp's
own text tokenization, which edge-bench never uses: it feeds both runtimes the same token ids. The weights go
through the converter untouched.
"""

from __future__ import annotations

import sys
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    source, checkpoint, outfile, outtype = (argv if argv is not None else sys.argv[1:])
    convert({"source": source, "checkpoint": checkpoint, "outfile": outfile, "outtype": outtype})
    return 0


def convert(request: dict) -> None:
    """The conversion (also the child's work for bench.process): "source", "checkpoint", "outfile", "outtype"."""
    root, checkpoint, outfile, outtype = (Path(request["source"]), request["checkpoint"], request["outfile"],
                                          request["outtype"])
    sys.path[:0] = [str(root), str(root / "gguf-py")]
    import convert_hf_to_gguf  # noqa: E402 - llama.cpp's converter, from the source tree above
    from conversion import base  # noqa: E402

    recognised = base.TextModel.get_vocab_base_pre

    def tolerant(self, tokenizer) -> str:
        try:
            return recognised(self, tokenizer)
        except NotImplementedError:
            return "gpt-2"

    base.TextModel.get_vocab_base_pre = tolerant
    sys.argv = ["convert_hf_to_gguf.py", str(checkpoint), "--outfile", str(outfile), "--outtype", outtype]
    convert_hf_to_gguf.main()


if __name__ == "__main__":
    raise SystemExit(main())
