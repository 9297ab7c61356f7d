"""edge-export: package a Hugging Face checkpoint into a validated edge bundle for the ONNX Runtime backend."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from pathlib import Path

DESCRIPTION = """\
Package a checkpoint into an edge bundle: the target as an ONNX graph with the KV cache as explicit inputs and
outputs (so edge's runtime owns the cache, rolls it back and verifies drafts in one pass), weights in the chosen
format, an optional drafter whose head keeps only the tokens the target produces (VocabTrim), and a manifest with
the sha256 of every file. The graphs are checked against eager edge before the bundle is moved into place; a failed
or interrupted export leaves nothing behind. Run the result with: edge-chat BUNDLE  (add --drafter bundle)."""

EPILOG = """\
examples:
  edge-export edge/models/default -o builtin.bundle --weights int4 --drafter builtin
  edge-export ./my-llama -o my-llama.bundle --weights int8
  edge-export ./my-llama -o my-llama.bundle --weights fp32 --drafter ./my-llama-draft --vocab-trim on"""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="edge-export", description=DESCRIPTION, epilog=EPILOG,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint", nargs="?",
                        help="Hugging Face checkpoint folder (config.json, *.safetensors, tokenizer.json), a .gguf "
                             "file or a Hub id (org/name; from the Hugging Face cache, else downloaded); default: "
                             "the default model (SmolLM2-135M-Instruct where installed, else the built-in model)")
    parser.add_argument("-o", "--output", required=True, type=Path,
                        help="bundle folder to create (must not exist, unless --overwrite)")
    parser.add_argument("--format", choices=["onnx", "torchscript", "both"], default="onnx",
                        help="target format: onnx (run by ONNX Runtime; quantized weights; default), torchscript "
                             "(a TorchScript module plus the same step as a torch.export program, .pt2, both "
                             "float32; TorchScript is deprecated in torch 2.13, prefer the .pt2 for new "
                             "embeddings), or both")
    parser.add_argument("--weights", choices=["fp32", "fp16", "int8", "int4"], default="int8",
                        help="ONNX weight format: int8/int4 = weight-only group quantization run by MatMulNBits "
                             "(smallest and fastest on a CPU; int4 keeps q/k/v, the MLP's down projection and the "
                             "head in 8 bits, as llama.cpp's Q4_K_M keeps its most sensitive matrices wider); fp16 = "
                             "half-precision storage; fp32 = as trained (default: int8)")
    parser.add_argument("--block-size", type=int, default=32,
                        help="int8/int4: weights per quantization group along the input dimension; smaller is "
                             "more accurate and larger (default: 32)")
    parser.add_argument("--accuracy-level", type=int, default=4, choices=[0, 1, 2, 3, 4],
                        help="int8/int4: MatMulNBits compute type. 4 (default) quantizes activations per row, "
                             "so a verify pass computes each token exactly as a one-token step and speculation is "
                             "token-identical; 0-3 compute in float and are not guaranteed identical")
    parser.add_argument("--drafter", metavar="SPEC",
                        help="also export a draft model: 'builtin' (the built-in drafter) or a checkpoint folder "
                             "with the same tokenizer; default: none (ngram drafting needs no export)")
    parser.add_argument("--vocab-trim", choices=["auto", "on", "off"], default="auto",
                        help="VocabTrim: rebuild the drafter's head with only the tokens the target generates on "
                             "calibration prompts. auto (default) trims when the head has more parameters than "
                             "the drafter's layers (large vocabularies), where it pays")
    parser.add_argument("--vocab-coverage", type=float, default=0.99,
                        help="VocabTrim: keep the most frequent generated tokens covering this share of them "
                             "(default: 0.99)")
    parser.add_argument("--calibration-text", type=Path, metavar="FILE",
                        help="UTF-8 text of your domain whose tokens also count towards the kept vocabulary")
    parser.add_argument("--calibration-tokens", type=int, default=96,
                        help="tokens the target generates per calibration prompt (default: 96)")
    parser.add_argument("--chat-template", type=Path, metavar="FILE",
                        help="a Jinja chat template (UTF-8) for the bundle, stored as its chat_template.jinja in "
                             "place of the checkpoint's own; gives a base model (no template: the bundle is a "
                             "completion model) a chat format")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing bundle at --output")
    parser.add_argument("--quiet", action="store_true", help="no progress bars")
    return parser


MAX_CALIBRATION_BYTES = 256 * 2**20  # text whose tokens are counted: far more than a calibration needs
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """SIGTERM or SIGHUP, raised where Ctrl+C raises KeyboardInterrupt: the export cleans up the same way."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    existed, manifest = args.output.exists(), None
    nothing_written = (f"edge-export: export interrupted; nothing was written to {args.output}"
                       + (" (the bundle already there is unchanged)" if existed else ""))
    try:
        # the first seconds import torch and onnx: Ctrl+C (or SIGTERM, SIGHUP) there ends the process at once
        # (nothing is written yet, and an import cut short fails in its own ways, a RecursionError inside numpy
        # among them)
        previous = _exit_on_interrupt(nothing_written)
        try:
            from edge.errors import EdgeError
            from edge.text.chat_template import read_template_file
            from edge.export.bundle import ExportOptions, export_bundle
            from edge.export.quantize import QuantSettings
        except ImportError as error:
            print(f"edge-export: error: {error.name or error} is not installed; install the exporter with "
                  "pip install 'edge[export]'", file=sys.stderr)
            return 2
        finally:
            _restore_interrupt(previous)
        _stop_on_termination()
        try:
            options = _options(args, ExportOptions, QuantSettings, read_template_file)
            checkpoint = _checkpoint(args.checkpoint)
            manifest = export_bundle(checkpoint, args.output, options, show_progress=not args.quiet)
        except (EdgeError, ValueError) as error:
            print(f"edge-export: error: {error}", file=sys.stderr)
            return 2
        _summary(args.output, manifest)
        if manifest.get("completion_model"):
            print(f"edge-export: note: {checkpoint} has no chat template, so {args.output} is a completion model "
                  "(it continues text rather than answering chats); to chat with it, export again with "
                  "--chat-template FILE", file=sys.stderr)
    except KeyboardInterrupt as stop:  # export_bundle has removed its temporary folder
        print(f"edge-export: interrupted after the bundle was written to {args.output}" if manifest is not None
              else nothing_written, file=sys.stderr)
        return 128 + (stop.signum if isinstance(stop, Stopped) else signal.SIGINT)
    return 0


def _exit_on_interrupt(message: str):
    """Until _restore_interrupt, Ctrl+C, SIGTERM and SIGHUP print `message` and exit at once (128 + the signal's
    number); returns the handlers they replaced (None off the main thread, where signals cannot be handled)."""
    def leave(signum, frame):
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
        os._exit(128 + signum)

    if threading.current_thread() is not threading.main_thread():
        return None
    return {number: signal.signal(number, leave) for number in STOP_SIGNALS}


def _restore_interrupt(previous) -> None:
    for number, handler in (previous or {}).items():
        signal.signal(number, handler)


def _stop_on_termination() -> None:
    """From here on SIGTERM and SIGHUP stop the export as Ctrl+C does (KeyboardInterrupt), so that it removes its
    work folder and says so, rather than dying with it half-written."""
    def stop(signum, frame):
        raise Stopped(signum)

    if threading.current_thread() is threading.main_thread():
        for number in STOP_SIGNALS:
            if number != signal.SIGINT:
                signal.signal(number, stop)


def _options(args, ExportOptions, QuantSettings, read_template_file):
    if args.calibration_tokens < 1:
        raise ValueError(f"--calibration-tokens must be at least 1, got {args.calibration_tokens}")
    text = None
    if args.calibration_text is not None:
        from edge.files import FileRefused, read_regular

        try:
            text = read_regular(args.calibration_text, MAX_CALIBRATION_BYTES).decode("utf-8")
        except FileRefused as error:
            raise ValueError(f"--calibration-text {args.calibration_text} is {error.reason}; pass a UTF-8 text "
                             "file") from None
        except (OSError, UnicodeDecodeError) as error:
            raise ValueError(f"cannot read --calibration-text {args.calibration_text}: {error}") from None
    quant = QuantSettings(args.weights, block_size=args.block_size, accuracy_level=args.accuracy_level)
    if not 0.0 < args.vocab_coverage <= 1.0:
        raise ValueError(f"--vocab-coverage must be in (0, 1], e.g. 0.99; got {args.vocab_coverage}")
    formats = ("onnx", "torchscript") if args.format == "both" else (args.format,)
    template = read_template_file(args.chat_template) if args.chat_template is not None else None
    return ExportOptions(formats=formats, quant=quant, drafter=args.drafter, vocab_trim=args.vocab_trim,
                         vocab_coverage=args.vocab_coverage, calibration_text=text,
                         calibration_tokens=args.calibration_tokens, overwrite=args.overwrite,
                         chat_template=template,
                         chat_template_origin=str(args.chat_template.resolve()) if template else None)


def _checkpoint(name: str | None) -> Path:
    """The checkpoint folder named (a .gguf file or a Hub id resolved to its folder), or the default model's."""
    from edge.sources.default_model import default_model_path
    from edge.sources.model_source import resolve_model

    return resolve_model(name or default_model_path())


def _summary(output: Path, manifest: dict) -> None:
    validation = manifest["validation"]
    sizes = sum(entry["bytes"] for entry in manifest["files"].values())
    lines = [f"wrote {output} ({sizes / 2**20:.1f} MiB)"]
    for backend in (name for name in ("onnx", "torchscript", "torch-export") if name in validation):
        report = validation[backend]
        spec = report["speculative_equals_plain"]
        lines.append(f"  {backend} ({report['weights']}): target logits vs eager relative error "
                     f"{report['target']['relative_error']:.2e}, top-1 agreement {report['target']['top1_agreement']:.1%}"
                     + (f"; drafter {report['drafter']['relative_error']:.2e}" if "drafter" in report else "")
                     + f"; greedy speculative ({spec['drafter']}) equals plain: {'yes' if spec['identical'] else 'NO'}")
    if "vocab_trim" in manifest:
        trim = manifest["vocab_trim"]
        lines.append(f"  drafter vocabulary: {trim['kept']} of {trim['vocab_size']} tokens "
                     f"({trim['covered_share']:.1%} of calibration tokens)")
    lines.append(f"run it: edge-chat {output}" + (" --drafter bundle" if manifest.get("drafter") else ""))
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
